"""The rules that may distort the output for speed: EARS with an entropy tolerance, typical
acceptance (Medusa), FLy (deferred rejection) and EARS under a distortion budget. The terms are
rules/base.py's; each rule's exact distortion is ``AcceptanceRule.exact_distortion``
(rules/distortion.py).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor

from ears_core.rules.base import AcceptanceRule, EARSRule, RuleInputs
from ears_core.rules.registry import BETA, Param, register_rule

__all__ = ["EntropyEARSRule", "TypicalRule", "FLyRule", "BudgetEARSRule"]


def _entropy(probs: Tensor) -> Tensor:
    """(..., V) -> (...,) Shannon entropy in nats, with 0 log 0 = 0."""
    logp = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logp).sum(dim=-1)


@register_rule("ears-entropy", label="EARS, entropy tolerance", params=(BETA,), aliases=("entropy",))
class EntropyEARSRule(EARSRule):
    """EARS with the paper's future-work uncertainty: tolerance = beta * H(P_target) / log V,
    the entropy normalised to [0, 1], instead of 1 - max P_target."""

    name = "ears-entropy"

    def tolerance(self, target_probs: Tensor, max_p: Tensor) -> Tensor:
        v = target_probs.shape[-1]
        return self.beta * _entropy(target_probs) / math.log(v) if v > 1 else torch.zeros_like(max_p)

    def describe(self) -> str:
        return f"ears-entropy(beta={self.beta:g})"

    def __repr__(self) -> str:
        return f"EntropyEARSRule(beta={self.beta!r})"


@register_rule("typical", label="typical acceptance", params=(
    Param("eps", 0.09, 0.01, 1.0, "probability floor of a standing draft"),
    Param("delta", 0.3, 0.01, 1.0, "scale of exp(-entropy) in the floor")))
class TypicalRule(AcceptanceRule):
    """Typical acceptance (Medusa): a draft stands iff p(x) > min(eps, delta * exp(-H(P_target))).

    Deterministic given the distributions; after a rejection the token is drawn from P_target.
    A standing token the ordinary test (r >= U) would have rejected is reported as pardoned.
    """

    name = "typical"
    lossless = False

    def __init__(self, eps: float = 0.09, delta: float = 0.3) -> None:
        if not (0 < eps <= 1) or not (delta > 0):
            raise ValueError(f"typical acceptance needs 0 < eps <= 1 and delta > 0, got eps={eps}, delta={delta}")
        self.eps, self.delta = float(eps), float(delta)

    def _threshold(self, target_probs: Tensor) -> Tensor:  # (B, K, V) -> (B, K)
        return (self.delta * torch.exp(-_entropy(target_probs))).clamp(max=self.eps)

    def decide(self, x: RuleInputs, tolerance: Tensor) -> tuple[Tensor, Tensor]:
        stands = x.p > self._threshold(x.target_probs)
        ordinary = (x.ratio >= x.u) & (x.p > 0)
        return stands & ordinary, stands & ~ordinary

    def acceptance_prob(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor) -> Tensor:
        return (target_probs > self._threshold(target_probs).unsqueeze(-1)).to(target_probs.dtype)

    def residual(self, target_probs: Tensor, draft_probs: Tensor) -> Tensor:
        return target_probs

    def describe(self) -> str:
        return f"typical(eps={self.eps:g}, delta={self.delta:g})"

    def __repr__(self) -> str:
        return f"TypicalRule(eps={self.eps!r}, delta={self.delta!r})"


def _whole(value: float, name: str, low: int) -> int:
    """A registry number (a float from a slider or a flag) that must be a whole number >= low."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or float(value) != int(value) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


def _top_entropy_max(n: int) -> float:
    """The largest -sum p log p over n probabilities that sum to at most 1: n / e while n / e <= 1
    (each term at its peak p = 1/e), else log n (uniform 1/n)."""
    return n / math.e if n <= 2 else math.log(n)


