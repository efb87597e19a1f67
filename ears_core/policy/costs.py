"""This machine's prices, and the policy that picks each round's draft length from them.

Terms
-----
verify price V(m)  milliseconds of one target forward over m new tokens on a realistic cache
                   (m = 1 is one plain decode step). ``PriceCurve.steps(m)`` = V(m) / V(1): on
                   a GPU about 1 for small m; on a few CPU cores it grows with m, by an amount that
                   depends on the machine (docs/measurements.md). This is why a fixed K tuned on one
                   machine is wrong on another.
draft price d      milliseconds of one draft step (one drafted token).
overhead o         milliseconds of a round's work outside the two model passes (the drafter's
                   commit, probabilities, verify(), events).
round time T(k)    k d + V(k + 1) + o for a round that sends k drafts for verification.
acceptance a_i     the estimated probability that draft i stands given drafts 1..i-1 stood.
E(k)               1 + sum_{i<=k} prod_{j<=i} a_j: expected tokens a round emits with k drafts.
value(k)           E(k) / T(k): expected tokens per millisecond. k = 0 is a plain target step.
profile            a PriceCurve measured once per (model, device, dtype, threads) in a few seconds
                   and cached as JSON under $EARS_CACHE/costs/ (policy/profile.py); ``RunningPrices``
                   keeps it current from the rounds' own timings (exponential moving averages).
provisional        a curve from one quick pass per width, used until the profile is measured (a cold
                   start): the rounds' timings replace it quickly (``RunningPrices``: weight 1, not 5).
fold in            ``RunningPrices.fold_in_step()``: when the rounds' plain steps disagree with the
                   profile's (the machine got slower or faster), the profile's part of every V(m) is
                   rescaled by their ratio, so the curve's scale is right at once, with no measurement;
                   its shape is the profile's until the rounds (or a new measurement) say otherwise.
calibration        ``Calibration`` maps a drafter's confidence at position i (its own probability
                   mass on its top token, known BEFORE the token is drawn) to a_i: a Beta-smoothed
                   table per confidence bin, learnt online from the rounds (per rule and
                   temperature: one Calibration per generation settings).

Why the policy is lossless: the decision to verify position i uses only what is known before x_i
is drawn (the prefix, the drafter's confidence at i, the prices). The output at position i is
then P_target whether or not the position is verified (``DraftPolicy.keep_going`` is a stopping
rule). Deciding after the draw (e.g. dropping a token whose own probability is low) would bias it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ears_core.metrics import expected_tokens

__all__ = ["PriceCurve", "RunningPrices", "Calibration", "DepthCalibration", "DraftPolicy", "expected_tokens", "round_value",
           "break_even_acceptance", "describe"]


@dataclass
class PriceCurve:
    """verify_ms[m - 1] = V(m) for m = 1 .. len(verify_ms); draft_ms = d; overhead_ms = o."""

    verify_ms: list[float]
    draft_ms: float
    overhead_ms: float = 0.0
    key: str = ""  # what it was measured on: model, device, dtype, threads
    measured_at: str = ""
    provisional: bool = False  # a quick stand-in until the profile is measured (module terms)

    def __post_init__(self) -> None:
        if not self.verify_ms or any(not (v > 0) for v in self.verify_ms):
            raise ValueError(f"verify prices must be > 0 ms, got {self.verify_ms}")
        if self.draft_ms < 0 or self.overhead_ms < 0:
            raise ValueError("draft and overhead prices must be >= 0 ms")

    @property
    def step_ms(self) -> float:
        return self.verify_ms[0]

    @property
    def max_m(self) -> int:
        return len(self.verify_ms)

    def verify(self, m: int) -> float:
        """V(m); beyond the measured range, extrapolated linearly from the last two points."""
        if m <= self.max_m:
            return self.verify_ms[m - 1]
        last = self.verify_ms[-1]
        slope = last - self.verify_ms[-2] if self.max_m >= 2 else last
        return last + max(slope, 0.0) * (m - self.max_m)

    def steps(self, m: int) -> float:
        return self.verify(m) / self.step_ms

    def round_ms(self, k: int) -> float:
        return k * self.draft_ms + self.verify(k + 1) + self.overhead_ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def round_value(a: Sequence[float], prices: PriceCurve) -> list[float]:
    """[value(0), ..., value(len(a))]: expected tokens per millisecond for each k."""
    return [e / prices.round_ms(k) for k, e in enumerate(expected_tokens(a))]


def break_even_acceptance(prices: PriceCurve, k: int) -> float:
    """The per-position acceptance a (the same at every position) at which k drafts pay as much
    as a plain target step (value(k) = value(0)); 1.0 if they never do."""
    if k == 0:
        return 0.0
    lo, hi = 0.0, 1.0
    if round_value([hi] * k, prices)[k] <= round_value([], prices)[0]:
        return 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if round_value([mid] * k, prices)[k] > round_value([], prices)[0]:
            hi = mid
        else:
            lo = mid
    return hi


# ------------------------------------------------------------------------------- calibration


@dataclass
class Calibration:
    """confidence -> acceptance, by bins over [0, 1]: a Beta(prior) mean per bin, updated online.

    prior: the acceptance assumed before any evidence, as a function of the bin's centre c
    (``prior_scale * c``), worth ``prior_weight`` observations."""

    bins: int = 10
    prior_scale: float = 1.0
    prior_weight: float = 4.0
    stood: list[float] = field(default_factory=list)
    seen: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.stood:
            self.stood = [0.0] * self.bins
            self.seen = [0.0] * self.bins

    def _bin(self, conf: float) -> int:
        return min(int(max(conf, 0.0) * self.bins), self.bins - 1)

    def __call__(self, conf: float, depth: int = 1) -> float:
        """The acceptance estimate for a draft of this confidence (one table for every depth)."""
        b = self._bin(conf)
        centre = (b + 0.5) / self.bins
        prior = min(self.prior_scale * centre, 1.0)
        if self.seen[b] + self.prior_weight <= 0:
            return prior
        return (self.stood[b] + self.prior_weight * prior) / (self.seen[b] + self.prior_weight)

    def means(self, k: int) -> list[float]:
        """The mean acceptance for depths 1 .. k (the policy's prior for positions not drafted yet)."""
        return [self.mean()] * k

    def mean(self, default: float = 0.4) -> float:
        """The acceptance seen over all bins (``default`` before any evidence)."""
        seen = sum(self.seen)
        if seen + self.prior_weight <= 0:
            return default
        return (sum(self.stood) + self.prior_weight * default) / (seen + self.prior_weight)

    def copy(self) -> "Calibration":
        return Calibration(self.bins, self.prior_scale, self.prior_weight, list(self.stood), list(self.seen))

    def observe(self, conf: float, stood: bool, depth: int = 1) -> None:
        b = self._bin(conf)
        self.seen[b] += 1.0
        self.stood[b] += float(stood)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DepthCalibration:
    """One ``Calibration`` per draft depth (1 = a round's first draft; the last table serves every
    deeper one). A head's later drafts read its own predicted features, so at one confidence a third
    draft stands less often than a first (the embedded head's acceptance per depth is in its model card,
    assets/embedded_draft/README.md). Depth d learns only from rounds whose drafts 1 .. d-1 stood, so it
    estimates the conditional a_d that E(k) multiplies.

    drift: per depth, a running ratio r_d = (drafts that stood) / (their estimates), over the last
    ``drift_memory`` verified drafts at that depth (starting at 1, worth ``drift_prior`` drafts),
    and every estimate is the table's times r_d (at most 1). The bins learn slowly (a bin sees a
    tenth of the drafts); r_d pools them, so a table measured on other text (the shipped one, from
    the training prompts' held-out split, was optimistic on ``assets/prompts.json``, most at depth 3:
    docs/measurements.md) is corrected within a few dozen rounds. It also removes the policy's own selection bias: a deep draft is verified only where
    its estimate was high, which is where a noisy bin errs upwards."""

    def __init__(self, tables: Sequence[Calibration], drift_memory: float = 0.0, drift_prior: float = 8.0) -> None:
        if not tables:
            raise ValueError("a DepthCalibration needs at least one table")
        self.tables = list(tables)
        self.prior_weight = min(t.prior_weight for t in self.tables)
        self.drift_memory, self.drift_prior = drift_memory, drift_prior
        self._stood = [0.0] * len(self.tables)  # per depth: drafts that stood, forgetting past drift_memory
        self._est = [0.0] * len(self.tables)  # their estimates when drawn, the same way

    def _index(self, depth: int) -> int:
        return min(max(depth, 1), len(self.tables)) - 1

    def _at(self, depth: int) -> Calibration:
        return self.tables[self._index(depth)]

    def drift(self, depth: int) -> float:
        """r_d: how far the table is off on the text seen lately (1: not at all, or off)."""
        if self.drift_memory <= 0:
            return 1.0
        i = self._index(depth)
        return (self._stood[i] + self.drift_prior) / (self._est[i] + self.drift_prior)

    def _corrected(self, value: float, depth: int) -> float:
        return min(value * self.drift(depth), 1.0)

    def __call__(self, conf: float, depth: int = 1) -> float:
        return self._corrected(self._at(depth)(conf), depth)

    def observe(self, conf: float, stood: bool, depth: int = 1) -> None:
        if self.drift_memory > 0:
            i = self._index(depth)
            est = self._at(depth)(conf)
            keep = 1.0 - 1.0 / self.drift_memory
            self._stood[i] = keep * self._stood[i] + float(stood)
            self._est[i] = keep * self._est[i] + est
        self._at(depth).observe(conf, stood)

    def mean(self, default: float = 0.4) -> float:
        return self._corrected(self.tables[0].mean(default), 1)

    def means(self, k: int) -> list[float]:
        return [self._corrected(self._at(d).mean(), d) for d in range(1, k + 1)]

    def copy(self) -> "DepthCalibration":
        c = DepthCalibration([t.copy() for t in self.tables], self.drift_memory, self.drift_prior)
        c._stood, c._est = list(self._stood), list(self._est)
        return c

    def to_dict(self) -> dict[str, Any]:
        return {"depths": [t.to_dict() for t in self.tables]}


# ---------------------------------------------------------------------------- online prices


class RunningPrices:
    """A PriceCurve kept current from measured rounds. Each V(m), d and o is a running mean over
    its samples until it has ``1 / alpha`` of them, then an exponential moving average (weight
    ``alpha`` for a new sample). The measured V(m) count as ``measured_weight`` samples; the draft
    and overhead prices of a fresh profile are guesses (weight 0: the first round replaces them)."""

    def __init__(self, prices: PriceCurve, alpha: float = 0.1, measured_weight: int = 5) -> None:
        self.curve = PriceCurve(list(prices.verify_ms), prices.draft_ms, prices.overhead_ms, prices.key,
                                prices.measured_at, prices.provisional)
        measured_weight = 1 if prices.provisional else measured_weight
        self.alpha = alpha
        self.profile = list(prices.verify_ms)  # the measured V(m) (rescaled by ``fold_in_step``)
        self._share = [1.0] * prices.max_m  # the profile's weight in each running V(m)
        self._n_verify = [measured_weight] * prices.max_m
        self._n_draft = 0 if prices.measured_at else measured_weight
        self._n_overhead = 0

    def _mix(self, old: float, new: float, n: int) -> float:
        w = max(self.alpha, 1.0 / (n + 1))
        return (1 - w) * old + w * new

    def observe(self, k: int, draft_ms: float, verify_ms: float, overhead_ms: float) -> None:
        """One round with k drafts: its draft time (all steps), verify pass and overhead, in ms."""
        c = self.curve
        m = k + 1
        if m <= c.max_m and verify_ms > 0:
            c.verify_ms[m - 1] = self._mix(c.verify_ms[m - 1], verify_ms, self._n_verify[m - 1])
            self._share[m - 1] *= 1 - max(self.alpha, 1.0 / (self._n_verify[m - 1] + 1))
            self._n_verify[m - 1] += 1
        if k > 0 and draft_ms >= 0:
            c.draft_ms = self._mix(c.draft_ms, draft_ms / k, self._n_draft)
            self._n_draft += 1
        if overhead_ms >= 0:
            c.overhead_ms = self._mix(c.overhead_ms, overhead_ms, self._n_overhead)
            self._n_overhead += 1

    def fold_in_step(self) -> float:
        """Rescale the profile by the plain steps the rounds measured (module terms: fold in) and
        return the factor: each V(m) is share_m * profile_m + the rounds' part, and its profile part
        is multiplied by f = (the rounds' mean plain step) / (the profile's step), so V(1) becomes
        the rounds' own mean. 1.0 (nothing changes) before any plain step was measured."""
        c, s, p1 = self.curve, self._share[0], self.profile[0]
        if s >= 1.0:
            return 1.0
        f = (c.verify_ms[0] - s * p1) / (1.0 - s) / p1
        for i, (share, p) in enumerate(zip(self._share, self.profile)):
            c.verify_ms[i] += share * p * (f - 1.0)
            self.profile[i] = p * f
        return f


# ------------------------------------------------------------------------------------ policy


class DraftPolicy:
    """Each round: how many drafts to send. ``keep_going(a_known)`` is asked before drawing draft
    i = len(a_known) (with a_known[-1] the estimate for it); it says whether verifying position i
    can still pay: the best value over k >= i, with ``prior`` for the positions not seen yet,
    beats stopping at i - 1. Asked with every estimate known, it stops at the best k (tests/test_costs.py).

    looked: the drafter has already run the draft step that computed position i (a head's
    forward after draft i - 1, needed to know its confidence), so stopping at i - 1 no longer
    saves that step: the stop is charged i draft steps, not i - 1 (a sunk cost is not a saving).
    Without it the rule stopped on many greedy rounds after paying for the look (docs/measurements.md).

    fixed: send K drafts every round (the old behaviour, for comparison).
    threshold: verify position i while its estimate is at least this (the old fixed confidence
        threshold, but asked before the draw), ignoring the prices.
    """

    def __init__(self, prices: RunningPrices | PriceCurve, max_k: int, *, prior: float | Sequence[float] = 0.5, fixed: bool = False,
                 threshold: float | None = None) -> None:
        if max_k < 0:
            raise ValueError(f"max_k must be >= 0, got {max_k}")
        self.prices = prices if isinstance(prices, RunningPrices) else RunningPrices(prices)
        self.max_k, self.prior, self.fixed, self.threshold = max_k, prior, fixed, threshold

    @property
    def curve(self) -> PriceCurve:
        return self.prices.curve

    def new_calibration(self) -> "Calibration":
        """The acceptance estimates a run starts from when it is given none: an uncalibrated table."""
        return Calibration()

    def keep_going(self, a_known: Sequence[float], limit: int | None = None,
                   future: Sequence[float] | None = None, looked: bool = False) -> bool:
        """Verify position i = len(a_known)? ``future``: estimates for the positions after i when
        known (else ``prior`` for each); ``looked``: position i's draft step is already spent."""
        i = len(a_known)  # position asked about (1-based): a_known[i - 1] is its estimate
        limit = self.max_k if limit is None else min(limit, self.max_k)
        if i > limit:
            return False
        if self.fixed:
            return True
        if self.threshold is not None:
            return a_known[-1] >= self.threshold
        seen = list(a_known)
        sunk = self.curve.draft_ms if looked else 0.0  # position i's step is spent whether or not it is verified
        stop_value = expected_tokens(seen[:-1])[i - 1] / (self.curve.round_ms(i - 1) + sunk)
        rest = list(future)[: limit - i] if future is not None else [self.prior_at(j) for j in range(i + 1, limit + 1)]
        values = round_value(seen + rest, self.curve)
        return max(values[i:]) > stop_value

    def prior_at(self, position: int) -> float:
        """The estimate assumed for a position not drafted yet: ``prior``, one value or one per depth."""
        if isinstance(self.prior, (int, float)):
            return float(self.prior)
        return float(self.prior[min(position, len(self.prior)) - 1])


def describe(curve: PriceCurve) -> str:
    """The curve in one line for summaries and notes: 'verify price in steps for m = 1..M: 1.00 ... (S ms a
    step; draft step D ms; overhead O ms)'."""
    steps = " ".join(f"{curve.steps(m):.2f}" for m in range(1, curve.max_m + 1))
    return (f"verify price in steps for m = 1..{curve.max_m}: {steps} ({curve.step_ms:.1f} ms a step; "
            f"draft step {curve.draft_ms:.2f} ms; overhead {curve.overhead_ms:.2f} ms)")

