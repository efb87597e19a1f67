"""Which file of a model folder is damaged: cheap checks that name it, against a file table or without one.

Terms
-----
whole        a file that reads: a ``*.safetensors`` file whose header parses and whose tensors end where the file
             ends (a copy cut short fails this), a ``*.json`` file that parses; any other file, present.
file table   ``{path in the folder: {"bytes": size, "sha256": digest}}``, the digest for files under
             ``HASHED_BYTES``: what a folder held when it was made (the embedded folder's marker keeps one:
             embedded.py). Checking a folder against it reads sizes, small files and safetensors headers only.
damage       one line naming the first file that is missing, of another size or digest, or not whole; None when
             there is none.
weights      ``*.safetensors`` or ``pytorch_model*.bin`` in the folder; an index (``*.index.json``) names its shards.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any, Iterable

__all__ = ["HASHED_BYTES", "TOKENIZER_FILES", "file_table", "folder_damage", "safetensors_metadata", "table_damage",
           "whole_damage"]

HASHED_BYTES = 16 << 20  # files smaller than this are hashed in a file table (module terms)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")  # any one serves
_MAX_HEADER = 100 << 20  # safetensors' own limit on a header's length


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The header of a safetensors file; ValueError naming what is wrong unless the file is whole (module terms)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"is {size} bytes, too short to hold a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, _MAX_HEADER):
            raise ValueError(f"is cut short: its header needs {length + 8} bytes, the file has {size}")
        try:
            header = json.loads(f.read(length))
            ends = [int(t["data_offsets"][1]) for name, t in header.items() if name != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise ValueError("has a header that does not parse") from None
    end = 8 + length + max(ends, default=0)
    if end != size:
        raise ValueError(f"is {'cut short' if end > size else 'longer than its header says'}: its tensors end at "
                         f"byte {end}, the file has {size}")
    return header


def safetensors_metadata(path: str | Path) -> dict[str, str]:
    """A whole safetensors file's ``__metadata__`` (ValueError as for a file that is not whole)."""
    meta = _safetensors_header(Path(path)).get("__metadata__") or {}
    return meta if isinstance(meta, dict) else {}


def _file_damage(folder: Path, name: str) -> str | None:
    """Damage (module terms) of one file, ``name`` in ``folder``, checked for being whole only."""
    path = folder / name
    if not path.is_file():
        return f"{name} is missing"
    try:
        if name.endswith(".safetensors"):
            _safetensors_header(path)
        elif name.endswith(".json"):
            json.loads(path.read_bytes())
    except ValueError as exc:
        return f"{name} {exc}" if name.endswith(".safetensors") else f"{name} does not parse as JSON"
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror or exc})"
    return None


def whole_damage(folder: str | Path, names: Iterable[str]) -> str | None:
    """The first of ``names`` in ``folder`` that is missing or not whole (module terms: damage)."""
    return next((d for name in names if (d := _file_damage(Path(folder), name)) is not None), None)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_table(folder: str | Path) -> dict[str, dict[str, Any]]:
    """The file table (module terms) of every file under ``folder`` but hidden ones, by its path there."""
    folder, table = Path(folder), {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue  # a temporary file
        size = path.stat().st_size
        table[path.relative_to(folder).as_posix()] = {"bytes": size} | (
            {"sha256": _digest(path)} if size < HASHED_BYTES else {})
    return table


def table_damage(folder: str | Path, table: Any) -> str | None:
    """The first file of ``table`` that ``folder`` does not hold as it was (module terms: damage); a table that is
    not one reads as damage of the table itself."""
    folder = Path(folder)
    if not isinstance(table, dict) or not all(isinstance(e, dict) and isinstance(e.get("bytes"), int)
                                              for e in table.values()):
        return "its file table does not parse"
    for name, entry in table.items():
        path = folder / name
        try:
            size = path.stat().st_size if path.is_file() else None
            if size is None:
                return f"{name} is missing"
            if size != entry["bytes"]:
                return f"{name} is {size} bytes, not {entry['bytes']} (cut short or replaced)"
            if "sha256" in entry and _digest(path) != entry["sha256"]:
                return f"{name} has changed since it was made"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
        if name.endswith(".safetensors") and (damage := _file_damage(folder, name)):
            return damage
    return None


def _shards(folder: Path) -> list[str]:
    """The weights files every index in ``folder`` names (module terms: weights)."""
    named: set[str] = set()
    for index in folder.glob("*.index.json"):
        try:
            named |= set(json.loads(index.read_bytes()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError, TypeError):
            pass  # the index itself is checked as a JSON file
    return sorted(named)


def folder_damage(folder: str | Path, kind: str) -> str | None:
    """Damage (module terms) of a Hugging Face folder that a ``kind`` (``"model"`` or ``"tokenizer"``) failed to
    load from: a file it needs that is missing, or a top-level JSON or safetensors file that is not whole. None for
    a folder with no config, weights or tokenizer file: not a model's folder."""
    folder = Path(folder)
    present = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    weights = any(n.endswith(".safetensors") or n.startswith("pytorch_model") for n in present)
    if "config.json" not in present and not weights and not any(n in TOKENIZER_FILES for n in present):
        return None  # not a model's folder at all, rather than a damaged one
    if "config.json" not in present and kind == "model":
        return "config.json is missing"
    if kind == "model" and not weights:
        return "no weights file (model.safetensors) is in it"
    if kind == "tokenizer" and not any(n in TOKENIZER_FILES for n in present):
        return f"no tokenizer file ({' or '.join(TOKENIZER_FILES[:3])}) is in it"
    checked = [n for n in present if n.endswith((".json", ".safetensors"))]
    return whole_damage(folder, [*checked, *(s for s in _shards(folder) if s not in checked)])
