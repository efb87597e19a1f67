"""One step of a tree walk: a child's test against the residual it faces, and the residual its next sibling faces.

Terms (entry, rank, test, residual: verify_tree.py)
-----
child        node c of entry e, of rank j: tried after its j earlier siblings were rejected.
faced        (..., V) the residual r_j the child is tested against: P_target at e for rank 0, else the residual
             after its earlier siblings (``sibling_residual``).
test         ``rule.decide`` with K = 1 on p = r_j(x) (P_target(x) at e for rank 0; a token id outside [0, V) reads
             p = 0 at every rank), q = the child's draft probability q(x), ratio p / max(q, Q_EPS), the entry's max
             P_target and tolerance, and the child's own acceptance draw U.
argmax test  on the argmax path (greedy) a child stands iff its token is the entry's first maximum: no residual.
entry        per entry, once a round: max P_target, the argmax (greedy) and the rule's tolerance (``entry_values``).
shapes       the leading shape L of a call is free: () for one child (tree_walk, on the host), (B,) for one child
             per row (device_walk), (B, m) for the m children of one rank (verify_tree). Every tree verifier calls
             these, so they decide alike, child for child.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ears_core.decode.verify import argmax_path
from ears_core.rules import Q_EPS, AcceptanceRule, RuleInputs

__all__ = ["entry_values", "judge_child", "sibling_residual", "argmax_stands"]


def entry_values(rule: AcceptanceRule, target_probs: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
    """target_probs (B, N+1, V) -> max P_target per entry (B, N+1), the first maxima on the argmax path (B, N+1)
    (else None), and the rule's tolerance per entry (B, N+1): one ``rule.tolerance`` call for a tree with nodes,
    none for a tree with none (a rule that records a value a round, ears-budget's beta, records none for a round
    that drafted nothing, as in a chain)."""
    max_p, top = torch.max(target_probs, dim=-1) if argmax_path(rule) else (target_probs.amax(dim=-1), None)
    tol_e = rule.tolerance(target_probs, max_p) if target_probs.shape[1] > 1 else torch.zeros_like(max_p)
    return max_p, top, tol_e


def judge_child(rule: AcceptanceRule, faced: Tensor, q_child: Tensor, x: Tensor, p0: Tensor, qx: Tensor, max_p: Tensor,
                tolerance: Tensor, u: Tensor, first: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The test of children (module terms), leading shape L. faced (*L, V), q_child (*L, V) the child's draft
    distribution, x (*L) its token (clamped into [0, V)), p0 (*L) P_target(x) at the entry (0 for an id outside
    [0, V)), qx (*L) q(x), max_p and tolerance (*L) the entry's, u (*L) the acceptance draw; ``first``: rank 0.
    -> accepted, pardoned (*L) bool, the ratio as tested (*L)."""
    p = p0 if first else faced.gather(-1, x.unsqueeze(-1)).squeeze(-1) * (p0 > 0)  # (*L) r_j(x)
    ratio = p / qx.clamp(min=Q_EPS)  # (*L)
    lead = x.dim()

    def one(t: Tensor) -> Tensor:  # (*L, ...) -> (M, 1, ...): one child per rule call row (K = 1)
        return t.reshape(-1, 1, *t.shape[lead:])

    acc, par = rule.decide(RuleInputs(one(faced), one(q_child), one(x), one(p), one(qx), one(ratio), one(max_p),
                                      one(u)), one(tolerance))
    return acc.reshape(x.shape), par.reshape(x.shape), ratio


def sibling_residual(rule: AcceptanceRule, faced: Tensor, q_child: Tensor, rejected: Tensor | None = None) -> Tensor:
    """(..., V) the residual the next sibling faces after a child tested against ``faced`` with draft distribution
    ``q_child`` (..., V) was rejected: ``rule.residual(faced, q_child)``; with ``rejected`` (...,) bool, ``faced``
    unchanged where the child was not rejected."""
    after = rule.residual(faced, q_child)
    return after if rejected is None else after.where(rejected.unsqueeze(-1), faced)


def argmax_stands(x: Tensor, top_at_entry: Tensor, p0: Tensor) -> Tensor:
    """The argmax test (module terms): x, top_at_entry (the entry's first maximum), p0 (*L) -> (*L) bool."""
    return (x == top_at_entry) & (p0 > 0)
