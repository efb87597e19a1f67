"""Step timing for the decode loops, without a host synchronisation per token.

Terms
-----
mark        a point in time: ``time.perf_counter()`` on CPU; on CUDA a
            ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream, so taking
            it costs no synchronisation (the GPU stamps it when it gets there).
ms(a, b)    milliseconds between two marks. On CUDA it reads the events' elapsed time, which
            is only valid once both have completed: it waits for b when b is still queued (a
            captured pass returns before its kernels have run), so call it after the round's
            existing host sync (the verdict's ``.tolist()``), where b has almost always completed.
busy        a measurement's threads spent more than ``BUSY_SHARE`` of their time waiting for a core
            (Linux's per-thread run-queue wait, ``/proc/self/task/*/schedstat``): another job held the
            cores, so what was timed is not this machine's price. ``RunQueue`` reads it around a
            measurement; where the kernel does not report it, nothing is ever called busy.
crowded     ``cores_crowded(threads)``: a short parallel product on ``threads`` threads reads busy. With
            other jobs on the cores, torch's OpenMP threads wait for each other at every barrier: building
            and checking the lean target took 32 s on 2 threads beside two busy loops, 3.8 s on 1
            (docs/measurements.md, "Start-up"), so a load runs on one thread where the cores are crowded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["StepClock", "RunQueue", "MachineBusy", "BUSY_SHARE", "PROBE_S", "cores_crowded"]

BUSY_SHARE = 0.2  # of a measurement's thread time spent waiting for a core: busy (module terms)


class MachineBusy(RuntimeError):
    """A measurement was made while other work held the cores (module terms: busy)."""


def _schedstat() -> dict[str, tuple[int, int]]:
    """Per thread of this process: (ns on a core, ns waiting for one); empty where not reported."""
    found = {}
    for f in Path("/proc/self/task").glob("*/schedstat"):
        try:
            a, b, _ = f.read_text().split()
        except (OSError, ValueError):
            continue
        found[f.parent.name] = (int(a), int(b))
    return found


class RunQueue:
    """``with RunQueue() as rq: ...`` then ``rq.waited_share``: of the time this process's threads wanted a
    core during the block, the share they waited for one; ``rq.busy``: above ``BUSY_SHARE`` (module terms)."""

    def __enter__(self) -> "RunQueue":
        return self.begin()

    def __exit__(self, *exc: Any) -> None:
        self.end()

    def begin(self) -> "RunQueue":
        """Start a reading (what ``with`` does on entry); -> self."""
        self.waited_share = 0.0
        self._start = _schedstat()
        return self

    def end(self) -> bool:
        """End the reading (what ``with`` does on exit): sets ``waited_share``; -> ``busy``."""
        run = wait = 0
        for tid, (r, w) in _schedstat().items():  # threads that ended meanwhile drop out
            r0, w0 = self._start.get(tid, (0, 0))
            run, wait = run + r - r0, wait + w - w0
        self.waited_share = wait / (run + wait) if run + wait > 0 else 0.0
        return self.busy

    @property
    def busy(self) -> bool:
        return self.waited_share > BUSY_SHARE


PROBE_S = 0.02  # seconds of ``cores_crowded``'s parallel product: read busy 20 of 20 times beside one busy loop


def cores_crowded(threads: int) -> bool:
    """Whether ``threads`` torch threads would wait for cores now (module terms: crowded); False for one thread."""
    if threads < 2:
        return False
    before = torch.get_num_threads()
    a = torch.randn(256, 256)  # (256, 256): a product small enough to repeat, large enough to run in parallel
    torch.set_num_threads(threads)
    try:
        with RunQueue() as queue:
            stop = time.perf_counter() + PROBE_S
            while time.perf_counter() < stop:
                a @ a
    finally:
        torch.set_num_threads(before)
    return queue.busy


class StepClock:
    """Wall time on CPU (and any non-CUDA device); CUDA events on a GPU."""

    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        """Milliseconds from mark a to mark b (on CUDA: after a sync that covers b)."""
        if not self.cuda:
            return (b - a) * 1000.0
        if not b.query():
            b.synchronize()
        return float(a.elapsed_time(b))
