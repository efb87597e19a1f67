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

The registry
------------
``@register_rule(name, label=..., params=(Param(...), ...))`` on the class is all a new rule
needs: the CLI's ``--rule`` and parameter flags, the bench's ``--rules`` and the app's rule
selector and sliders all read ``RULES``. ``make_rule(name, **params)`` builds one by name (or
alias) from the parameters it takes; ``Param`` gives each parameter's default and the range a
slider offers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

__all__ = [
    "Q_EPS",
    "RuleInputs",
    "AcceptanceRule",
    "StandardRule",
    "EARSRule",
    "GreedyRule",
    "TypicalRule",
    "EntropyEARSRule",
    "rule_from_name",
    "Param",
    "RuleSpec",
    "RULES",
    "register_rule",
    "make_rule",
    "rule_spec",
]

Q_EPS = 1e-10  # the division guard on the draft probability (seed 000, section 3.3)
RESIDUAL_EPS = 1e-6  # a residual with less mass than this is treated as empty


@dataclass(frozen=True)
class Param:
    """A number a rule takes: its default, and the range (and step) a slider offers."""

    name: str
    default: float
    low: float
    high: float
    help: str = ""
    step: float = 0.01


@dataclass(frozen=True)
class RuleSpec:
    """A registered rule: its name, aliases, a label for people, the class and its parameters."""

    name: str
    label: str
    cls: type
    params: tuple[Param, ...] = ()
    aliases: tuple[str, ...] = ()
    summary: str = ""

    def build(self, **values: Any) -> "AcceptanceRule":
        """An instance from the parameters this rule takes (others in ``values`` are ignored;
        a missing one takes its default)."""
        kwargs = {p.name: float(values[p.name]) if values.get(p.name) is not None else p.default
                  for p in self.params}
        return self.cls(**kwargs)


RULES: dict[str, RuleSpec] = {}  # name -> spec, in registration order


def register_rule(name: str, *, label: str, params: tuple[Param, ...] = (), aliases: tuple[str, ...] = (),
                  summary: str = "") -> Callable[[type], type]:
    """Class decorator: add a rule to the registry every front end reads."""

    def add(cls: type) -> type:
        taken = {n for spec in RULES.values() if spec.name != name for n in (spec.name, *spec.aliases)}
        clash = taken & {name, *aliases}
        if clash:
            raise ValueError(f"rule name(s) {sorted(clash)} already registered: pick another name")
        RULES[name] = RuleSpec(name, label, cls, tuple(params), tuple(aliases), summary or (cls.__doc__ or "").split("\n")[0])
        return cls

    return add


def rule_spec(name: str) -> RuleSpec:
    """The spec registered under ``name`` or one of its aliases (any case)."""
    key = str(name).strip().lower()
    for spec in RULES.values():
        if key == spec.name or key in spec.aliases:
            return spec
    raise ValueError(f"unknown rule {name!r}; choose one of: {', '.join(RULES)}")


def make_rule(name: str, **params: Any) -> "AcceptanceRule":
    """A rule by registered name or alias, from the parameters it takes (see ``RuleSpec.build``)."""
    return rule_spec(name).build(**params)


BETA = Param("beta", 0.1, 0.0, 1.0, "tolerance scale, >= 0 (0 = the ordinary rule)")


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

    def describe(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


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

    def decide(self, x: RuleInputs, tolerance: Tensor) -> tuple[Tensor, Tensor]:
        accepted = x.draft_tokens == x.target_probs.argmax(dim=-1)
        return accepted, torch.zeros_like(accepted)

    @staticmethod
    def _one_hot_argmax(probs: Tensor) -> Tensor:
        top = probs.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(probs).scatter_(-1, top, 1.0)

    def acceptance_prob(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor) -> Tensor:
        return self._one_hot_argmax(target_probs)

    def residual(self, target_probs: Tensor, draft_probs: Tensor) -> Tensor:
        return self._one_hot_argmax(target_probs)

    def bonus(self, target_probs: Tensor) -> Tensor:
        return self._one_hot_argmax(target_probs)


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


def rule_from_name(name: str, beta: float = 0.1) -> AcceptanceRule:
    """A registered rule by name, with ``beta`` for the rules that take one (``make_rule``)."""
    return make_rule(name, beta=beta)