@register_rule("fly", label="FLy (deferred rejection)", params=(
    Param("gate", 0.3, 0.0, 1.2, "entropy (nats) of the target's top_n probabilities at or above which a "
          "rejection may be deferred (above log top_n: never)"),
    Param("window", 2.0, 0.0, 7.0, "drafts after a deferred rejection that must each stand under the ordinary "
          "rule (0 = never defer)", step=1.0),
    Param("top_n", 3.0, 1.0, 10.0, "how many of the target's largest probabilities the entropy gate reads", step=1.0)))
class FLyRule(AcceptanceRule):
    """FLy (training-free loosely speculative decoding; vLLM's ``rejection_sample_method="fly"``):
    defer a rejection where the target is uncertain and the drafts that follow agree with it.

    Terms (row of K drafts, position i, W = ``window``, n = ``top_n``)
    native      the ordinary test at i: r >= U and p > 0 (``accepted`` below)
    gate        H_n(i) >= ``gate``, with H_n(i) = -sum p log p over the n largest target
                probabilities at i (after temperature / top-k / top-p, not renormalised), in nats.
                H_n <= log n for n >= 3 (n / e for n <= 2): a gate above that never opens.
    confirmed   each of the W drafts after i, at i+1..i+W, passes its own native test (with its
                own uniform, exactly as the ordinary rule would judge it)
    deferral    at i: native fails, p > 0, q > 0, gate open, i + W < K and confirmed. The drafted
                token stands; it is reported as *pardoned* (accepted only thanks to the rule).
                Two deferrals are at least W + 1 positions apart (the W after one are native).
    end of the chain  a position with fewer than W drafts after it (i >= K - W) is never deferred:
                the ordinary decision stands there, as in vLLM. Confirming with only the drafts
                that exist would let the last draft of every round stand unconfirmed. So K <= W
                never defers, and a round drafted short (dynamic draft length) defers less.
    W = 0       no confirmation possible: FLy never defers and is the ordinary rule draw for draw
                (vLLM would defer every gated rejection unconfirmed; here W = 0 switches it off).

    After a rejection the ordinary residual is drawn; the bonus token is unchanged. In a draft tree
    (``verify_tree``) every test is a single position, so FLy there is the ordinary rule.

    Distortion: whether x stands at i depends on the drafts after i, which were drawn given x, so
    there is no per-position closed form. ``acceptance_prob`` gives the approximation
        a(x) = a0(x) + (1 - a0(x)) [gate open] [i + W < K] prod_{j=i+1..i+W} alpha_j   (p(x) > 0)
    with a0 = min(1, p/q) and alpha_j = sum_y min(P_target_j(y), P_draft_j(y)), the native
    acceptance probability at j read from the drafted chain. It is exact for the first position of
    a round when the distributions after it do not depend on the drafted token; otherwise the
    tests measure the true output distribution by exact enumeration (tests/test_rules_lossy.py).
    """

    name = "fly"
    looks_ahead = True  # a rejection is deferred when the next drafts stand
    row_by_row = False

    def __init__(self, gate: float = 0.3, window: float = 2, top_n: float = 3) -> None:
        if not isinstance(gate, (int, float)) or gate != gate or gate < 0:
            raise ValueError(f"FLy gate must be a number >= 0 (an entropy in nats), got {gate!r}")
        self.gate = float(gate)
        self.window = _whole(window, "FLy window", 0)
        self.top_n = _whole(top_n, "FLy top_n", 1)

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        """True when FLy can never defer: window 0, or a gate above the largest top-n entropy."""
        return self.window == 0 or self.gate > _top_entropy_max(self.top_n)

    def gate_open(self, target_probs: Tensor) -> Tensor:
        """(B, K, V) -> (B, K) bool: the target's top-n entropy reaches the gate."""
        n = min(self.top_n, target_probs.shape[-1])
        top = target_probs.topk(n, dim=-1).values  # (B, K, n)
        return _entropy(top) >= self.gate

    def decide(self, x: RuleInputs, tolerance: Tensor) -> tuple[Tensor, Tensor]:
        accepted = (x.ratio >= x.u) & (x.p > 0)  # (B, K) the native decisions
        b, k = accepted.shape
        w = self.window
        if w == 0 or k <= w:
            return accepted, torch.zeros_like(accepted)
        fails = torch.cat([torch.zeros_like(accepted[:, :1], dtype=torch.long),
                           (~accepted).long().cumsum(dim=-1)], dim=-1)  # (B, K+1): native failures before j
        later = fails[:, w + 1:] - fails[:, 1:k - w + 1]  # (B, K-W): failures among i+1..i+W, i < K-W
        confirmed = torch.cat([later == 0, torch.zeros_like(accepted[:, :w])], dim=-1)  # (B, K)
        deferred = ~accepted & (x.p > 0) & (x.q > 0) & confirmed & self.gate_open(x.target_probs)
        return accepted, deferred

    def acceptance_prob(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor) -> Tensor:
        """(B, K, V) the approximation of the class docstring (the ordinary a0 where FLy cannot defer)."""
        a0 = super().acceptance_prob(target_probs, draft_probs, torch.zeros_like(tolerance))  # (B, K, V)
        b, k, _ = target_probs.shape
        w = self.window
        if w == 0 or k <= w:
            return a0
        alpha = torch.minimum(target_probs, draft_probs).sum(dim=-1)  # (B, K) native acceptance probability
        confirm = alpha[:, 1:].unfold(-1, w, 1).prod(dim=-1)  # (B, K-W): the W after i all stand, i < K-W
        confirm = torch.cat([confirm, confirm.new_zeros(b, w)], dim=-1)  # (B, K)
        defer = (self.gate_open(target_probs).to(a0.dtype) * confirm).unsqueeze(-1)  # (B, K, 1)
        return a0 + (1.0 - a0) * defer * (target_probs > 0).to(a0.dtype)

    def describe(self) -> str:
        return f"fly(gate={self.gate:g}, window={self.window}, top_n={self.top_n})"

    def __repr__(self) -> str:
        return f"FLyRule(gate={self.gate!r}, window={self.window!r}, top_n={self.top_n!r})"


