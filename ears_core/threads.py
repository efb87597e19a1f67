"""Torch work that should leave no OpenMP thread pool behind in the calling thread.

Terms
-----
pool        the first parallel region a thread runs gives it a pool of OpenMP workers until it exits; while a
            process holds more OpenMP threads than cores, every region waits for a wake-up (docs/measurements.md).
passing     ``in_passing_thread(fn)`` runs fn in a new thread, with the caller's torch thread count, that ends
            (and its pool with it) when fn returns; in the caller itself where it is pooled.
pooled      a thread that decoded on 2+ threads (``note_pool``, at a Generation's first token) holds a pool: work run
            beside it in a passing thread would make two pools, and a price measured there reads a step ~1.6x too
            long (docs/measurements.md), so ``in_passing_thread`` runs fn in such a caller, adding no pool.
at exit     a daemon thread inside a torch kernel when the interpreter finalises kills the process (exit code 134):
            ``join_at_exit(thread, stop)`` has ``stop()`` called and the thread joined at exit (``EXIT_JOIN_S``).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Any, Callable, TypeVar

import torch

__all__ = ["EXIT_JOIN_S", "in_passing_thread", "join_at_exit", "note_pool", "pooled_elsewhere"]

T = TypeVar("T")
EXIT_JOIN_S = 30.0  # how long the exit waits for registered threads, all together
_LIVE: "weakref.WeakKeyDictionary[threading.Thread, Callable[[], Any] | None]" = weakref.WeakKeyDictionary()
_LIVE_LOCK = threading.Lock()
_POOLED: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()  # module terms: pooled


def note_pool() -> None:
    """Mark the calling thread as pooled (module terms) where it runs torch's parallel regions, decoding on two
    threads or more (on one, torch runs no parallel region and OpenMP keeps no pool)."""
    if torch.get_num_threads() > 1:
        _POOLED.add(threading.current_thread())


def pooled_elsewhere() -> bool:
    """Whether a live thread other than the caller is pooled (module terms): torch work here runs beside its pool."""
    here = threading.current_thread()
    return any(t is not here and t.is_alive() for t in list(_POOLED))


def join_at_exit(thread: threading.Thread, stop: Callable[[], Any] | None = None) -> threading.Thread:
    """Register a daemon thread running torch work to be stopped and joined at exit (module terms); the thread."""
    with _LIVE_LOCK:
        _LIVE[thread] = stop
    return thread


@atexit.register
def _join_live_threads(timeout: float | None = None) -> int:
    """Stop every registered thread still alive, then join them within ``timeout`` (default
    ``EXIT_JOIN_S``) seconds in all; returns how many were still alive when it began."""
    with _LIVE_LOCK:
        live = [(t, stop) for t, stop in _LIVE.items() if t.is_alive() and t is not threading.current_thread()]
    for _, stop in live:
        if stop is not None:
            stop()
    deadline = time.monotonic() + (EXIT_JOIN_S if timeout is None else timeout)
    for thread, _ in live:
        thread.join(max(0.0, deadline - time.monotonic()))
    return len(live)


def in_passing_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) in a passing thread, or here in a pooled caller (module terms); its result, or its
    exception re-raised here."""
    if threading.current_thread() in _POOLED:
        return fn(*args, **kwargs)
    threads = torch.get_num_threads()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            torch.set_num_threads(threads)
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    worker = join_at_exit(threading.Thread(target=work, name="ears-passing", daemon=True))
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
