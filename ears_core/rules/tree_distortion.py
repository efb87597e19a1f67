"""The distortion of a tree entry: the exact distribution of the token an entry emits, marginal over
its children's draws, and its total-variation distance to P_target (per emitted position of a tree round).

Terms (entry, rank, residual, route: decode/verify_tree.py; emit, a, res: distortion.py)
-----
fixed siblings     the children were drawn once each, in rank order: the entry emits child j if every
                   earlier child was rejected and j is accepted against the residual it faces.
sampled siblings   the children are drawn without replacement from the parent's draft distribution: the
                   emitted distribution sums over the orders of the draws, enumerated rank by rank.
histories          after i draws, the tokens drawn so far, each order with its weight; a rank keeps
                   ``MAX_STATES`` // V of them (V tokens each), in order (those of weight 0 after them), and
                   a flag says whether that was all (else the bound). Where a host read is free (``reads``:
                   the host walks) only the route's entries that need it are enumerated, and only while one
                   of them goes on; without reads (the device tree round) every position and rank is: the same
                   histories in the same order, so the same sums to the last bit, at fixed shapes.
exact / bound      exact for fixed siblings, one child, lossless ratio rules, and sampled siblings whose
                   histories all fit; otherwise an upper bound from the coupling with the ordinary rule,
                   which differs only after a pardon: pardon_1 + (m - 1) * reject_1 * tolerance (1 for a rule
                   that is not a ratio rule).
fixed shapes       with no reads every tensor's shape follows from V, the tree's width and ``MAX_STATES``,
                   never from the data: every case (one child, the bound, a zero tolerance) is computed and
                   chosen with ``torch.where``, and every position of the route is computed (those past its end
                   dropped), gathered by tensor index: no host read, so the device tree round computes it before
                   its one read (decode/device_tree.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ears_core.rules.base import Q_EPS, AcceptanceRule, is_ratio_rule

__all__ = ["MAX_STATES", "node_emitted_distribution", "path_distortions"]

MAX_STATES = 1 << 18  # sibling-order enumeration limit: histories x vocabulary
LEFT_EPS = 1e-12  # draft mass left below which no sibling follows
CHUNK = 8  # entries computed at once (each holds up to MAX_STATES values per tensor)


def _accept(rule: AcceptanceRule, r: Tensor, q: Tensor, tol: Tensor) -> Tensor:
    """(..., V) acceptance probability of every token under residual r and draft q, tol (...): one rule call
    with every leading position its own row (K = 1: a rule that looks along the positions sees none)."""
    flat = lambda t: t.reshape(-1, 1, t.shape[-1])  # noqa: E731
    return rule.acceptance_prob(flat(r), flat(q), tol.expand(r.shape[:-1]).reshape(-1, 1))[:, 0].reshape(r.shape)


def _fixed(rule: AcceptanceRule, p: Tensor, toks: Tensor, probs: Tensor, m: Tensor, tol: Tensor) -> Tensor:
    """(E, V) emitted of E entries whose first m (E,) children, toks (E, W) with probs (E, W, V), were drawn
    once each in rank order."""
    w, r, emit = p.new_ones(p.shape[0]), p, torch.zeros_like(p)  # (E,), (E, V), (E, V)
    for j in range(toks.shape[1]):
        on = j < m  # (E,)
        a = _accept(rule, r, probs[:, j], tol).gather(1, toks[:, j: j + 1])[:, 0] * on  # (E,)
        emit = emit.scatter_add(1, toks[:, j: j + 1], (w * a)[:, None])
        r = torch.where(on[:, None], rule.residual(r, probs[:, j]), r)
        w = w * (1 - a)
    return emit + w[:, None] * r


def _sampled(rule: AcceptanceRule, p: Tensor, q0: Tensor, m: Tensor, tol: Tensor, width: int, max_states: int,
             reads: bool) -> tuple[Tensor, Tensor]:
    """(E, V) emitted of E entries whose m (E,) children were drawn without replacement from q0 (E, V), and
    (E,) bool: every history fit (module terms: histories)."""
    e, v = p.shape
    cap = max_states // v  # the most histories a rank keeps
    w, r, q = p.new_ones(e, 1), p[:, None], q0[:, None]  # (E, H), (E, H, V), (E, H, V)
    emit, whole = torch.zeros_like(p), torch.ones(e, dtype=torch.bool, device=p.device)
    for i in range(width):
        a = _accept(rule, r, q, tol[:, None])  # (E, H, V)
        rej = w[..., None] * q * (1 - a)  # reach rank i + 1 after drawing x at rank i
        left = 1.0 - q  # draft mass left once x is removed
        more = i + 1 < width
        if more:
            cand = (rej > 0).flatten(1) & (left > LEFT_EPS).flatten(1)  # (E, H V) histories that go on
            count = cand.sum(1)  # (E,)
            whole = whole & ((count <= cap) | (m <= i + 1))
            if reads and not bool(whole.any()):  # every entry past the limit: the bound, whatever it emits
                break
        r_next = rule.residual(r, q)  # does not depend on x
        done = torch.where((m == i + 1)[:, None, None], rej, rej * (left <= LEFT_EPS))  # no sibling follows
        step = (w[..., None] * q * a).sum(1) + (done.sum(-1, keepdim=True) * r_next).sum(1)  # (E, V)
        emit = emit + step * (i < m)[:, None]
        if not more:
            break
        if reads and not bool((whole & (m > i + 1)).any()):  # no entry goes on (module terms: histories)
            break
        h_v = cand.shape[1]
        h = min(cap, h_v)  # as many as there may be: the same sums whoever calls (a sum's rounding follows its length)
        order = torch.arange(h_v, device=p.device) + (~cand) * h_v  # the histories first, in order
        idx = order.topk(h, dim=1, largest=False).indices  # (E, H')
        hist, x = idx // v, idx % v
        kept = cand.gather(1, idx)
        w = torch.where(kept, rej.flatten(1).gather(1, idx), 0.0)  # (E, H'): padding weighs 0
        rows = hist[..., None].expand(-1, -1, v)
        r = r_next.gather(1, rows)
        left_x = torch.where(kept, left.flatten(1).gather(1, idx), 1.0)  # (E, H') the mass left once x is removed
        q = q.gather(1, rows).scatter(2, x[..., None], 0.0) / left_x[..., None]
    return emit, whole


def _bound(rule: AcceptanceRule, p: Tensor, q: Tensor, tol: Tensor, m: Tensor) -> Tensor:
    """(E,) the coupling bound for m sampled siblings under a ratio rule (module terms): pardon_1 +
    (m - 1) * reject_1 * tol, from P_target p and the parent's draft q (E, V) (tokens where q = 0 add nothing)."""
    a0 = torch.where(p > 0, (p / q.clamp(min=Q_EPS)).clamp(max=1.0), torch.zeros_like(p))
    a = _accept(rule, p, q, tol)
    pardon_1, reject_1 = (q * (a - a0)).sum(-1), 1.0 - (q * a0).sum(-1)
    return (pardon_1 + (m - 1) * reject_1 * tol).clamp(max=1.0)


