"""Decodes in flight: who runs now (contention), and decoding apart from rendering.

Terms
-----
contended   a run that overlapped another decode in this process: two decodes on the same cores
            time each other, so such a run is labelled and its baseline is never cached.
Tracked     a Generation whose decoding is registered with the ``ActivityLog`` while it runs;
            ``on_end(gen)`` (optional) is called when it stops (the session learns prices there).
Background  a Tracked run decoded in a thread of its own, to completion, a deadline or ``stop()``;
            a UI reads ``events`` at its own frame rate and never slows the decode loop.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import torch

from ears_core.decode.generation import Generation

__all__ = ["ActivityLog", "ACTIVITY", "Tracked", "Background"]


class ActivityLog:
    """Which decodes run now in this process; a decode that overlaps another is contended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: list[dict[str, bool]] = []

    def begin(self) -> dict[str, bool]:
        with self._lock:
            mark = {"contended": bool(self._active)}
            for other in self._active:
                other["contended"] = True
            self._active.append(mark)
            return mark

    def end(self, mark: dict[str, bool]) -> None:
        with self._lock:
            if mark in self._active:
                self._active.remove(mark)

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._active)


ACTIVITY = ActivityLog()  # one per process: every Session's decodes share the cores


class Tracked:
    """A Generation whose decoding is registered with the activity log while it runs."""

    def __init__(self, gen: Generation, activity: ActivityLog, on_end: Callable[[Generation], Any] | None = None) -> None:
        self.gen, self._activity, self._mark, self._on_end = gen, activity, None, on_end
        self.contended = False

    def __iter__(self) -> Iterator[Any]:
        self._mark = self._activity.begin()
        try:
            for ev in self.gen:
                yield ev
        finally:
            self._activity.end(self._mark)
            self.contended = self._mark["contended"]
            if self._on_end is not None:
                self._on_end(self.gen)

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
        self._thread = threading.Thread(target=self._work, daemon=True)
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
