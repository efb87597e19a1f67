"""Metrics of one generation, and the theory they are compared with.

Terms
-----
drafted               draft tokens put to the target (sum of K over rounds)
acceptance rate a     drafts that stood (accepted + pardoned) / drafted
pardon rate           pardoned / drafted
mean acceptance len   tokens emitted per round = 1 + (drafts that stood) / rounds
distortion            per position: TV(emitted distribution, P_target), exact (see verify.py);
                      per generation: the mean over emitted tokens, and the sum, which bounds the
                      TV distance of the whole sequence's distribution from the target's
cost ratio c          one draft step's time / one target verify pass's time, as measured
E(a, K)               expected tokens per round with independent acceptances at rate a:
                      (1 - a^(K+1)) / (1 - a)  (K + 1 when a = 1); a generation's theory figures
                      use the drafts actually made per round (K, or fewer when the draft stops early)
S(a, K, c)            the speedup theory predicts over target-only decoding: E / (K c + 1)
decode clock          seconds inside the decoder only (``decode_s``): what tokens/s and speedups use
wall clock            seconds a user waits, from the request's start to its last token (``wall_s``); time to
                      first token ``ttft_s`` likewise. ``clock_parts`` splits wall - decode into what it was
                      spent on: the labelled ``waits``, the rest of the setup before decoding, and the time
                      between tokens outside the decoder (a caller drawing a page, other threads)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ears_core.events import StepRecord, TokenEvent

__all__ = ["GenerationStats", "summarize", "expected_tokens", "expected_tokens_per_step", "theoretical_speedup", "round_theory",
           "clock_parts", "SETUP", "BETWEEN_TOKENS"]

SETUP = "setting up the run before its first decode step"  # clock_parts' labels
BETWEEN_TOKENS = "between tokens, outside the decoder (the caller's own work, other threads)"


def expected_tokens(a: Sequence[float]) -> list[float]:
    """[E(0), E(1), ..., E(len(a))]: expected tokens of a round that drafts 0, 1, ... positions with
    per-position acceptance a_1..a_n (each clamped to [0, 1]); E(k) = 1 + a_1 + a_1 a_2 + ..."""
    out, run, e = [1.0], 1.0, 1.0
    for x in a:
        run *= min(max(float(x), 0.0), 1.0)
        e += run
        out.append(e)
    return out


def expected_tokens_per_step(a: float, k: int) -> float:
    """E = (1 - a^(K+1)) / (1 - a): expected tokens per round (seed 003)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {a}")
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def theoretical_speedup(a: float, k: int, c: float) -> float:
    """S = E / (K c + 1): predicted speedup over target-only decoding."""
    if c < 0:
        raise ValueError(f"cost ratio must be >= 0, got {c}")
    return expected_tokens_per_step(a, k) / (k * c + 1.0)


def round_theory(accepted: int, drafted: int, rounds: int, draft_ms: float, target_ms: float
                 ) -> tuple[float, float, float, float]:
    """Theory from measured totals -> (k, c, E, S): k = drafts made per round (K, fewer with a
    dynamic draft length or near the end), c = one draft step / one verify pass, E = E(a, k) with
    a = accepted / drafted, S = E / (k c + 1). Needs drafted > 0, rounds > 0, target_ms > 0."""
    k_eff = drafted / rounds
    cost = (draft_ms / drafted) / (target_ms / rounds)
    e = expected_tokens_per_step(accepted / drafted, k_eff)
    return k_eff, cost, e, e / (k_eff * cost + 1.0)


@dataclass
class GenerationStats:
    method: str
    new_tokens: int
    steps: int
    drafted: int
    accepted: int  # drafts that stood, pardoned included
    pardoned: int
    resampled: int
    bonus: int
    acceptance_rate: float | None
    pardon_rate: float | None
    mean_accept_length: float
    decode_s: float  # seconds on the decode clock (Generation: time inside next() only)
    tokens_per_s: float
    draft_ms: float
    target_ms: float
    mean_distortion: float
    total_distortion: float
    max_drafts: int  # the most drafts a round could send: K for a chain, the node budget for a tree
    cost_ratio: float | None  # draft step / target verify pass
    theory_tokens_per_step: float | None
    theory_speedup: float | None
    wall_s: float | None = None  # the wall clock, from the request's start to its latest token
    ttft_s: float | None = None  # the wall clock from the request's start to its first token
    first_token_decode_s: float | None = None  # the decode clock to the first token: the prefill and the first round
    setup_s: float | None = None  # the wall clock from the request's start to the decoder's first call
    waits: dict[str, float] = field(default_factory=dict)  # labelled seconds outside the decoder

    @property
    def wall_tokens_per_s(self) -> float | None:
        return self.new_tokens / self.wall_s if self.wall_s else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def clock_parts(stats: GenerationStats) -> list[tuple[str, float]]:
    """What wall_s - decode_s was spent on, largest first: each labelled wait, ``SETUP`` (the rest of
    the time before the first decode step) and ``BETWEEN_TOKENS``; [] without a wall clock."""
    if stats.wall_s is None or stats.setup_s is None:
        return []
    waits = {k: v for k, v in stats.waits.items() if v > 0}
    parts = {**waits, SETUP: stats.setup_s - sum(waits.values()),
             BETWEEN_TOKENS: stats.wall_s - stats.setup_s - stats.decode_s}
    return sorted(((k, v) for k, v in parts.items() if v > 0), key=lambda kv: -kv[1])


def summarize(
    method: str,
    events: Sequence[TokenEvent],
    steps: Sequence[StepRecord],
    decode_s: float,
    max_drafts: int,
) -> GenerationStats:
    """Fold a generation's events and step records into its metrics."""
    n_tok = len(events)
    n_steps = len(steps)
    drafted = sum(s.drafted for s in steps)
    accepted = sum(s.accepted for s in steps)
    pardoned = sum(s.pardoned for s in steps)
    kinds = [e.kind for e in events]
    draft_ms = sum(s.draft_ms for s in steps)
    target_ms = sum(s.target_ms for s in steps)
    total_dist = float(sum(e.distortion for e in events))
    rate = accepted / drafted if drafted else None
    cost = theory_e = theory_s = None
    if drafted and n_steps and target_ms > 0:
        _, cost, theory_e, theory_s = round_theory(accepted, drafted, n_steps, draft_ms, target_ms)
    return GenerationStats(
        method=method,
        new_tokens=n_tok,
        steps=n_steps,
        drafted=drafted,
        accepted=accepted,
        pardoned=pardoned,
        resampled=kinds.count("resampled"),
        bonus=kinds.count("bonus"),
        acceptance_rate=rate,
        pardon_rate=pardoned / drafted if drafted else None,
        mean_accept_length=(1.0 + accepted / n_steps) if n_steps else 0.0,
        decode_s=decode_s,
        tokens_per_s=n_tok / decode_s if decode_s > 0 else 0.0,
        draft_ms=draft_ms,
        target_ms=target_ms,
        mean_distortion=total_dist / n_tok if n_tok else 0.0,
        total_distortion=total_dist,
        max_drafts=max_drafts,
        cost_ratio=cost,
        theory_tokens_per_step=theory_e,
        theory_speedup=theory_s,
    )