@register_rule("ears-budget", label="EARS, distortion budget", params=(
    Param("epsilon", 0.01, 0.0, 0.1, "largest mean total-variation distortion per emitted token "
          "(0 = the ordinary rule)", step=0.001),), aliases=("budget",))
class BudgetEARSRule(EARSRule):
    """EARS whose beta is set every round so that the running mean of the exact distortion per
    emitted token never exceeds ``epsilon``, pardoning as much as that allows.

    Terms (one generation)
    N, D        tokens emitted so far, and the sum of their exact distortion (TokenEvent.distortion,
                the TV distance verify() computes per position; 0 for bonus and target tokens)
    slack S     epsilon * N - D: distortion the budget still allows
    u_j         1 - max P_target at position j of the coming round (known before its decisions)
    bound       one position's distortion is at most its tolerance beta * u_j: pardons move at
                most that much probability mass from the residual to the drafted token
    beta        each round (``tolerance()``), the largest value in [0, beta_max] with
                    beta * (u_0 + ... + u_{L-1}) + L * 1e-6 <= S + epsilon * L   for L = 1..K
                i.e. even if every position distorted as much as its bound allows, the running mean
                would stay <= epsilon after any number L of the round's tokens (a round emits 1..K+1
                tokens; an EOS may cut it; the bonus token adds none). 1e-6 per position absorbs
                float32 rounding in verify's TV. Rounds that distort less than the bound leave
                slack, which later rounds spend: beta climbs until the realised mean nears epsilon.
    guarantee   after every round D <= epsilon * N (+ float rounding): deterministic, not a
                statistical statement, given that events carry the exact distortion (decoding's
                ``with_distortion=True``, its default; without it the controller sees 0 and the
                guarantee is void).

    epsilon = 0 keeps beta = 0: the ordinary rule draw for draw. ``observe_round(events)`` (called
    by the decode loop after each round) updates N and D. State: one instance serves ONE
    generation; ``fresh()`` gives a new one with the same parameters (the session and the bench
    build one per run with ``make_rule``). Tree decoding does not call ``observe_round``: there the
    slack never grows and beta stays at the start-up value. ``betas`` lists the beta of each round
    that drafted (a round with no drafts has none).
    """

    name = "ears-budget"
    row_by_row = False  # a round's beta reads every row's max P_target
    SLOP = 1e-6  # per position: float32 rounding of the exact TV, kept out of the budget

    def __init__(self, epsilon: float = 0.01, beta_max: float = 1.0) -> None:
        if not isinstance(epsilon, (int, float)) or epsilon != epsilon or not 0 <= epsilon <= 1:
            raise ValueError(f"the distortion budget epsilon must be a number in [0, 1] (a TV distance per "
                             f"token; 0 is the ordinary lossless rule), got {epsilon!r}")
        if not isinstance(beta_max, (int, float)) or beta_max != beta_max or beta_max < 0:
            raise ValueError(f"beta_max must be a number >= 0, got {beta_max!r}")
        self.epsilon, self.beta_max = float(epsilon), float(beta_max)
        self.tokens = 0  # N
        self.distortion = 0.0  # D
        self._betas: list[Tensor] = []  # (B,) per round, read lazily: no extra host sync in the loop

    def fresh(self) -> "BudgetEARSRule":
        """A new instance with the same parameters and an empty budget (for another generation)."""
        return type(self)(self.epsilon, self.beta_max)

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.epsilon == 0

    @property
    def slack(self) -> float:
        return self.epsilon * self.tokens - self.distortion

    @property
    def mean_distortion(self) -> float:
        """D / N so far (0 before the first token)."""
        return self.distortion / self.tokens if self.tokens else 0.0

    @property
    def beta(self) -> float:  # type: ignore[override]
        """The beta of the last round (max over rows; 0 before the first)."""
        return self.betas[-1] if self._betas else 0.0

    @property
    def betas(self) -> list[float]:
        """The beta of every round so far (max over rows)."""
        return [float(b.max()) if b.numel() else 0.0 for b in self._betas]

    def round_beta(self, max_p: Tensor) -> Tensor:
        """(B, K) max P_target of the coming round -> (B,) the largest safe beta (class docstring)."""
        u = (1.0 - max_p).clamp(min=0.0)  # (B, K)
        need = u.cumsum(dim=-1)  # (B, K): worst-case distortion of the first L positions, per unit of beta
        length = torch.arange(1, u.shape[-1] + 1, device=u.device, dtype=u.dtype)  # (K,) L
        allowed = self.slack + (self.epsilon - self.SLOP) * length  # (K,)
        free = torch.where(allowed >= 0, math.inf, 0.0).expand_as(need)  # (B, K): no uncertainty, beta is moot
        cap = torch.where(need > 0, allowed / need.clamp(min=1e-30), free)  # (B, K)
        return cap.min(dim=-1).values.clamp(min=0.0, max=self.beta_max)  # (B,)

    def tolerance(self, target_probs: Tensor, max_p: Tensor) -> Tensor:
        if max_p.shape[-1] == 0:  # a round with no drafts has no beta
            return torch.zeros_like(max_p)
        if self.epsilon == 0:
            self._betas.append(max_p.new_zeros(max_p.shape[0]))
            return torch.zeros_like(max_p)
        beta = self.round_beta(max_p)  # (B,)
        self._betas.append(beta)
        return beta.unsqueeze(-1) * (1.0 - max_p)

    def observe_round(self, events: Sequence[Any]) -> None:
        """Add a round's emitted tokens and their exact distortion to the running totals."""
        self.tokens += len(events)
        self.distortion += sum(float(e.distortion) for e in events)

    def describe(self) -> str:
        return f"ears-budget(epsilon={self.epsilon:g})"

    def __repr__(self) -> str:
        return f"BudgetEARSRule(epsilon={self.epsilon!r}, beta_max={self.beta_max!r})"
