"""Cached records read back with suspicion and written whole: a file in the cache never stops a start.

Terms
-----
record     a dataclass cached as one JSON object (measured.py's kernel choices, policy/profile.py's price curves).
fits       every field of the object is one the dataclass has, of its annotated type, numbers finite
           (``list[float]``, ``dict[str, float]``, ... checked through), and the dataclass accepts it.
read back  ``read_record``: the record, or None for a file that is missing, cannot be read, does not parse or does
           not fit, so its caller measures again (and the new record replaces the file).
written    ``write_record``: to a temporary sibling renamed into place, so a reader never sees half a file; a cache
           that cannot be written keeps the record for this process only, with a log line saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["cache_root", "fits", "read_record", "write_record"]

LOG = logging.getLogger("ears_studio")
R = TypeVar("R")


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding prepared models and cached records: cache_dir, else $EARS_CACHE, else ~/.cache/ears_studio."""
    return Path(cache_dir or os.environ.get("EARS_CACHE") or "~/.cache/ears_studio").expanduser()


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` (from JSON) is of the type ``hint`` (module terms: fits)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    if origin in (typing.Union, types.UnionType):  # such as ``str | None``
        return any(value is None if a is type(None) else _fits(value, a) for a in args)
    return True  # a type this module does not know: the dataclass decides


def fits(cls: type[R], data: Any) -> R | None:
    """``cls(**data)`` when ``data`` fits it (module terms), else None."""
    if not isinstance(data, dict):
        return None
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation only a type checker resolves: the dataclass decides
        hints = {}
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    if not set(data) <= names or not all(_fits(v, hints.get(k, Any)) for k, v in data.items()):
        return None
    try:
        return cls(**data)
    except (ValueError, TypeError):  # a field missing, or a value the dataclass refuses
        return None


def read_record(cls: type[R], path: Path) -> R | None:
    """The record of type ``cls`` cached at ``path``, or None (module terms: read back)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        LOG.info("ignored the cached %s (%s): measured again", path, exc)
        return None
    record = fits(cls, data)
    if record is None:
        LOG.info("ignored the cached %s (not a %s): measured again", path, cls.__name__)
    return record


def write_record(data: dict[str, Any], path: Path) -> bool:
    """``data`` as JSON at ``path`` (module terms: written); whether it was."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
        return True
    except OSError as exc:
        LOG.warning("could not write %s (%s): this measurement serves this process only", path, exc.strerror or exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
