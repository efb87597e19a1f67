"""A session's price curve: read or measured once, kept current from the runs, never measured inside a request.

Terms
-----
curve       this machine's price curve for the target (policy/costs.py), as ``RunningPrices``: a profile
            measured once per model, device, dtype and threads (cached on disk), moved by every finished
            run's rounds.
busy        a warm-up on cores another job holds never fails: each measurement it spoils keeps the default in
            force and is listed in ``provisional`` (``strict=True`` raises ``timing.MachineBusy`` instead).
first use   with no curve yet, ``curve`` reads the cached profile or measures one, in a thread that exits: the
            one measurement ever made in a caller's thread (``warm_up`` makes it before any request).
            ``on_path(since)``: how long such a measurement held a request that began at ``since``.
provisional with ``background`` and nothing cached, that first measurement is a quick one (a pass per width,
            policy/profile.py), used until the background measures the profile; the pair's own provisional
            choices (its row plan, its head's kernels) are settled first, in the same pieces.
stale       a run's plain steps 30 % (``STALE``) off the profile's: the rounds' step is folded into the
            curve at once (``RunningPrices.fold_in_step``), so the next request is priced right with no
            measurement.
background  ``background=True`` (a server's sessions): the curve is also measured again between
            requests (serve/between.py: in a thread of its own, pass by pass, put aside the moment a
            request begins, tried again at the next quiet), after a warm-up (which then only reads the
            cached profile) and whenever the rounds find it stale. Without it (the CLI, the bench,
            scripts) a warm-up measures at once, before any request, and a stale curve is only folded in.
beside a pool  while a thread that decoded is alive (threads.py: pooled; a caller decoding in a long-lived
            thread), a background measurement would run beside its OpenMP pool and read the step ~1.6x too
            long (docs/measurements.md): it measures nothing then, and the curve stays as the rounds move it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Sequence

import torch

from ears_core.events import StepRecord
from ears_core.threads import in_passing_thread, pooled_elsewhere
from ears_core.policy.costs import PriceCurve, RunningPrices
from ears_core.policy.profile import load_or_measure
from ears_core.serve.between import BetweenRequests
from ears_core.serve.runs import ActivityLog
from ears_core.timing import MachineBusy

LOG = logging.getLogger("ears_studio")

__all__ = ["SessionPrices", "STALE", "ON_PATH"]

STALE = 1.3  # a plain step 30 % off the profile's: the rounds' step is folded in (and measured again in the background)
ON_PATH = "price curve measured on this request's path"  # a Generation.waits label (a session's first use)
MIN_ROUNDS = 8  # a run shorter than this never finds the curve stale


class SessionPrices:
    """One session's price curve (module terms). ``pair``: the session's pair (its ``target`` is
    measured); ``max_m``: the widest verify pass priced; ``prices``: a curve the caller gives (a
    warm-up keeps it)."""

    def __init__(self, pair: Any, activity: ActivityLog, *, max_m: int, prices: PriceCurve | None = None,
                 cache_dir: str | os.PathLike | None = None, background: bool = False) -> None:
        self.pair, self.max_m, self.cache_dir = pair, max_m, cache_dir
        self.running = RunningPrices(prices) if prices is not None else None
        self._measured_step: float | None = prices.step_ms if prices is not None else None
        self.given = prices is not None
        self._on_path: list[tuple[float, float]] = []  # (start, end) of measurements made in a caller's thread
        self._lock = threading.Lock()
        self.between = BetweenRequests(activity, self.measure, self.install, name="ears-prices") if background else None

    @property
    def curve(self) -> PriceCurve:
        """The curve in force; read or measured here on first use only (module terms)."""
        with self._lock:
            if self.running is None:
                # in a thread that exits: a measurement asked for from a long-lived thread (an app's
                # request worker) would leave it an OpenMP pool that throttles every later decode
                t0 = time.perf_counter()
                self._set(in_passing_thread(load_or_measure, self.pair.target, max_m=self.max_m, cache_dir=self.cache_dir,
                                            quick=self.between is not None))  # module terms: provisional
                self._on_path.append((t0, time.perf_counter()))
            assert self.running is not None
            return self.running.curve

    def on_path(self, since: float) -> float:
        """Seconds that first-use measurements held a caller since ``since`` (``time.perf_counter()``)."""
        with self._lock:
            return sum(max(0.0, end - max(start, since)) for start, end in self._on_path)

    def measure(self, piece: Any = None, strict: bool = False) -> PriceCurve | None:
        """This machine's curve measured afresh (``piece``: pass by pass, for the background), after the pair's
        provisional choices are settled (they change the passes' prices: pair.py, ``ModelPair.settle``). In a
        caller's thread (no ``piece``) a choice the busy cores spoil keeps its default and stays provisional,
        unless ``strict`` (then ``timing.MachineBusy`` reaches the caller); in the background it is put aside,
        and beside a pool nothing is measured (None; module terms)."""
        on_cpu = torch.device(getattr(self.pair, "device", "cpu")).type == "cpu"  # OpenMP times the CPU's passes only
        if piece is not None and on_cpu and torch.get_num_threads() > 1 and pooled_elsewhere():
            LOG.info("price measurement skipped: a thread that decoded is alive, and its OpenMP pool would slow it")
            return None
        settle = getattr(self.pair, "settle", None)
        if settle is not None:
            try:
                settle(piece)
            except MachineBusy:
                if strict or piece is not None:
                    raise
        return load_or_measure(self.pair.target, max_m=self.max_m, cache_dir=self.cache_dir, refresh=True, piece=piece,
                               strict=strict)

    @property
    def provisional(self) -> list[str]:
        """What the session prices and runs by default until measured here (module terms: provisional)."""
        curve = self.running.curve if self.running is not None else None
        return list(getattr(self.pair, "provisional", [])) + (["the price curve"] if curve and curve.provisional else [])

    def install(self, curve: PriceCurve | None) -> None:
        if curve is None:  # measured nothing (module terms: beside a pool)
            return
        with self._lock:
            self._set(curve)

    def _set(self, curve: PriceCurve) -> None:
        self.running, self._measured_step = RunningPrices(curve), curve.step_ms

    def observe(self, steps: Sequence[StepRecord], tree: bool = False) -> None:
        """A finished run's rounds (a tree's: its verify passes only) into the running curve; a stale
        curve is folded in at once and, in the background, measured again."""
        stale = False
        with self._lock:
            if self.running is None:
                return
            for st in steps:
                self.running.observe(st.drafted, -1.0 if tree else st.draft_ms, st.target_ms,
                                     -1.0 if tree else st.overhead_ms)
            step, measured = self.running.curve.step_ms, self._measured_step
            if measured and len(steps) >= MIN_ROUNDS and not 1 / STALE < step / measured < STALE:
                self.running.fold_in_step()  # e.g. the profile was measured while another job held the cores
                self._measured_step, stale = self.running.profile[0], True
        if stale and self.between is not None:
            self.between.request()  # between requests, never inside one

    def refresh(self) -> None:
        """Measure again: between requests (``background``), else now, in a passing thread (call it only
        where no request waits, e.g. before a bench's runs)."""
        if self.between is not None:
            self.between.request()
        else:
            self.install(in_passing_thread(self.measure))

    def before_warm_up(self, strict: bool = False) -> None:
        """A warm-up's curve: measured now without the background, else the cached profile (module terms);
        ``strict``: as ``measure``'s."""
        if not self.given and self.between is None:
            self.install(self.measure(strict=strict))
        self.curve  # noqa: B018

    def after_warm_up(self) -> None:
        if not self.given and self.between is not None:
            self.between.request()

    @property
    def pending(self) -> bool:
        """Whether a background measurement was asked for and has not finished."""
        return self.between is not None and self.between.pending

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no background measurement is pending (True) or ``timeout`` seconds pass."""
        return self.between is None or self.between.wait(timeout)

    def close(self) -> None:
        """No more background measurements (the session is dropped)."""
        if self.between is not None:
            self.between.close()
