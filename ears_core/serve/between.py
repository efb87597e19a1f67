"""Work that must never slow a request (a price measurement), run between requests in the background.

Terms
-----
quiet     no decode in this process has run for ``quiet_s`` seconds (``ActivityLog.quiet_for``).
piece     one short unit of the work under ``BetweenRequests.piece()`` (one forward pass of a price
          measurement): it raises ``Busy`` once a decode has begun (or the runner was closed), and a decode
          that begins while a piece runs waits for that piece only (serve/runs.py).
attempt   one try at the whole job, in a thread that exits when it ends, so its OpenMP pool goes with it
          (threads.py). An attempt a request put aside is thrown away, never half used, and the job
          is tried again at a later quiet: ``quiet_s`` times the attempts so far (at most ``MAX_BACKOFF``
          times), so a busy server is not interrupted every few seconds.
asked     ``request()`` asks for the job; a request that comes while an attempt runs asks for one more
          run after it (the attempt may have started before whatever made the caller ask).
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from ears_core.threads import join_at_exit
from ears_core.serve.runs import ActivityLog, Busy
from ears_core.timing import MachineBusy

__all__ = ["BetweenRequests", "QUIET_S"]

LOG = logging.getLogger("ears_studio")

QUIET_S = 1.0  # seconds with no decode before background work starts
MAX_BACKOFF = 8  # the quiet an attempt waits for grows with the attempts put aside, up to this many times QUIET_S
POLL_S = 0.05  # how often a waiting attempt looks for quiet


class BetweenRequests:
    """Run ``job(piece)`` between requests (module terms); ``on_done(result)`` gets a finished
    attempt's result. ``job`` runs its work in ``with piece(): ...`` units and lets ``Busy`` through."""

    def __init__(self, activity: ActivityLog, job: Callable[[Callable[[], Any]], Any],
                 on_done: Callable[[Any], None], quiet_s: float | None = None, name: str = "ears-between-requests"
                 ) -> None:
        self.activity, self.job, self.on_done, self.name = activity, job, on_done, name
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._asked = self._served = 0  # requests made; requests the latest finished attempt covers
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self.attempts = 0  # attempts started, put-aside ones included
        self.error: BaseException | None = None  # the latest attempt's failure (logged), if any

    @property
    def pending(self) -> bool:
        """Whether the job was asked for and has not run to the end since."""
        return not self._idle.is_set()

    def request(self) -> None:
        """Ask for the job: it runs at the next quiet (once, however often it is asked for meanwhile)."""
        with self._lock:
            if self._closed:
                return
            self._asked += 1
            self._idle.clear()
            if self._thread is None:
                self._start(1)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is pending (True) or ``timeout`` seconds pass (False)."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        """No more attempts; one running stops at its next piece and its result is dropped."""
        with self._lock:
            self._closed = True
        self._idle.set()

    @contextmanager
    def piece(self) -> Iterator[None]:
        if self._closed:
            raise Busy("the background work was closed")
        with self.activity.piece():
            yield

    def _start(self, tries: int) -> None:  # under self._lock
        self._thread = join_at_exit(threading.Thread(target=self._attempt, args=(tries, torch.get_num_threads()),
                                                     name=self.name, daemon=True), self.close)
        self._thread.start()

    def _attempt(self, tries: int, threads: int) -> None:
        torch.set_num_threads(threads)  # a new thread starts from torch's default count
        while not self._closed and not self.activity.quiet_for(self.quiet_s * min(tries, MAX_BACKOFF)):
            time.sleep(POLL_S)
        with self._lock:
            asked = self._asked
        done = False  # the job ran to its end (or failed: not retried until asked again)
        if not self._closed:
            self.attempts += 1
            begun = self.activity.begun
            try:
                result = self.job(self.piece)
                done = self.activity.begun == begun  # a decode that began and ended between two pieces: put aside
            except (Busy, MachineBusy):  # a decode began, or the cores were busy (timing.py): at a later quiet
                pass
            except Exception as exc:  # noqa: BLE001 - logged and kept; the next request() tries again
                self.error, done, result = exc, True, None
                LOG.warning("background work between requests failed", exc_info=True)
            else:
                if done and not self._closed:
                    self.on_done(result)
        with self._lock:
            if done:
                self._served = max(self._served, asked)
            if self._closed or self._served >= self._asked:
                self._thread = None
                self._idle.set()
            else:  # put aside, or asked for again while it ran: another attempt, in a thread of its own
                self._start(1 if done else tries + 1)
