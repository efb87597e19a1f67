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
stolen      on a virtual machine, the CPU time the hypervisor gave to other guests while this one's CPUs
            wanted to run (the steal column of ``/proc/stat``, all CPUs): a thread is "on a core" in its own
            schedstat meanwhile, so the run queue never sees it. ``RunQueue(steal=True)`` (the measurements,
            not a run's crowding watch) also reads busy where more than ``BUSY_SHARE`` of the CPU time wanted
            was stolen, over at least ``STEAL_MIN_TICKS`` of it (a shorter reading says nothing); the hypervisor
            takes 20-40 % in spells on some cloud machines (docs/benchmarks.md).
given up    a measurement watched with ``RunQueue(early=True)`` that reads busy partway (after at least ``EARLY_S``
            of thread time wanted, checked by ``check_early`` between its timed units) stops there with ``GaveUp``: on
            crowded cores a warm-up no longer spends a whole measurement learning that it cannot keep it.
crowded     ``cores_crowded(threads)``: a short parallel product on ``threads`` threads reads busy. With
            other jobs on the cores, torch's OpenMP threads wait for each other at every barrier: building
            and checking the lean target took 32 s on 2 threads beside two busy loops, 3.8 s on 1
            (docs/measurements.md, "Start-up"), so a load runs on one thread where the cores are crowded.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["StepClock", "RunQueue", "MachineBusy", "GaveUp", "BUSY_SHARE", "EARLY_S", "PROBE_S", "STEAL_MIN_TICKS",
           "check_early", "cores_crowded", "cpu_ticks", "stolen_share"]

BUSY_SHARE = 0.2  # of a measurement's thread time spent waiting for a core: busy (module terms)


EARLY_S = 0.5  # seconds of thread time a watched measurement wants before it may be given up (module terms)
EARLY_EVERY_S = 0.1  # the least wall time between two partway readings of one watch (each reads every thread's file)


class MachineBusy(RuntimeError):
    """A measurement was made while other work held the cores (module terms: busy)."""


class GaveUp(MachineBusy):
    """A watched measurement read busy partway and stopped (module terms: given up)."""


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


STEAL_MIN_TICKS = 50  # CPU time wanted, in clock ticks of all CPUs (0.5 s at 100 a second), below which steal is not read


def cpu_ticks() -> tuple[int, int] | None:
    """(stolen, wanted) clock ticks of all CPUs since boot: the steal column of ``/proc/stat``, and every column
    but idle and iowait (steal included; guest time is inside user); None where not reported (module terms)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return steal, user + nice + system + irq + softirq + steal


def stolen_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """Of the CPU time wanted between two ``cpu_ticks`` readings, the share the hypervisor took (module terms:
    stolen); None where either is missing or less than ``STEAL_MIN_TICKS`` was wanted."""
    if start is None or end is None or end[1] - start[1] < STEAL_MIN_TICKS:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


class RunQueue:
    """``with RunQueue() as rq: ...`` then ``rq.waited_share``: of the time this process's threads wanted a
    core during the block, the share they waited for one; ``rq.busy``: above ``BUSY_SHARE`` (module terms).
    ``steal``: ``rq.stolen_share`` is read too, and busy above ``BUSY_SHARE`` as well (module terms: stolen).
    ``early``: the block is this thread's watch, which ``check_early`` reads partway (module terms: given up)."""

    def __init__(self, steal: bool = False, early: bool = False) -> None:
        self.steal, self.early = steal, early

    def __enter__(self) -> "RunQueue":
        return self.begin()

    def __exit__(self, *exc: Any) -> None:
        self.end()

    def begin(self) -> "RunQueue":
        """Start a reading (what ``with`` does on entry); -> self."""
        self.waited_share = self.stolen_share = 0.0
        self._start = _schedstat()
        self._ticks = cpu_ticks() if self.steal else None
        self._peeked = time.perf_counter()
        if self.early:
            _watches().append(self)
        return self

    def _read(self) -> tuple[float, float, int]:
        """(waited share, stolen share, ns of thread time wanted) from ``begin`` to now."""
        run = wait = 0
        for tid, (r, w) in _schedstat().items():  # threads that ended meanwhile drop out
            r0, w0 = self._start.get(tid, (0, 0))
            run, wait = run + r - r0, wait + w - w0
        stolen = (stolen_share(self._ticks, cpu_ticks()) or 0.0) if self.steal else 0.0
        return (wait / (run + wait) if run + wait > 0 else 0.0), stolen, run + wait

    def end(self) -> bool:
        """End the reading (what ``with`` does on exit): sets ``waited_share`` (and ``stolen_share``); -> ``busy``."""
        if self.early and self in _watches():
            _watches().remove(self)
        self.waited_share, self.stolen_share, _ = self._read()
        return self.busy

    def busy_so_far(self) -> bool:
        """Busy from ``begin`` to now, once at least ``EARLY_S`` of thread time was wanted (module terms: given up)."""
        waited, stolen, wanted = self._read()
        return wanted >= EARLY_S * 1e9 and (waited > BUSY_SHARE or stolen > BUSY_SHARE)

    @property
    def busy(self) -> bool:
        return self.waited_share > BUSY_SHARE or self.stolen_share > BUSY_SHARE


_LOCAL = threading.local()


def _watches() -> list[RunQueue]:
    """This thread's open ``RunQueue(early=True)`` blocks, innermost last."""
    if not hasattr(_LOCAL, "watches"):
        _LOCAL.watches = []
    return _LOCAL.watches


def check_early() -> None:
    """Between the timed units of a measurement: raise ``GaveUp`` when this thread's innermost early watch reads
    busy so far (module terms: given up); nothing outside such a watch, or within ``EARLY_EVERY_S`` of its last look."""
    watches = _watches()
    if not watches:
        return
    watch = watches[-1]
    now = time.perf_counter()
    if now - watch._peeked < EARLY_EVERY_S:
        return
    watch._peeked = now
    if watch.busy_so_far():
        raise GaveUp("the cores read busy partway through a measurement")


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
