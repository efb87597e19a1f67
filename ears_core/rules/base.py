"""Acceptance rules: how a verifier decides whether a drafted token stands.

Terms (per drafted token x at position i; all probabilities after temperature / top-k / top-p)
-----------------------------------------------------------------------------------------------
p          P_target(x), the target's probability of the drafted token
q          P_draft(x), the probability the draft drew it with
r          the ratio p / max(q, 1e-10)
m          max over the vocabulary of P_target at i (computed once per position by verify)
U          a uniform draw in [0, 1)
tolerance  how far below U the ratio may fall and still be accepted; 0 for the ordinary rule,
           beta * (1 - m) for EARS
accepted   r >= U: the ordinary rule accepts it too
pardoned   max(U - tolerance, 0) <= r < U: accepted only because of the tolerance
rejected   otherwise; the verifier then emits a token from ``residual()`` instead
bonus      when all K drafts stand, one more token is drawn from ``bonus()`` at position K

A token with p == 0 is never accepted by any rule (the clamp at 0 would otherwise let a
tolerance accept a token outside the target's support, e.g. after top-k / top-p).

A rule is one class. The default methods implement the ratio rule with a per-position tolerance,
so a new tolerance is a single ``tolerance()`` override; rules of another shape (greedy, typical
acceptance) override ``decide()``, ``acceptance_prob()`` and, if needed, ``residual()`` and
``bonus()``. ``acceptance_prob()`` gives a(x), the probability that x is accepted when drafted,
for every x in the vocabulary; metrics use it for the exact distortion of the rule.

``decide()`` sees all K positions of a row at once, so a rule may look ahead along the chain
(``FLyRule`` defers a rejection when the next drafts stand). A rule with state across rounds
defines ``observe_round(events)``: the decode loop calls it after every round with that round's
TokenEvents (``BudgetEARSRule`` keeps a running distortion budget this way). Such a rule holds
the state of ONE generation: build a new instance per generation (``make_rule``, or ``fresh()``).

The registry (rules/registry.py) lists every rule by name; the rules that may distort the output
(entropy EARS, typical acceptance, FLy, the distortion budget) are in rules/lossy.py; the exact
emitted distribution and its distortion are in rules/distortion.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ears_core.rules.distortion import RESIDUAL_EPS, emitted, ratio_rule_distortion, tv_distance
from ears_core.rules.registry import BETA, register_rule
from ears_core.sampling import first_argmax

__all__ = ["Q_EPS", "RuleInputs", "AcceptanceRule", "StandardRule", "EARSRule", "GreedyRule", "verifying_rule",
           "is_ratio_rule"]

Q_EPS = 1e-10  # the division guard on the draft probability (seed 000, section 3.3)


@dataclass(frozen=True)
class RuleInputs:
    """What a rule sees for B rows x K drafted positions."""

    target_probs: Tensor  # (B, K, V) target distribution at each drafted position
    draft_probs: Tensor  # (B, K, V) distribution each draft token was drawn from
    draft_tokens: Tensor  # (B, K) long
    p: Tensor  # (B, K) P_target(x)
    q: Tensor  # (B, K) P_draft(x)
    ratio: Tensor  # (B, K) p / max(q, Q_EPS)
    max_p: Tensor  # (B, K) max_v P_target(v)
    u: Tensor  # (B, K) uniform draws in [0, 1)


class AcceptanceRule:
    """The ratio rule with a per-position tolerance (0 here: the ordinary lossless rule)."""

    name: str = "standard"
    lossless: bool = True
    argmax_only: bool = False  # decides and emits by the target's argmax alone (verify's greedy path)
    looks_ahead: bool = False  # a position's decision and acceptance read the drafts after it (FLy)
    # a position's decision reads its own row of P_target alone, so a verify pass may be scored up to the first draft
    # that falls (decode/row_walk.py); False for a rule that reads other rows (FLy's look-ahead, the budget's beta)
    row_by_row: bool = True

    def tolerance(self, target_probs: Tensor, max_p: Tensor) -> Tensor:
        """(B, K, V), (B, K) -> (B, K) tolerance subtracted from U."""
        return torch.zeros_like(max_p)

    def decide(self, x: RuleInputs, tolerance: Tensor) -> tuple[Tensor, Tensor]:
        """-> (accepted, pardoned), both (B, K) bool and disjoint."""
        in_support = x.p > 0
        accepted = (x.ratio >= x.u) & in_support
        threshold = (x.u - tolerance).clamp(min=0.0)
        pardoned = (x.ratio >= threshold) & in_support & ~accepted
        return accepted, pardoned

    def acceptance_prob(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor) -> Tensor:
        """(B, K, V) probability that each token would be accepted if drafted at each position.

        For the ratio rule with U ~ Uniform[0, 1): P(r >= max(U - tol, 0)) = min(1, r + tol).
        """
        ratio = target_probs / draft_probs.clamp(min=Q_EPS)  # (B, K, V)
        a = (ratio + tolerance.unsqueeze(-1)).clamp(max=1.0)
        return torch.where(target_probs > 0, a, torch.zeros_like(a))

    def residual(self, target_probs: Tensor, draft_probs: Tensor) -> Tensor:
        """(..., V) distribution to draw from after a rejection: norm(max(0, p - q)), or p
        itself where that residual has no mass."""
        res = (target_probs - draft_probs).clamp(min=0.0)
        mass = res.sum(dim=-1, keepdim=True)
        empty = mass <= RESIDUAL_EPS
        return torch.where(empty, target_probs, res / torch.where(empty, 1.0, mass))

    def bonus(self, target_probs: Tensor) -> Tensor:
        """(..., V) distribution of the bonus token drawn after K accepted drafts."""
        return target_probs

    def next_mass(self, faced: Tensor, q_last: Tensor, is_bonus: Tensor) -> Tensor:
        """(..., V) unnormalised mass of the token emitted where a row's drafts stop, with no host read: what every
        verifier's draw searches the cumulative sum of (``decode/next_token.draw_after``). ``bonus(faced)`` where
        ``is_bonus`` (...,) bool, else the residual after the rejection: for the ratio rule max(0, faced - q_last),
        or ``faced`` itself where that has no mass (RESIDUAL_EPS or less, as ``residual``); for a rule with a
        residual of its own, that residual. The ratio rule's three cases pick one row each before a single
        cumulative sum: ``verify`` at K = 4, V = 49,152 on a 2-core Xeon took 1.4 ms, 2.2 with a sum per case."""
        if type(self).residual is not AcceptanceRule.residual:
            res = self.residual(faced, q_last)
        else:
            res = (faced - q_last).clamp(min=0.0)
            empty = res.sum(dim=-1, keepdim=True) <= RESIDUAL_EPS  # (..., 1)
            if type(self).bonus is AcceptanceRule.bonus:  # the bonus and the empty residual's fallback: both faced
                return torch.where(empty | is_bonus.unsqueeze(-1), faced, res)
            res = torch.where(empty, faced, res)
        return torch.where(is_bonus.unsqueeze(-1), self.bonus(faced), res)

    def emitted(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor) -> Tensor:
        """(B, K, V) distribution of the token one verified position emits (``distortion.emitted``)."""
        return emitted(draft_probs, self.acceptance_prob(target_probs, draft_probs, tolerance),
                       self.residual(target_probs, draft_probs))

    def exact_distortion(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor,
                         support: Tensor | None = None) -> Tensor:
        """(B, K, V), (B, K, V), (B, K) -> (B, K): TV(emitted, P_target) at each verified position.
        ``support`` (N,) token ids outside which draft_probs is 0, if known (drafters.py).

        A ratio rule (``is_ratio_rule``: only ``tolerance()`` is its own) has a closed form
        (``distortion.ratio_rule_distortion``); other rules enumerate the emitted distribution."""
        if is_ratio_rule(self):
            return ratio_rule_distortion(target_probs, draft_probs, tolerance, support)
        return tv_distance(self.emitted(target_probs, draft_probs, tolerance), target_probs)

    def describe(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def is_ratio_rule(rule: AcceptanceRule) -> bool:
    """Whether ``rule`` is the ratio rule with a tolerance: its decide, acceptance_prob and residual
    are AcceptanceRule's own (EARS and its variants; not greedy, typical or FLy)."""
    t = type(rule)
    return all(getattr(t, m) is getattr(AcceptanceRule, m) for m in ("decide", "acceptance_prob", "residual"))


