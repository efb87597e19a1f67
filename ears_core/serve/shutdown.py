"""Leaving cleanly when asked to stop: SIGTERM closes the server, then the process exits with 0.

Terms:
  stop signal  SIGTERM, what ``docker stop`` and a Space restart send to the container's main process.
               That process is PID 1 in the container, and the kernel gives PID 1 no default action
               for it: without a handler the signal is ignored, ``docker stop`` waits its 10 s and
               then kills the process (SIGKILL, exit 137).
  close        the server's own way to stop (for the Gradio app, ``Blocks.close``): it ends the
               queue and the HTTP server and frees the port.
  exit         the atexit hooks run (temporary folders are removed, logs flushed), then the process
               ends with ``os._exit``: the interpreter's own finalisation is skipped, because with
               torch loaded it takes seconds (docs/measurements.md), and threads still serving a request would
               otherwise hold the exit back.
  grace        how long close and the atexit hooks may take; past it the process leaves at once.

No gradio import here: the caller passes its close function.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

GRACE_S = 1.5  # well under docker stop's 10 s


def exit_on_sigterm(close: Callable[[], object], *, grace_s: float = GRACE_S, code: int = 0) -> None:
    """On SIGTERM: call ``close()`` once, then exit with ``code``; leave at once after ``grace_s``.

    Call it from the main thread (Python runs signal handlers there and only there may install them),
    before the call that blocks, e.g. ``exit_on_sigterm(app.close)`` just before ``app.launch(...)``.
    A second SIGTERM while closing changes nothing: the grace timer is already running.
    """
    if grace_s <= 0:
        raise ValueError(f"grace_s must be positive, got {grace_s}")
    closing = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        if closing.is_set():
            return
        closing.set()
        log.info("SIGTERM: closing the server (exit within %.1f s)", grace_s)
        _leave_after(grace_s, code)
        try:
            close()
        except Exception:  # the exit matters more than a clean close
            log.exception("closing the server failed; exiting anyway")
        _exit(code)

    signal.signal(signal.SIGTERM, on_sigterm)


def _exit(code: int) -> None:
    """The atexit hooks, flushed standard streams, then the end of the process (no finalisation)."""
    atexit._run_exitfuncs()  # what a normal exit would run: weakref finalizers, logging.shutdown
    _flush_standard_streams()
    os._exit(code)


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing left to save
            pass


def _leave_after(seconds: float, code: int) -> threading.Timer:
    """A daemon timer that ends the process after ``seconds``, should close or an atexit hook hang."""
    def leave() -> None:
        log.warning("still running %.1f s after SIGTERM: exiting now", seconds)
        _flush_standard_streams()  # not logging.shutdown(): the stuck thread may hold a handler's lock
        os._exit(code)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()
    return timer
