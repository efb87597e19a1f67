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
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ears_core.sampling import first_argmax, sample_with_uniforms, search_cdf

__all__ = [
    "Q_EPS",
    "RuleInputs",
    "AcceptanceRule",
    "StandardRule",
    "EARSRule",
    "GreedyRule",
    "verifying_rule",
    "TypicalRule",
    "EntropyEARSRule",
    "FLyRule",
    "BudgetEARSRule",
    "rule_from_name",
    "is_ratio_rule",
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
    argmax_only: bool = False  # decides and emits by the target's argmax alone (verify's greedy path)

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

    def draw_residual(self, target_probs: Tensor, draft_probs: Tensor, u: Tensor) -> Tensor:
        """One token from ``residual(target_probs, draft_probs)`` (V,), (V,) with the draw u (): the same
        inverse-CDF draw as ``sample_with_uniforms(residual(...), u)``. For the ratio rule's residual it
        searches max(0, p - q) unnormalised: three passes over V instead of eight, and one host read of
        its mass (is it empty?), so it is for the CPU path that reads the verdict anyway."""
        if type(self).residual is not AcceptanceRule.residual:
            return sample_with_uniforms(self.residual(target_probs, draft_probs), u)
        cdf = (target_probs - draft_probs).clamp_(min=0.0).cumsum(dim=-1)  # (V,) residual mass so far
        if float(cdf[-1]) <= RESIDUAL_EPS:  # no residual mass: P_target itself, as ``residual`` gives
            return sample_with_uniforms(target_probs, u)
        return search_cdf(cdf, u)

    def emitted(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor) -> Tensor:
        """(B, K, V) distribution of the token one verified position emits:
        emit(y) = q(y) a(y) + (1 - sum_x q(x) a(x)) res(y), a = ``acceptance_prob``."""
        a = self.acceptance_prob(target_probs, draft_probs, tolerance)  # (B, K, V)
        kept = draft_probs * a  # (B, K, V)
        reject_mass = (1.0 - kept.sum(dim=-1, keepdim=True)).clamp(min=0.0)  # (B, K, 1)
        return kept + reject_mass * self.residual(target_probs, draft_probs)

    def exact_distortion(self, target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor,
                         support: Tensor | None = None) -> Tensor:
        """(B, K, V), (B, K, V), (B, K) -> (B, K): TV(emitted, P_target) at each verified position.
        ``support`` (N,) token ids outside which draft_probs is 0, if known (drafters.py).

        For a ratio rule (``is_ratio_rule``: only ``tolerance()`` is its own) it is the closed form
            sum over x with 0 < p(x) < q(x) of min(q(x) - p(x), t q(x))
        (t the position's tolerance): a token the draft over-proposes is emitted with probability
        min(q, p + t q) instead of p, and the excess comes out of the residual's tokens, so the TV is
        the excess: a few passes over V instead of the emitted distribution's dozen. It equals the
        enumeration (``emitted``) whenever the residual has mass (else the two differ by less than
        RESIDUAL_EPS) and is at most t. Other rules enumerate."""
        if is_ratio_rule(self):
            if support is not None:  # a token the draft never proposes has no excess: sum over N, not V
                idx = support.expand(*target_probs.shape[:-1], -1)  # (B, K, N): gather (index_select on the last dim is slow)
                target_probs, draft_probs = target_probs.gather(-1, idx), draft_probs.gather(-1, idx)
            excess = torch.minimum(draft_probs - target_probs, draft_probs * tolerance.unsqueeze(-1)).clamp_(min=0.0)
            return excess.masked_fill_(target_probs <= 0, 0.0).sum(dim=-1)  # (B, K)
        return 0.5 * (self.emitted(target_probs, draft_probs, tolerance) - target_probs).abs().sum(dim=-1)

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
    slack never grows and beta stays at the start-up value. ``betas`` lists the beta of each round.
    """

    name = "ears-budget"
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
        if self.epsilon == 0 or max_p.shape[-1] == 0:
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


def rule_from_name(name: str, beta: float = 0.1) -> AcceptanceRule:
    """A registered rule by name, with ``beta`` for the rules that take one (``make_rule``)."""
    return make_rule(name, beta=beta)