@register_rule("standard", label="ordinary (lossless)", aliases=("ordinary", "lossless"))
class StandardRule(AcceptanceRule):
    """Ordinary speculative sampling (Leviathan et al., Chen et al.): lossless."""

    name = "standard"
    lossless = True


@register_rule("ears", label="EARS", params=(BETA,))
class EARSRule(AcceptanceRule):
    """EARS (seed 000): tolerance = beta * (1 - max P_target). beta = 0 is StandardRule."""

    name = "ears"

    def __init__(self, beta: float = 0.1) -> None:
        if not isinstance(beta, (int, float)) or beta != beta or beta < 0:
            raise ValueError(
                f"EARS beta must be a number >= 0, got {beta!r}; beta = 0 is the ordinary "
                "lossless rule and the paper uses 0.05-0.2"
            )
        self.beta = float(beta)

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.beta == 0

    def tolerance(self, target_probs: Tensor, max_p: Tensor) -> Tensor:
        return self.beta * (1.0 - max_p)

    def describe(self) -> str:
        return f"ears(beta={self.beta:g})"

    def __repr__(self) -> str:
        return f"EARSRule(beta={self.beta!r})"


@register_rule("greedy", label="greedy (T = 0)")
class GreedyRule(AcceptanceRule):
    """Accept iff the drafted token is the target's argmax; emit the argmax otherwise.

    The output is the target's own greedy decoding, token for token, whatever the draft does.
    """

    name = "greedy"
    lossless = True
    argmax_only = True

    def decide(self, x: RuleInputs, tolerance: Tensor) -> tuple[Tensor, Tensor]:
        accepted = x.draft_tokens == first_argmax(x.target_probs)
        return accepted, torch.zeros_like(accepted)

    @staticmethod
    def _one_hot_argmax(probs: Tensor) -> Tensor:
        return torch.zeros_like(probs).scatter_(-1, first_argmax(probs, keepdim=True), 1.0)

    def acceptance_prob(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor) -> Tensor:
        return self._one_hot_argmax(target_probs)

    def residual(self, target_probs: Tensor, draft_probs: Tensor) -> Tensor:
        return self._one_hot_argmax(target_probs)

    def bonus(self, target_probs: Tensor) -> Tensor:
        return self._one_hot_argmax(target_probs)


def verifying_rule(rule: AcceptanceRule, greedy: bool) -> AcceptanceRule:
    """The rule a decode loop verifies with: ``GreedyRule()`` in place of the ordinary rule or EARS at
    T = 0, else ``rule``. At T = 0 P_target and q are one-hot, so those two decide, emit and record
    exactly as GreedyRule does (the ratio is 1 or 0, EARS's tolerance beta (1 - max P) is 0, the
    residual after a rejection is the target's one-hot), and GreedyRule's path needs no pass over V
    beyond one argmax. Subclasses (a budget, other tolerances) are left as they are."""
    return GreedyRule() if greedy and type(rule) in (StandardRule, EARSRule) else rule
