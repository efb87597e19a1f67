"""Decodes in flight: who runs now (contention), and decoding apart from rendering.

Terms
-----
contended   a run that overlapped another decode in this process, or that other work crowded (crowding.py): what
            shares the cores times the run, so it is labelled, its baseline never cached and its prices never learnt.
quiet       no decode has run in this process for some seconds (``ActivityLog.quiet_for``): when work
            that must not slow a request (a price measurement) may run.
piece       one short unit of such background work (one forward pass), run under ``ActivityLog.piece()``:
            it raises ``Busy`` once a decode has begun, and a decode that begins while a piece runs waits
            for that piece only, never for the rest of the work (``Tracked`` records the wait in the
            Generation's ``waits``).
Tracked     a Generation whose decoding is registered with the ``ActivityLog`` while it runs, on one torch thread
            where the cores are crowded (crowding.py); ``on_end(gen, timed)`` (optional) is called when it stops
            (the session learns there; ``timed``: its timings are this machine's, neither crowded nor contended).
Background  a Tracked run decoded in a thread of its own, to completion, a deadline or ``stop()``;
            a UI reads ``events`` at its own frame rate and never slows the decode loop.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from ears_core.decode.generation import Generation
from ears_core.serve.crowding import CrowdWatch
from ears_core.threads import join_at_exit

__all__ = ["ActivityLog", "ACTIVITY", "Busy", "Tracked", "Background", "PIECE_WAIT"]

PIECE_WAIT = "a background price measurement finishing its current pass"  # a Generation.waits label


class Busy(RuntimeError):
    """Background work put aside: a decode has begun (``ActivityLog.piece``)."""


class ActivityLog:
    """Which decodes run now in this process; a decode that overlaps another is contended. Background
    work runs in pieces between decodes (module terms)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: list[dict[str, Any]] = []
        self._last_end = float("-inf")  # perf_counter() when the latest decode ended
        self._begun = 0  # decodes begun in this process so far
        self._piece = threading.Lock()  # held while a piece of background work runs

    def begin(self) -> dict[str, Any]:
        """Register a decode; it waits for a piece of background work in hand (``waited_s``)."""
        with self._lock:
            mark: dict[str, Any] = {"contended": bool(self._active)}
            for other in self._active:
                other["contended"] = True
            self._active.append(mark)
            self._begun += 1
        t0 = time.perf_counter()
        with self._piece:  # the piece now running, if any, ends; the next one sees this decode and stops
            mark["waited_s"] = time.perf_counter() - t0
        return mark

    def end(self, mark: dict[str, Any]) -> None:
        with self._lock:
            if mark in self._active:
                self._active.remove(mark)
            self._last_end = time.perf_counter()

    @property
    def begun(self) -> int:
        """Decodes begun in this process so far (background work compares it before and after)."""
        with self._lock:
            return self._begun

    def quiet_for(self, seconds: float) -> bool:
        """No decode runs now, and none ended in the last ``seconds``."""
        with self._lock:
            return not self._active and time.perf_counter() - self._last_end >= seconds

    @contextmanager
    def piece(self) -> Iterator[None]:
        """One piece of background work; raises ``Busy`` (before running it) once a decode has begun."""
        with self._piece:
            if self.active:
                raise Busy("a decode began: background work is put aside until the next quiet")
            yield

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._active)


ACTIVITY = ActivityLog()  # one per process: every Session's decodes share the cores


class Tracked:
    """A Generation whose decoding is registered with the activity log while it runs (module terms);
    ``contended``: it overlapped another decode here, ``crowded``: other work crowded the cores (it then ran on
    one thread). Either way its speed is no clean figure."""

    def __init__(self, gen: Generation, activity: ActivityLog,
                 on_end: Callable[[Generation, bool], Any] | None = None, device: torch.device | str = "cpu") -> None:
        self.gen, self._activity, self._mark, self._on_end = gen, activity, None, on_end
        self._device = device
        self.contended = self.crowded = False

    def __iter__(self) -> Iterator[Any]:
        self._mark = self._activity.begin()
        if self._mark["waited_s"] > 1e-3 and hasattr(self.gen, "waits"):  # a piece was running
            self.gen.waits[PIECE_WAIT] = self._mark["waited_s"]
        watch = CrowdWatch(self._device)
        try:
            watch.start()
            for ev in self.gen:
                watch.tick()
                yield ev
        finally:
            watch.stop()
            self._activity.end(self._mark)
            self.crowded = watch.crowded
            self.contended = self._mark["contended"] or self.crowded
            if self._on_end is not None:
                self._on_end(self.gen, not self.contended)

    def __getattr__(self, name: str) -> Any:  # events, steps, samples, decode_s, stats(), result()
        return getattr(self.gen, name)


class Background:
    """Decode a Generation in a thread of its own; read ``events`` while it runs.

    ``wait(timeout)`` returns True once decoding ended (finished, deadline, ``stop()`` or an
    error, re-raised by ``result()``). The decode clock is the Generation's own."""

    def __init__(self, tracked: Tracked) -> None:
        self.tracked = tracked
        self.gen = tracked.gen
        self._stop = threading.Event()
        self._done = threading.Event()
        self.error: BaseException | None = None
        self._thread = join_at_exit(threading.Thread(target=self._work, daemon=True), self.stop)
        self._thread.start()

    def _work(self) -> None:
        try:
            with torch.inference_mode():
                for _ in self.tracked:
                    if self._stop.is_set():
                        break
        except BaseException as exc:  # shown by result(); never kills the server
            self.error = exc
        finally:
            self._done.set()

    @property
    def events(self) -> list[Any]:
        return self.gen.events

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def contended(self) -> bool:
        return self.tracked.contended

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def result(self) -> Any:
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.gen.result()
