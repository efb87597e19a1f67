"""This machine's price profile for a target: measured, checked for a busy machine, cached on disk.

Terms
-----
profile      a ``PriceCurve`` (policy/costs.py) of the target's passes over m = 1 .. max_m new tokens
             (model/measuring/pass_times.py), measured once per (model, device, dtype, threads, kernels) and cached
             as JSON under ``$EARS_CACHE/costs/``; a file that does not read back is measured again
             (model/measuring/records.py).
busy         a measurement during which this process's threads waited for a core more than
             ``timing.BUSY_SHARE`` of the time (timing.py: another job held the cores), or the hypervisor took
             that share of the CPU time wanted (timing.py: stolen); a try that reads busy partway stops there
             (timing.py: given up). It is measured again, ``BUSY_TRIES`` times at most; still busy, it is never cached: in the background (a
             ``piece`` given) it raises ``MachineBusy``, so the work is put aside and tried at a later
             quiet; in a caller's thread it serves this process only.
provisional  ``quick=True`` with nothing cached: one pass per width and no warm-up round (pass_times.py; 1.3 s
             on the lean target on the slowest machine measured, 2.6 with the round), flagged provisional and not
             cached; a session measures the profile between requests (serve/prices.py) and installs it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ears_core.model.measuring.measured import cache_file
from ears_core.model.measuring.pass_times import measure_pass_ms
from ears_core.model.measuring.records import read_record, write_record
from ears_core.policy.costs import PriceCurve
from ears_core.timing import GaveUp, MachineBusy, RunQueue

__all__ = ["BUSY_TRIES", "REFRESH_SLOWER", "load_or_measure", "measure_prices", "profile_key"]

BUSY_TRIES = 3  # measurements of a profile at most while the machine reads busy (module terms: busy)


def profile_key(model: torch.nn.Module, extra: str = "") -> str:
    p = next(model.parameters())
    cfg = model.config.get_text_config()
    name = Path(str(getattr(model.config, "_name_or_path", "") or type(model).__name__)).name
    shape = f"{getattr(cfg, 'num_hidden_layers', '?')}x{getattr(cfg, 'hidden_size', '?')}x{getattr(cfg, 'vocab_size', '?')}"
    kernels = getattr(model, "ears_kernels", "")  # "packed" when packed_linear chose oneDNN kernels
    if p.device.type == "cpu":  # the machine, and the class and mode its kernels run at (model/kernels/cpu_forms.py)
        from ears_core.model.kernels.cpu_forms import machine, tag
        kernels += f"|{machine()}|{tag()}"
    return (f"{name}|{shape}|{p.device}|{str(p.dtype).removeprefix('torch.')}|threads={torch.get_num_threads()}"
            f"{'|' + kernels.lstrip('|') if kernels else ''}{extra}")


def measure_prices(target: torch.nn.Module, drafter_ms: float | None = None, *, max_m: int = 9, cache_len: int = 64,
                   repeats: int = 5, vocab: int | None = None, key: str = "", piece: Callable[[], Any] | None = None,
                   warm: bool = True) -> PriceCurve:
    """A price curve whose V(1) .. V(max_m) are ``target``'s fastest passes over m new tokens
    (model/measuring/pass_times.py; ``piece``: each pass runs in ``piece()``, for a measurement made in the
    background). ``drafter_ms``: a measured draft step (else 5 % of a step until the rounds measure it)."""
    verify = measure_pass_ms(target, max_m=max_m, cache_len=cache_len, repeats=repeats, vocab=vocab, piece=piece,
                             warm=warm)
    return PriceCurve(verify, drafter_ms if drafter_ms is not None else 0.05 * verify[0], 0.0, key,
                      time.strftime("%Y-%m-%d %H:%M:%S"))


def measured_quietly(target: torch.nn.Module, *, max_m: int, key: str, piece: Callable[[], Any] | None = None,
                     repeats: int = 5) -> tuple[PriceCurve, bool]:
    """``measure_prices``, again while the machine reads busy (module terms): (the last curve, still busy)."""
    curve = None
    for _ in range(BUSY_TRIES):
        with RunQueue(steal=True, early=True) as queue:
            try:
                curve = measure_prices(target, max_m=max_m, key=key, piece=piece, repeats=repeats)
            except GaveUp:  # read busy partway (timing.py: given up)
                continue
        if not queue.busy:
            return curve, False
    return curve, True


def _quick_curve(target: torch.nn.Module, max_m: int, key: str, piece: Callable[[], Any] | None = None) -> PriceCurve:
    """One pass per width and no warm-up round, flagged provisional and never cached (module terms: provisional)."""
    curve = measure_prices(target, max_m=max_m, key=key, piece=piece, repeats=1, warm=False)
    curve.provisional = True
    return curve


REFRESH_SLOWER = 1.15  # a refreshed step up to 15 % slower than the cached one still replaces it


def _cache_file(key: str, cache_dir: str | os.PathLike | None) -> Path:
    # v2: raw curves (v1: forced non-decreasing); v3: planned head; v4: kernels in the key
    return cache_file("costs", f"{key}.v4.json", cache_dir)


def load_or_measure(target: torch.nn.Module, *, max_m: int = 9, cache_dir: str | os.PathLike | None = None,
                    refresh: bool = False, key_extra: str = "", piece: Callable[[], Any] | None = None,
                    quick: bool = False, strict: bool = False) -> PriceCurve:
    """The cached profile for this (model, device, dtype, threads), or a new measurement (a few
    seconds) written to the cache. ``refresh`` measures again and returns the new curve; it replaces
    the cached one when its step is at most ``REFRESH_SLOWER`` times the cached step (the machine
    drifts by that much in a day, and the curve's shape with it: docs/measurements.md). A
    refresh that reads slower than that is measured once more and the faster of the two kept, per m
    (the machine jitters for seconds at a time); if that still reads much slower it serves this
    process only: another job on the cores only ever adds time, and a profile measured under it
    (e.g. a refresh asked for while a training job ran) would mislead every later process here.
    ``piece``: as ``measure_prices``'s (a measurement it stops writes nothing). A busy machine and
    ``quick``: module terms; ``strict``: a busy machine raises MachineBusy even in a caller's thread."""
    key = profile_key(target, key_extra)
    path = _cache_file(key, cache_dir)
    cached = read_record(PriceCurve, path)  # None for a damaged or old file: measured again
    if cached is not None and cached.max_m < max_m:
        cached = None  # too short a curve: measured again and replaced
    if cached is not None and not refresh:
        return cached
    if quick and cached is None:  # module terms: provisional
        return _quick_curve(target, max_m, key, piece)
    curve, busy = measured_quietly(target, max_m=max_m, key=key, piece=piece)
    if busy:
        if piece is not None or strict:
            raise MachineBusy(f"the cores were busy through {BUSY_TRIES} price measurements: tried again later")
        if curve is None:  # every try given up partway: one pass per width (module terms: provisional)
            return _quick_curve(target, max_m, key)
        curve.provisional = True  # for this process only, moved fast by the runs' rounds (costs.py)
        return curve
    if cached is not None and curve.step_ms > REFRESH_SLOWER * cached.step_ms:  # a refresh that reads much slower
        again = measure_prices(target, max_m=max_m, key=key, piece=piece)  # a passing slow moment? the faster of two, per m
        curve = PriceCurve([min(a, b) for a, b in zip(curve.verify_ms, again.verify_ms)],
                           min(curve.draft_ms, again.draft_ms), 0.0, key, again.measured_at)
    if cached is not None and curve.step_ms > REFRESH_SLOWER * cached.step_ms:
        return curve  # for this process only
    write_record(curve.to_dict(), path)
    return curve
