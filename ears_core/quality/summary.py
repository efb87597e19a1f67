"""What a sweep measured, per setting: accuracy with a bootstrap interval, speed, acceptance, distortion.

Terms
-----
accuracy     right answers / scored runs. A question's score is its mean over the seeds; the
             accuracy is the mean of the questions' scores (every question weighs the same).
interval     95 % percentile bootstrap over questions: the questions are resampled with
             replacement (``RESAMPLES`` times, a fixed seed) and the accuracy recomputed; the 2.5th
             and 97.5th percentiles. It speaks for the question set, not for the seeds' noise alone.
delta        accuracy minus target-only's (``delta``) and minus the ordinary rule's (``delta_ordinary``),
             each with a paired bootstrap interval (the same resampled questions for both), on the
             questions both have runs for: the sharper test of a change. Speculative settings share
             their draws (the same seed, the same uniforms: sampling.py), so they part only where their
             rules decide differently; the pairing with the ordinary rule is the closest there is.
speedup      pooled tokens/s (total tokens / total decode seconds) over target-only's on the same
             questions and seeds in the same sweep.
acceptance   drafts that stood / drafts made; pardon rate: drafts that only the tolerance let stand /
             drafts made; distortion: total exact TV distance / tokens (per token; 0 for a lossless
             rule; FLy's is its per-position approximation).
scored       runs cut by a deadline are left out of every figure.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from ears_core.quality.runs import Record, Setting

__all__ = ["bootstrap", "pool", "by_category", "first_outside", "inside", "RESAMPLES", "PAPER"]

RESAMPLES = 2000
# The EARS paper's headline (seed 000): at T = 0.9, +18 % speed for -0.84 points of GSM8K accuracy,
# EARS against its ordinary speculative sampling; drawn relative to this sweep's ordinary rule.
PAPER = dict(speedup=1.18, accuracy_delta=-0.0084, label="EARS paper: +18 % speed, -0.84 % GSM8K accuracy at T = 0.9 "
             "(relative to its ordinary rule)")


def bootstrap(scores: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean of ``scores`` (n,) under resampling; (nan, nan) if empty."""
    if scores.size == 0:
        return (float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, scores.size, size=(resamples, scores.size))  # (R, n)
    means = scores[idx].mean(axis=1)  # (R,)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return (float(lo), float(hi))


def _scores(records: Sequence[Record]) -> dict[str, float]:
    """question id -> mean correctness over its scored runs."""
    per: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        if not r.timed_out:
            per[r.question].append(r.correct)
    return {q: sum(v) / len(v) for q, v in per.items()}


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or x != x else round(float(x), nd)


def _speed(records: Sequence[Record]) -> float | None:
    toks, secs = sum(r.new_tokens for r in records), sum(r.decode_s for r in records)
    return toks / secs if secs > 0 else None


def _paired(scores: dict[str, float], anchor: dict[str, float], key: str) -> dict[str, Any]:
    """{key: mean difference, key_ci: its paired interval} over the questions both hold ({} if none)."""
    shared = sorted(set(scores) & set(anchor))
    if not shared:
        return {}
    diff = np.array([scores[q] - anchor[q] for q in shared])
    return {key: _r(diff.mean()), f"{key}_ci": [_r(x) for x in bootstrap(diff)]}


def _row(setting: Setting, records: list[Record], anchors: dict[str, list[Record]], base_tps: float | None
         ) -> dict[str, Any]:
    scores = _scores(records)
    vals = np.array(list(scores.values()), dtype=float)
    row: dict[str, Any] = dict(setting=setting.label, method=setting.method, knob=setting.knob, value=setting.value,
                               params=dict(setting.params), runs=len(records), questions=len(scores),
                               accuracy=_r(vals.mean()) if vals.size else None,
                               accuracy_ci=[_r(x) for x in bootstrap(vals)])
    if setting.method != "target":
        row.update(_paired(scores, _scores(anchors["target-only"]), "delta"))
    if setting.method not in ("target", "standard"):
        row.update(_paired(scores, _scores(anchors["ordinary"]), "delta_ordinary"))
    tps = _speed(records)
    row.update(tokens=sum(r.new_tokens for r in records), tokens_per_s=_r(tps, 2),
               speedup=_r(tps / base_tps, 3) if tps and base_tps else None)
    drafted = sum(r.drafted for r in records)
    if drafted:
        row.update(acceptance=_r(sum(r.accepted for r in records) / drafted),
                   pardon_rate=_r(sum(r.pardoned for r in records) / drafted))
    if setting.method != "target":
        row["distortion"] = _r(sum(r.total_distortion for r in records) / max(1, row["tokens"]), 5)
    return row


def pool(settings: Sequence[Setting], records: Sequence[Record]) -> list[dict[str, Any]]:
    """One row per setting, in the given order (module terms); target-only's row first if present."""
    by: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by[r.setting].append(r)
    anchors = {a: by.get(a, []) for a in ("target-only", "ordinary")}
    base_tps = _speed([r for r in anchors["target-only"] if not r.timed_out])
    return [_row(s, [r for r in by[s.label] if not r.timed_out], anchors, base_tps) for s in settings if by.get(s.label)]


def by_category(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """category -> {questions, runs, right, accuracy} over the given records (scored runs only)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.timed_out:
            continue
        c = out.setdefault(r.category, dict(questions=set(), runs=0, right=0))
        c["questions"].add(r.question)
        c["runs"] += 1
        c["right"] += int(r.correct)
    return {k: dict(questions=len(v["questions"]), runs=v["runs"], right=v["right"],
                    accuracy=round(v["right"] / v["runs"], 4)) for k, v in out.items()}


def first_outside(rows: Sequence[dict[str, Any]], method: str = "ears", anchor: str = "ordinary") -> float | None:
    """The smallest knob value of ``method`` whose accuracy lies outside the ``anchor`` row's
    interval (None if every one lies inside, or there is no anchor)."""
    ref = next((r for r in rows if r["setting"] == anchor), None)
    if ref is None or None in ref["accuracy_ci"]:
        return None
    lo, hi = ref["accuracy_ci"]
    pts = sorted((r for r in rows if r["method"] == method and r["value"] is not None), key=lambda r: r["value"])
    return next((r["value"] for r in pts if not lo <= r["accuracy"] <= hi), None)


def inside(rows: Sequence[dict[str, Any]], setting: str = "ordinary", anchor: str = "target-only") -> bool | None:
    """Whether ``setting``'s accuracy lies inside ``anchor``'s interval (the lossless check for the
    ordinary rule against target-only); None if either row is missing."""
    a = next((r for r in rows if r["setting"] == setting), None)
    b = next((r for r in rows if r["setting"] == anchor), None)
    if a is None or b is None or a["accuracy"] is None or None in b["accuracy_ci"]:
        return None
    return bool(b["accuracy_ci"][0] <= a["accuracy"] <= b["accuracy_ci"][1])
