"""The distortion of a tree entry: the exact distribution of the token an entry emits, marginal over
its children's draws, and its total-variation distance to P_target (per emitted position of a tree round).

Terms (entry, rank, residual, route: decode/verify_tree.py; emit, a, res: distortion.py)
-----
fixed siblings     the children were drawn once each, in rank order: the entry emits child j if every
                   earlier child was rejected and j is accepted against the residual it faces.
sampled siblings   the children are drawn without replacement from the parent's draft distribution: the
                   emitted distribution sums over the orders of the draws, enumerated rank by rank. The
                   histories after i draws (the tokens drawn so far, each with its order's weight) are kept
                   while they number at most ``MAX_STATES`` // V (V tokens each).
exact / bound      exact for fixed siblings, one child, lossless ratio rules, and sampled siblings whose
                   histories all fit; otherwise an upper bound from the coupling with the ordinary rule,
                   which differs only after a pardon: pardon_1 + (m - 1) * reject_1 * tolerance (1 for a rule
                   that is not a ratio rule).
fixed shapes       every tensor's shape follows from V, the tree's width and ``MAX_STATES``, never from the
                   data: a rank keeps the ``MAX_STATES`` // V heaviest histories (padded with histories of
                   weight 0), a flag says whether that was all of them, and every case (one child, the bound,
                   a zero tolerance) is computed and chosen with ``torch.where``. The route's entries are
                   gathered by tensor index, the positions past its end computed and dropped: no host read,
                   so the device tree round computes it before its one read (decode/device_tree.py).
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


def _sampled(rule: AcceptanceRule, p: Tensor, q0: Tensor, m: Tensor, tol: Tensor, width: int, max_states: int
             ) -> tuple[Tensor, Tensor]:
    """(E, V) emitted of E entries whose m (E,) children were drawn without replacement from q0 (E, V), and
    (E,) bool: every history fit (module terms: fixed shapes)."""
    e, v = p.shape
    cap = max_states // v
    w, r, q = p.new_ones(e, 1), p[:, None], q0[:, None]  # (E, H), (E, H, V), (E, H, V)
    emit, whole = torch.zeros_like(p), torch.ones(e, dtype=torch.bool, device=p.device)
    for i in range(width):
        a = _accept(rule, r, q, tol[:, None])  # (E, H, V)
        rej = w[..., None] * q * (1 - a)  # reach rank i + 1 after drawing x at rank i
        r_next = rule.residual(r, q)  # does not depend on x
        left = 1.0 - q  # draft mass left once x is removed
        done = torch.where((m == i + 1)[:, None, None], rej, rej * (left <= LEFT_EPS))  # no sibling follows
        step = (w[..., None] * q * a).sum(1) + (done.sum(-1, keepdim=True) * r_next).sum(1)  # (E, V)
        emit = emit + step * (i < m)[:, None]
        if i + 1 == width:
            break
        cand = (rej > 0) & (left > LEFT_EPS)  # (E, H, V) histories that go on
        whole = whole & ((cand.flatten(1).sum(1) <= cap) | (m <= i + 1))
        h_v = cand[0].numel()
        idx = (rej.masked_fill(~cand, -1.0).flatten(1).topk(cap, dim=1).indices if cap < h_v
               else torch.arange(h_v, device=p.device).expand(e, h_v))  # (E, H') the heaviest first
        hist, x = idx // v, idx % v
        kept = cand.flatten(1).gather(1, idx)
        w = torch.where(kept, rej.flatten(1).gather(1, idx), 0.0)  # (E, H'): padding weighs 0
        rows = hist[..., None].expand(-1, -1, v)
        r = r_next.gather(1, rows)
        q = q.gather(1, rows).scatter(2, x[..., None], 0.0) / torch.where(kept, left.flatten(1).gather(1, idx), 1.0)[..., None]
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
    t = torch.cat([p[:, support], (1.0 - p[:, support].sum(-1, keepdim=True)).clamp(min=0.0)], dim=1)
    q = torch.cat([probs[..., support], probs.new_zeros(*probs.shape[:2], 1)], dim=2)
    return t, torch.searchsorted(support, toks), q


def _entries(rule: AcceptanceRule, p: Tensor, toks: Tensor, probs: Tensor, m: Tensor, tol: Tensor, siblings: str,
             support: Tensor | None, max_states: int) -> tuple[Tensor, Tensor]:
    """(E,) float64 distortion and (E,) bool exact of E entries: P_target p (E, V), their first m (E,) children
    toks (E, W) (clamped into V) with draft probabilities probs (E, W, V), tolerance tol (E,)."""
    ratio = is_ratio_rule(rule)
    closed = (rule.exact_distortion(p[:, None], probs[:, :1], tol[:, None].to(p.dtype), support)[:, 0].double()
              if ratio else None)  # one child, in closed form
    target, probs, tol = p.double(), probs.double(), tol.double()
    if ratio and support is not None:
        target, toks, probs = _compressed(target, toks, probs, support)
    if siblings == "fixed":
        emit, whole = _fixed(rule, target, toks, probs, m, tol), torch.ones_like(m, dtype=torch.bool)
    else:
        emit, whole = _sampled(rule, target, probs[:, 0], m, tol, toks.shape[1], max_states)
    dist = 0.5 * (emit - target).abs().sum(-1)  # (E,)
    if not ratio:
        return torch.where(whole, dist, 1.0), whole
    dist = torch.where(whole, dist, _bound(rule, target, probs[:, 0], tol, m))
    dist = torch.where(tol == 0, 0.0, torch.where(m == 1, closed, dist))  # the ordinary rule: lossless
    return dist, whole | (m == 1) | (tol == 0)


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
    emit, whole = _sampled(rule, p, child_probs[0].double()[None], m_t, tol, m, max_states)
    return emit[0] if bool(whole[0]) else None


def path_distortions(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, ch: Tensor,
                     tol_e: Tensor, path: Tensor, num_accepted: Tensor, is_bonus: Tensor, siblings: str,
                     support: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per emitted position of each row's route: (B, D+1) float64 distortion and (B, D+1) bool exact, on the
    input's device with no host read (module terms: fixed shapes). ``ch`` (N+1, W): each entry's children
    (verify_tree.children_table; -1 for none); ``tol_e`` (B, N+1) per entry. A bonus position is 0 and exact."""
    b, depth = path.shape
    dev = target_probs.device
    if tokens.shape[1] == 0 or b == 0:  # no children anywhere: every position is a bonus
        return (torch.zeros((b, depth + 1), dtype=torch.float64, device=dev),
                torch.ones((b, depth + 1), dtype=torch.bool, device=dev))
    entries = torch.cat([path.new_zeros(b, 1), path + 1], dim=1).reshape(-1)  # (E,) E = B (D+1); past the end: 0
    rows = torch.arange(b, device=dev).repeat_interleave(depth + 1)  # (E,)
    kids = ch[entries]  # (E, W)
    kids = kids.gather(1, (kids < 0).to(torch.uint8).argsort(dim=1, stable=True))  # the children first
    m = (kids >= 0).sum(1)  # (E,)
    x = kids.clamp(min=0)
    dist, exact = [], []
    for c in range(0, rows.shape[0], CHUNK):
        s = slice(c, c + CHUNK)
        r = rows[s]
        d, ex = _entries(rule, target_probs[r, entries[s]], tokens[r[:, None], x[s]], draft_probs[r[:, None], x[s]],
                         m[s], tol_e[r, entries[s]], siblings, support, MAX_STATES)
        dist.append(d)
        exact.append(ex)
    pos = torch.arange(depth + 1, device=dev)
    emitted = (pos <= num_accepted[:, None]) & ~((pos == num_accepted[:, None]) & is_bonus[:, None])  # (B, D+1)
    dist_t, exact_t = torch.cat(dist).reshape(b, depth + 1), torch.cat(exact).reshape(b, depth + 1)
    return torch.where(emitted, dist_t, 0.0), exact_t | ~emitted
