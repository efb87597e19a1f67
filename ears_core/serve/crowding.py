"""A decode's torch thread count when other work crowds the cores.

Terms
-----
crowded     another job holds the cores while a run decodes on several torch threads (``timing.cores_crowded``
            before it, ``timing.RunQueue`` reading busy during it). Every OpenMP parallel region then waits for a
            descheduled thread: the embedded target decoded 5.1 tok/s on 2 threads beside one busy process on a
            2-vCPU Xeon, 26.6 on 1 thread (33.5 on 2 threads, 26.4 on 1 when quiet).
watch       ``CrowdWatch``: per run, a probe (``timing.PROBE_S``) before its first pass and a run-queue reading every
            ``CHECK_S`` of wall time while it decodes; once crowded, the run decodes on one thread to its end, and
            the thread count it found is put back when it stops. Off on a GPU and where torch runs one thread.
"""

from __future__ import annotations

import time

import torch

from ears_core.timing import RunQueue, cores_crowded

__all__ = ["CrowdWatch", "CHECK_S"]

CHECK_S = 0.5  # wall seconds between run-queue readings during a run (a reading costs well under a millisecond)


class CrowdWatch:
    """One run's watch (module terms): ``start()`` before its first pass, ``tick()`` after each event,
    ``stop()`` when it ends; ``crowded``: the run fell back to one thread."""

    def __init__(self, device: torch.device | str) -> None:
        self.threads = torch.get_num_threads()
        self.active = torch.device(device).type == "cpu" and self.threads > 1
        self.crowded = False
        self._queue: RunQueue | None = None
        self._next = 0.0

    def start(self) -> None:
        if not self.active:
            return
        if cores_crowded(self.threads):
            self._fall_back()
        else:
            self._read_from(time.perf_counter())

    def tick(self) -> None:
        if self._queue is None:  # inactive or already on one thread
            return
        now = time.perf_counter()
        if now < self._next:
            return
        if self._queue.end():
            self._fall_back()
        else:
            self._read_from(now)

    def stop(self) -> None:
        if self.crowded:
            torch.set_num_threads(self.threads)
        self._queue = None

    def _read_from(self, now: float) -> None:
        self._queue = RunQueue().begin()
        self._next = now + CHECK_S

    def _fall_back(self) -> None:
        torch.set_num_threads(1)
        self.crowded, self._queue = True, None
