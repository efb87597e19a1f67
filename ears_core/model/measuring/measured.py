"""A measured choice: a kernel decision timed on this machine, cached, and read back by the next load.

Terms
-----
record       a dataclass under ``Measured`` (the int4 row plan, the output head's layouts, packed linears, the
             draft head's variant) with ``key`` (the shapes and the ``machine_tag``) and ``measured_at``; cached as
             ``$EARS_CACHE/kernels/<KIND>-<key>.json`` (records.py); a missing, damaged or stale one reads as None.
interleaved  every round times every candidate, reversed every other round: a slow moment hits them all.
margin       ``keep_first(ms, margin)``: the cheapest, but the first (the default) unless one is ``margin`` cheaper.
quiet        ``quietly(what, fn)``: fn() under a watched run queue; busy cores raise ``MachineBusy`` (never cached),
             partway when they read busy before the end (timing.py: given up; ``interleaved`` looks between its units).
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence, TypeVar

import torch

from ears_core.model.measuring.records import read_record, write_record
from ears_core.timing import GaveUp, MachineBusy, RunQueue, check_early

__all__ = ["MEASURED_M", "Measured", "cache_file", "interleaved", "keep_first", "machine_tag", "quietly"]

MEASURED_M = (1, 3, 5)
T = TypeVar("T")
R = TypeVar("R", bound="Measured")


def machine_tag(dtype: torch.dtype) -> str:
    """What a kernel measurement depends on besides the shapes: dtype, threads, the machine and the class and mode
    its kernels run at (kernels/cpu_forms.py), torch."""
    from ears_core.model.kernels.cpu_forms import machine, tag

    return (f"{str(dtype).removeprefix('torch.')}|threads={torch.get_num_threads()}|{machine()}|{tag()}"
            f"|torch={torch.__version__}")


@dataclass(kw_only=True)
class Measured:
    """What every measured record holds (module terms: record); ``KIND`` names its cache files."""

    key: str = ""
    measured_at: str = ""
    KIND: ClassVar[str] = ""

    @classmethod
    def file(cls, key: str, cache_dir: str | os.PathLike | None) -> Path:
        """$EARS_CACHE/kernels/<KIND>-<key>.json (module terms: record)."""
        return cache_file("kernels", f"{cls.KIND}-{key}.json", cache_dir)

    @classmethod
    def cached(cls: type[R], key: str, cache_dir: str | os.PathLike | None, refresh: bool = False,
               usable: Callable[[R], bool] = lambda record: True) -> R | None:
        """The record cached under ``key``; None when ``refresh``, missing, damaged (records.py: read back) or not
        ``usable`` here (stale, or a kernel form this machine does not offer)."""
        record = None if refresh else read_record(cls, cls.file(key, cache_dir))
        return record if record is not None and usable(record) else None

    def save(self: R, cache_dir: str | os.PathLike | None) -> R:
        """Stamp ``measured_at`` and write the record under its key (records.py: written); the record."""
        self.measured_at = time.strftime("%Y-%m-%d %H:%M:%S")
        write_record(asdict(self), self.file(self.key, cache_dir))
        return self


def cache_file(folder: str, name: str, cache_dir: str | os.PathLike | None) -> Path:
    """<``records.cache_root``>/<folder>/<name>, with "_" for any character of ``name`` a file name should not hold."""
    from ears_core.model.measuring.records import cache_root

    return cache_root(cache_dir) / folder / "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def interleaved(candidates: Sequence[T], time_one: Callable[[T], Any], rounds: int,
                piece: Callable[[], Any] | None = None) -> dict[T, list[Any]]:
    """candidate -> its ``rounds`` samples ``time_one(candidate)`` (module terms), each round inside ``piece()``."""
    samples: dict[T, list[Any]] = {c: [] for c in candidates}
    for r in range(rounds):
        with (piece or nullcontext)():
            for c in (candidates if r % 2 == 0 else candidates[::-1]):
                check_early()  # a watched measurement on busy cores stops here (timing.py: given up)
                samples[c].append(time_one(c))
    return samples


def keep_first(ms: dict[T, float], margin: float) -> T:
    """The cheapest key of ``ms``, but its first key unless beaten by at least ``margin`` (module terms)."""
    first = next(iter(ms))
    best = min(ms, key=lambda c: ms[c])
    return first if ms[best] > (1 - margin) * ms[first] else best


def quietly(what: str, measure: Callable[[], T], check: bool = True) -> T:
    """measure() while the run queue is watched; ``MachineBusy`` naming ``what`` if the cores were busy
    (module terms: quiet; ``check`` False: a scripted timer, nothing to watch)."""
    busy = f"the cores were busy while measuring {what}: tried again later"
    with RunQueue(steal=True, early=check) as queue:
        try:
            out = measure()
        except GaveUp as stop:
            raise MachineBusy(busy) from stop
    if check and queue.busy:
        raise MachineBusy(busy)
    return out
