"""The cost model that picks each round's draft length, or plain autoregressive steps when drafting does not pay.

Terms
-----
prices        measured on this machine, once per model pair: seconds of one autoregressive round (one
              target step and a draw) and of one speculative round of each candidate length (for the draft
              sampler: K draft steps + one target pass over K + 1 positions + the verification),
              smoothed by a least-squares line in the length (robust to a load spike on a shared machine)
a_j           acceptance at position j of a round: drafts kept at j / rounds that evaluated j (positions up
              to and including the first rejection), decayed so that it follows the sequence
events/round  draft sampler: E(K) = 1 + sum_{i<=K} prod_{j<=i} a_j (the replacement or bonus is the 1);
              self-proposal: E(l) = sum_{i<=l} prod_{j<=i} a_j (a rejected position is retried next round)
choice        the length with the most events per second E / price; if that is below 1 / price(ar), the round
              is an autoregressive step, and after ``PROBE_EVERY`` (run.py) such steps one speculative round of
              length min(best, 4) runs anyway so the acceptance estimate stays current
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

__all__ = ["Prices", "AcceptanceTracker", "expected_events", "choose", "measure_prices", "fit_line"]


@dataclass
class Prices:
    ar: float  # seconds per autoregressive round
    rounds: dict[int, float] = field(default_factory=dict)  # length -> seconds per speculative round


class AcceptanceTracker:
    """Decayed per-position counts of drafts kept and evaluated (positions 1..max_len).

    rate_j = (kept_j + w * pooled) / (seen_j + w), pooled = (sum kept + w * prior) / (sum seen + w): a position
    the rounds rarely reach (deeper than the lengths chosen so far) reads the acceptance seen at the others,
    not the prior; without it the choice would never try a longer round than it has tried."""

    def __init__(self, max_len: int, prior: float = 0.6, weight: float = 4.0, decay: float = 0.97):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.kept = [0.0] * max_len
        self.seen = [0.0] * max_len

    def update(self, length: int, num_accepted: list[int]) -> None:
        d = self.decay
        self.kept = [k * d for k in self.kept]
        self.seen = [s * d for s in self.seen]
        for a in num_accepted:
            for j in range(min(a + 1, length)):
                self.seen[j] += 1.0
                self.kept[j] += 1.0 if j < a else 0.0

    def rates(self) -> list[float]:
        w = self.weight
        pooled = (sum(self.kept) + w * self.prior) / (sum(self.seen) + w)
        return [(k + w * pooled) / (s + w) for k, s in zip(self.kept, self.seen)]


def expected_events(mode: str, rates: list[float], length: int) -> float:
    total, run = (1.0 if mode == "draft" else 0.0), 1.0
    for j in range(length):
        run *= rates[min(j, len(rates) - 1)]
        total += run
    return total


def choose(prices: Prices, rates: list[float], mode: str) -> tuple[int, bool, dict[int, float]]:
    """(best length, whether it beats autoregressive steps, predicted speedup per length)."""
    speed = {L: expected_events(mode, rates, L) / s * prices.ar for L, s in prices.rounds.items()}
    best = max(speed, key=speed.get)
    return best, speed[best] > 1.0, speed


def measure_prices(factory, lengths, reps: int = 7) -> Prices:
    """Time rounds of a scratch batch-1 sampler made by ``factory(capacity)``, interleaved, fastest of ``reps``."""
    cap = 8 + 2 * (reps + 2) * (1 + sum(L + 1 for L in lengths))
    s = factory(cap)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(2):  # warm-up
            s.ar_round()
            for L in lengths:
                s.round(L)
        ar, rounds = [], {L: [] for L in lengths}
        for _ in range(reps):
            t0 = time.perf_counter()
            s.ar_round()
            ar.append(time.perf_counter() - t0)
            for L in lengths:
                t0 = time.perf_counter()
                s.round(L)
                rounds[L].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    # the fastest of the repeats: on a shared machine interference only ever adds time
    return Prices(min(ar), fit_line({L: min(v) for L, v in rounds.items()}))


def fit_line(costs: dict[int, float]) -> dict[int, float]:
    """Least-squares a + b L through the measured round prices (b >= 0): a load spike during one length's
    measurement then moves every price a little instead of one a lot."""
    Ls, ys = list(costs), list(costs.values())
    if len(Ls) < 2:
        return dict(costs)
    mL, my = sum(Ls) / len(Ls), sum(ys) / len(ys)
    var = sum((L - mL) ** 2 for L in Ls)
    b = max(0.0, sum((L - mL) * (y - my) for L, y in zip(Ls, ys)) / var)
    a = my - b * mL
    return {L: max(a + b * L, 1e-9) for L in Ls}
