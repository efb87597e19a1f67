"""The distortion maths in one home: the exact distribution one verified position emits under a
rule, and its total-variation distance to P_target (the "exact distortion" events and metrics
report).

Terms (one verified position; p = P_target, q = the draft's distribution, both (..., V))
a(x)        the probability that x is accepted when drafted (``AcceptanceRule.acceptance_prob``)
res(y)      the distribution drawn from after a rejection (``AcceptanceRule.residual``)
emit(y)     q(y) a(y) + (1 - sum_x q(x) a(x)) res(y): drafted and kept, or drawn after a rejection
distortion  TV(emit, p) = 1/2 sum_y |emit(y) - p(y)|; 0 for a lossless rule

The rule classes call these (``AcceptanceRule.emitted``, ``AcceptanceRule.exact_distortion``); this
module knows no rule class.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["RESIDUAL_EPS", "emitted", "tv_distance", "ratio_rule_distortion"]

RESIDUAL_EPS = 1e-6  # a residual with less mass than this is treated as empty


def emitted(draft_probs: Tensor, accept: Tensor, residual: Tensor) -> Tensor:
    """(..., V) q, a, res -> (..., V) emit(y) = q(y) a(y) + (1 - sum_x q(x) a(x)) res(y)."""
    kept = draft_probs * accept  # (..., V)
    reject_mass = (1.0 - kept.sum(dim=-1, keepdim=True)).clamp(min=0.0)  # (..., 1)
    return kept + reject_mass * residual


def tv_distance(probs: Tensor, target_probs: Tensor) -> Tensor:
    """(..., V), (..., V) -> (...,) the total-variation distance 1/2 sum |probs - target_probs|."""
    return 0.5 * (probs - target_probs).abs().sum(dim=-1)


def ratio_rule_distortion(target_probs: Tensor, draft_probs: Tensor, tolerance: Tensor,
                          support: Tensor | None = None) -> Tensor:
    """(B, K, V), (B, K, V), (B, K) -> (B, K): TV(emit, P_target) of the ratio rule with tolerance t,
    in closed form:
        sum over x with 0 < p(x) < q(x) of min(q(x) - p(x), t q(x))
    A token the draft over-proposes is emitted with probability min(q, p + t q) instead of p, and the
    excess comes out of the residual's tokens, so the TV is the excess: a few passes over V instead of
    the emitted distribution's dozen. It equals the enumeration (``tv_distance(emitted(...))``)
    whenever the residual has mass (else the two differ by less than RESIDUAL_EPS) and is at most t.
    ``support`` (N,) token ids outside which draft_probs is 0, if known (drafters.py): a token the
    draft never proposes has no excess, so the sum runs over N, not V."""
    if support is not None:
        idx = support.expand(*target_probs.shape[:-1], -1)  # (B, K, N): gather (index_select on the last dim is slow)
        target_probs, draft_probs = target_probs.gather(-1, idx), draft_probs.gather(-1, idx)
    excess = torch.minimum(draft_probs - target_probs, draft_probs * tolerance.unsqueeze(-1)).clamp_(min=0.0)
    return excess.masked_fill_(target_probs <= 0, 0.0).sum(dim=-1)  # (B, K)