def _compressed(p: Tensor, toks: Tensor, probs: Tensor, support: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A ratio rule's view of entries on the draft's support: the N supported tokens and one bucket (last) for
    every other token. Outside the support q = 0, so every residual is P_target there times one factor, and
    acceptance never applies: the bucket carries their mass exactly, and |emitted - P_target| summed over them is
    the bucket's. p (E, V), toks (E, W), probs (E, W, V) -> (E, N+1), toks as indices into the support, (E, W, N+1)."""
    ps = p.gather(1, support.expand(p.shape[0], -1))  # (E, N): a gather (an index on the last dim is slow)
    t = torch.cat([ps, (1.0 - ps.sum(-1, keepdim=True)).clamp(min=0.0)], dim=1)
    q = torch.cat([probs.gather(2, support.expand(*probs.shape[:2], -1)), probs.new_zeros(*probs.shape[:2], 1)], dim=2)
    return t, torch.searchsorted(support, toks), q


def _entries(rule: AcceptanceRule, p: Tensor, toks: Tensor, probs: Tensor, m: Tensor, tol: Tensor, siblings: str,
             support: Tensor | None, max_states: int, reads: bool) -> tuple[Tensor, Tensor]:
    """(E,) float64 distortion and (E,) bool exact of E entries: P_target p (E, V), their first m (E,) children
    toks (E, W) (clamped into V) with draft probabilities probs (E, W, V) (sampled siblings: (E, 1, V), the
    parent's), tolerance tol (E,). With ``reads`` only the entries that need it are enumerated (module terms:
    histories)."""
    ratio = is_ratio_rule(rule)
    easy = ((m == 1) | (tol == 0)) if ratio else torch.zeros_like(m, dtype=torch.bool)  # closed form, or lossless
    some: Tensor | slice = (~easy).nonzero().squeeze(1) if reads else slice(None)  # the entries enumerated
    dist, whole = torch.zeros_like(tol, dtype=torch.float64), torch.ones_like(easy)
    if not reads or some.numel():
        target, toks_e, rows, m_e, tol_e = p[some].double(), toks[some], probs[some].double(), m[some], tol[some].double()
        if ratio and support is not None:
            target, toks_e, rows = _compressed(target, toks_e, rows, support)
        if siblings == "fixed":
            emit, fit = _fixed(rule, target, toks_e, rows, m_e, tol_e), torch.ones_like(m_e, dtype=torch.bool)
        else:
            emit, fit = _sampled(rule, target, rows[:, 0], m_e, tol_e, toks.shape[1], max_states, reads)
        tv = 0.5 * (emit - target).abs().sum(-1)  # (E',)
        dist[some] = torch.where(fit, tv, _bound(rule, target, rows[:, 0], tol_e, m_e) if ratio else 1.0)
        whole[some] = fit
    if not ratio:
        return dist, whole
    one: Tensor | slice = (m == 1).nonzero().squeeze(1) if reads else slice(None)  # one child: the closed form
    dist[one] = torch.where(m[one] == 1, rule.exact_distortion(p[one, None], probs[one, :1], tol[one, None].to(p.dtype),
                                                               support)[:, 0].double(), dist[one])
    return torch.where(tol == 0, 0.0, dist), whole | easy  # the ordinary rule: lossless


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
    p, tol, m = target.double()[None], tolerance.double().reshape(1), child_tokens.shape[0]
    if m == 0:
        return rule.bonus(p[0])
    m_t = torch.full((1,), m, dtype=torch.long, device=p.device)
    if siblings == "fixed":
        return _fixed(rule, p, child_tokens[None], child_probs.double()[None], m_t, tol)[0]
    emit, whole = _sampled(rule, p, child_probs[0].double()[None], m_t, tol, m, max_states, reads=True)
    return emit[0] if bool(whole[0]) else None


def path_distortions(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, ch: Tensor,
                     tol_e: Tensor, path: Tensor, num_accepted: Tensor, is_bonus: Tensor, siblings: str,
                     support: Tensor | None = None, reads: bool = True) -> tuple[Tensor, Tensor]:
    """Per emitted position of each row's route: (B, D+1) float64 distortion and (B, D+1) bool exact, on the
    input's device. ``ch`` (N+1, W): each entry's children (verify_tree.children_table; -1 for none); ``tol_e``
    (B, N+1) per entry. A bonus position is 0 and exact. ``reads`` (module terms: histories): False computes every
    position with no host read (fixed shapes); True, where a read is free, the route's positions only."""
    b, depth = path.shape
    dev = target_probs.device
    pos = torch.arange(depth + 1, device=dev)
    emitted = (pos <= num_accepted[:, None]) & ~((pos == num_accepted[:, None]) & is_bonus[:, None])  # (B, D+1)
    dist = torch.zeros(b * (depth + 1), dtype=torch.float64, device=dev)  # (E,) E = B (D+1)
    exact = torch.ones(b * (depth + 1), dtype=torch.bool, device=dev)
    if tokens.shape[1] == 0:  # no children anywhere: every position is a bonus
        return dist.reshape(b, depth + 1), exact.reshape(b, depth + 1)
    entries = torch.cat([path.new_zeros(b, 1), path + 1], dim=1).reshape(-1)  # (E,) past the route's end: 0
    rows = torch.arange(b, device=dev).repeat_interleave(depth + 1)  # (E,)
    kids = ch[entries]  # (E, W)
    kids = kids.gather(1, (kids < 0).to(torch.uint8).argsort(dim=1, stable=True))  # the children first
    m, x = (kids >= 0).sum(1), kids.clamp(min=0)  # (E,), (E, W)
    todo = emitted.reshape(-1).nonzero().squeeze(1) if reads else torch.arange(entries.shape[0], device=dev)
    for c in range(0, todo.shape[0], CHUNK):
        t = todo[c: c + CHUNK]
        r, e = rows[t], entries[t]
        drawn = x[t] if siblings == "fixed" else x[t, :1]  # sampled siblings: the parent's distribution only
        dist[t], exact[t] = _entries(rule, target_probs[r, e], tokens[r[:, None], x[t]], draft_probs[r[:, None], drawn],
                                     m[t], tol_e[r, e], siblings, support, MAX_STATES, reads)
    return torch.where(emitted, dist.reshape(b, depth + 1), 0.0), exact.reshape(b, depth + 1) | ~emitted
