"""Torch work that should leave no OpenMP thread pool behind in the calling thread.

Terms
-----
pool        torch's CPU kernels run on OpenMP (libgomp in the CPU wheel). The first parallel region a
            thread runs gives that thread a pool of worker threads, kept until the thread exits.
throttled   while a process holds more OpenMP threads than it has cores (two pools on 2 cores:
            2 masters and 2 workers), libgomp's idle workers stop spinning almost at once and sleep,
            so every later parallel region waits for a wake-up. Decoding in other threads after loading
            in the main one was measured well below decoding in one thread, and a load in a thread that
            exits gave the one-thread speed back (docs/measurements.md, scripts/measure_threads.py).
passing     ``in_passing_thread(fn)`` runs fn in a new thread that ends when fn returns, so its pool
            goes with it: ``load_pair`` and ``Session.warm_up`` run their timing passes that way, and
            a caller may decode in its own thread or in ``runs.Background`` threads at full speed.
            The caller's torch thread count is carried over (a new thread would start from the default).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

import torch

__all__ = ["in_passing_thread"]

T = TypeVar("T")


def in_passing_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) in a thread that exits when it returns (module terms); its result, or its
    exception re-raised here."""
    threads = torch.get_num_threads()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            torch.set_num_threads(threads)
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    worker = threading.Thread(target=work, name="ears-passing", daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
