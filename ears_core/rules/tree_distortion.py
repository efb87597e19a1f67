"""The distortion of a tree entry: the exact distribution of the token an entry emits, marginal over
its children's draws, and its total-variation distance to P_target (per emitted position of a tree round).

Terms (entry, rank, residual, route: decode/verify_tree.py; emit, a, res: distortion.py)
-----
fixed siblings     the children were drawn once each, in rank order: the entry emits child j if every
                   earlier child was rejected and j is accepted against the residual it faces.
sampled siblings   the children are drawn without replacement from the parent's draft distribution: the
                   emitted distribution sums over the orders of the draws (enumerated while the histories
                   times the vocabulary stay under ``MAX_STATES``).
exact / bound      exact for fixed siblings, one child, lossless ratio rules, and sampled siblings whose
                   orders are few enough to enumerate; otherwise an upper bound from the coupling with the
                   ordinary rule, which differs only after a pardon: pardon_1 + (m - 1) * reject_1 * tolerance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ears_core.rules.base import Q_EPS, AcceptanceRule, is_ratio_rule

__all__ = ["MAX_STATES", "node_emitted_distribution", "path_distortions"]

MAX_STATES = 1 << 18  # sibling-order enumeration limit: histories x vocabulary


def _too_many_orders(rule: AcceptanceRule, p: Tensor, q: Tensor, tol: Tensor, width: int, max_states: int) -> bool:
    """Would enumerating sampled siblings' orders pass ``max_states``? The histories after the first
    draw (tokens drawn with q > 0 and rejected with mass left to redraw) times ``width`` values each:
    p, q (1, V') and tol as ``node_emitted_distribution`` reads them."""
    first = q * (1 - _accept(rule, p, q, tol))  # (1, V') the first draw's rejection mass, token by token
    return int(((first > 0) & (1.0 - q > 1e-12)).sum()) * width > max_states



def _accept(rule: AcceptanceRule, r: Tensor, q: Tensor, tol: Tensor) -> Tensor:
    """(H, V) acceptance probability of every token under residual r (H, V) and draft q (H, V)."""
    return rule.acceptance_prob(r[:, None], q[:, None], tol.expand(r.shape[0])[:, None])[:, 0]


def node_emitted_distribution(
    rule: AcceptanceRule, target: Tensor, child_tokens: Tensor, child_probs: Tensor, tolerance: Tensor,
    siblings: str = "sampled", max_states: int = MAX_STATES,
) -> Tensor | None:
    """(V,) float64 distribution of the token an entry with these children emits, or None when
    enumerating the orders of sampled siblings would exceed ``max_states``.

    target (V,): P_target at the entry; child_tokens (m,), child_probs (m, V) as in the tree (for
    sampled siblings only child_probs[0], the parent's draft distribution, matters: the children
    are redrawn in every order); tolerance: the rule's tolerance at the entry (0-dim).
    """
    p, tol = target.double(), tolerance.double().reshape(())
    m = int(child_tokens.shape[0])
    emit = torch.zeros_like(p)
    if m == 0:
        return rule.bonus(p)
    if siblings == "fixed":
        w, r = p.new_ones(()), p
        for x, q in zip(child_tokens.tolist(), child_probs.double()):
            a = _accept(rule, r[None], q[None], tol)[0, x]
            emit[x] += w * a
            w, r = w * (1 - a), rule.residual(r, q)
        return emit + w * r
    w, r, q = p.new_ones(1), p[None], child_probs[0].double()[None]  # (H,), (H, V), (H, V)
    if m > 1 and _too_many_orders(rule, r, q, tol, p.shape[0], max_states):  # counted before any of the work
        return None
    for i in range(m):
        a = _accept(rule, r, q, tol)  # (H, V)
        emit += (w[:, None] * q * a).sum(0)
        rej = w[:, None] * q * (1 - a)  # (H, V): reach rank i + 1 after drawing x at rank i
        r_next = rule.residual(r, q)  # (H, V): does not depend on x
        left = 1.0 - q  # (H, V): draft mass left once x is removed
        last = i == m - 1
        done = rej if last else rej * (left <= 1e-12)  # no sibling follows: the residual is drawn
        emit += (done.sum(1)[:, None] * r_next).sum(0)
        if last:
            break
        h, x = ((rej > 0) & (left > 1e-12)).nonzero(as_tuple=True)
        if h.numel() * p.shape[0] > max_states:
            return None
        w, r = rej[h, x], r_next[h]
        q = q[h].clone()
        q[torch.arange(len(h)), x] = 0.0
        q = q / left[h, x][:, None]
    return emit


def _compressed(target: Tensor, toks: Tensor, probs: Tensor, support: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A ratio rule's view of one entry on the draft's support: the N supported tokens and one
    bucket (last) for every other token. Outside the support q = 0, so every residual is P_target
    there times one factor, and acceptance never applies: the bucket carries their mass exactly,
    and |emitted - P_target| summed over them is the bucket's. -> target (N+1,), tokens (m,) as
    indices into the support, probs (m, N+1)."""
    t = torch.cat([target[support], (1.0 - target[support].sum()).clamp(min=0.0)[None]])  # (N+1,)
    q = torch.cat([probs[:, support], probs.new_zeros(probs.shape[0], 1)], dim=1)  # (m, N+1)
    return t, torch.searchsorted(support, toks), q


def _node_distortion(rule: AcceptanceRule, target: Tensor, toks: Tensor, probs: Tensor, tol: Tensor,
                     siblings: str, support: Tensor | None = None) -> tuple[float, bool]:
    ratio_rule, m = is_ratio_rule(rule), toks.shape[0]
    if ratio_rule and float(tol) == 0.0:
        return 0.0, True  # the ordinary rule: lossless by construction
    if ratio_rule and m == 1:  # one child: the chain's position, in closed form
        return float(rule.exact_distortion(target[None, None], probs[:1][None], tol.reshape(1, 1).to(target.dtype), support)), True
    if ratio_rule and support is not None:  # enumerate over the draft's N tokens and one bucket
        if siblings == "sampled":  # first: could the orders be enumerated at all? (node_emitted_distribution's count)
            ps, qs = target[support].double(), probs[0][support].double()  # (N,) the bucket has q = 0: no history
            if _too_many_orders(rule, ps[None], qs[None], tol.double(), len(support) + 1, MAX_STATES):
                return _bound(rule, ps, qs, tol, m), False
        rows = probs if siblings == "fixed" else probs[:1]  # sampled siblings: only the parent's distribution counts
        target, toks, probs = _compressed(target.double(), toks, rows.double(), support)
    emit = node_emitted_distribution(rule, target, toks, probs, tol, siblings, MAX_STATES)
    if emit is not None:
        return float(0.5 * (emit - target.double()).abs().sum()), True
    if not ratio_rule:
        return 1.0, False
    return _bound(rule, target, probs[0], tol, m), False


def _bound(rule: AcceptanceRule, p: Tensor, q: Tensor, tol: Tensor, m: int) -> float:
    """The coupling bound for m sampled siblings under a ratio rule (module terms): pardon_1 +
    (m - 1) * reject_1 * tol, from P_target p and the parent's draft q (the same tokens; tokens
    where q = 0 add nothing, so the draft's support is enough)."""
    p, q = p.double(), q.double()
    a0 = torch.where(p > 0, (p / q.clamp(min=Q_EPS)).clamp(max=1.0), torch.zeros_like(p))
    a = _accept(rule, p[None], q[None], tol.double())[0]
    pardon_1 = float((q * (a - a0)).sum())
    reject_1 = 1.0 - float((q * a0).sum())
    return min(1.0, pardon_1 + (m - 1) * reject_1 * float(tol))


def path_distortions(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, ch: Tensor,
                     tol_e: Tensor, path: Tensor, num_accepted: Tensor, is_bonus: Tensor, siblings: str,
                     support: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per emitted position of each row's route: (B, D+1) float64 distortion and (B, D+1) bool exact.
    ``ch`` (N+1, W): each entry's children (verify_tree.children_table); ``tol_e`` (B, N+1) per entry."""
    b, depth = path.shape
    dist = torch.zeros((b, depth + 1), dtype=torch.float64)
    exact = torch.ones((b, depth + 1), dtype=torch.bool)
    paths, ns, bonus = path.tolist(), num_accepted.tolist(), is_bonus.tolist()
    for row in range(b):
        for e in range(ns[row] + 1):
            if e == ns[row] and bonus[row]:
                continue  # a bonus token: 0, as in the chain
            entry = 0 if e == 0 else paths[row][e - 1] + 1
            kids = ch[entry][ch[entry] >= 0]
            dist[row, e], exact[row, e] = _node_distortion(
                rule, target_probs[row, entry], tokens[row, kids], draft_probs[row, kids], tol_e[row, entry], siblings, support)
    return dist.to(target_probs.device), exact.to(target_probs.device)
