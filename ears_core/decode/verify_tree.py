"""verify_tree(): accept / pardon / reject over a draft tree, vectorised over rows and nodes.

Terms (node, entry, rank and sibling draws are defined in trees.py)
-----
route        the verifier's walk: from the root, the children of the current entry are tested in
             rank order; the first that stands becomes the current entry and the walk goes one
             level deeper; when none stands, or the entry has no children, the walk stops there.
test         child x of entry e, tried after ranks < j were rejected, gets the chain's test
             (rules.py: ``rule.decide``) with p = r_j(x), the current residual target, q = the
             child's draft_probs(x) (the distribution it was drawn from, given its earlier
             siblings), U its own acceptance draw, and the rule's tolerance at e, computed once
             from P_target at e (beta * (1 - max P_target) for EARS).
residual     r_0 = P_target at e; after rank j is rejected r_{j+1} = rule.residual(r_j, q_j), i.e.
             norm(max(0, r_j - q_j)). A rejected token has r_{j+1}(x) = 0, so drawing later
             siblings without replacement loses nothing, and under the ordinary rule the token an
             entry emits is distributed exactly as P_target (recursive rejection sampling:
             SpecInfer / SpecTr, and RSD for siblings drawn without replacement).
next token   where the walk stops: drawn from the last residual if the entry had children (a
             *resampled* token), else from rule.bonus(P_target) at the leaf (the *bonus* token).
greedy       GreedyRule accepts a child iff it is the target's argmax: the route is the deepest
             path of target argmaxes and the next token is the argmax where it ends.
emitted      the distribution of the token an entry emits, marginal over its children's draws
             (``node_emitted_distribution``); distortion = TV(emitted, P_target) per emitted
             position. Exact for fixed siblings, one child, lossless ratio rules, and sampled
             siblings whose orders are few enough to enumerate; otherwise an upper bound from the
             coupling with the ordinary rule, which differs only after a pardon:
             pardon_1 + (m - 1) * reject_1 * tolerance (``distortion_exact`` says which).

How it runs: the residual a rank-j child faces depends only on its entry and its earlier siblings,
not on the route, so every node's test is computed first, one rank at a time for all entries at
once (each node its own rule call with K = 1); then the route is walked depth by depth over (B,)
tensors (the first standing child of each entry), and the tested nodes are those on the route's
entries up to the first that stood. Loops run over rank and depth only (no loop over rows, nodes
or the vocabulary, no host sync), and a V-sized tensor is copied only by index_select. The tree's
structure (parents) is shared by the B rows; tokens and probabilities may differ per row.
Distortion, when asked, loops over emitted positions on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ears_core.rules import Q_EPS, AcceptanceRule, RuleInputs, is_ratio_rule
from ears_core.sampling import sample_with_uniforms
from ears_core.decode.verify import DraftKind

__all__ = ["TreeVerdict", "verify_tree", "node_emitted_distribution", "children_table"]

MAX_STATES = 1 << 18  # sibling-order enumeration limit: histories x vocabulary


@dataclass
class TreeVerdict:
    """What verify_tree() decided; every field is a tensor on the input device."""

    num_accepted: Tensor  # (B,) long: nodes on the accepted path
    path: Tensor  # (B, D) long: the accepted node at each depth, -1 past the path's end
    next_token: Tensor  # (B,) long: resampled (or bonus) token where the walk stopped
    is_bonus: Tensor  # (B,) bool: the walk ended at a leaf (no test there)
    last_rejected: Tensor  # (B,) long: the last child rejected where the walk stopped, -1 for a bonus
    kinds: Tensor  # (B, N) int8 DraftKind per node
    p: Tensor  # (B, N) P_target(x) at the parent's entry
    q: Tensor  # (B, N) draft_probs(x)
    ratio: Tensor  # (B, N) r_j(x) / max(q, 1e-10) as tested (p / q for nodes never tested)
    u: Tensor  # (B, N) acceptance draws
    tolerance: Tensor  # (B, N) the rule's tolerance at the parent's entry
    max_p: Tensor  # (B, N + 1) max P_target per entry
    next_p: Tensor  # (B,) P_target(next_token) at its entry
    next_q: Tensor  # (B,) the entry's rank-0 draft probability of next_token (0 for a bonus)
    distortion: Tensor | None  # (B, D + 1) TV(emitted, P_target) per emitted position, if asked
    distortion_exact: Tensor | None  # (B, D + 1) bool: exact (else an upper bound)


def _children(parents: Sequence[int]) -> list[list[int]]:
    """The children of each entry (0: the root, i + 1: node i) in rank order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i)
    return kids


def children_table(parents: Sequence[int], device: torch.device | None = None,
                   kids: list[list[int]] | None = None) -> Tensor:
    """(N + 1, W) long: the children of each entry in rank order, -1 padded (W >= 1)."""
    kids = _children(parents) if kids is None else kids
    w = max(1, max(len(k) for k in kids))
    table = torch.full((len(kids), w), -1, dtype=torch.long)
    for e, k in enumerate(kids):
        table[e, : len(k)] = torch.tensor(k, dtype=torch.long)
    return table.to(device) if device is not None else table


def _depths(parents: Sequence[int]) -> list[int]:
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def _check(target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, parents: Sequence[int]) -> tuple[int, int, int]:
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"tokens must be (B, N) long, got {tuple(tokens.shape)} {tokens.dtype}")
    b, n = tokens.shape
    if len(parents) != n or any(not -1 <= p < i for i, p in enumerate(parents)):
        raise ValueError("parents must list N parent indices, each -1 (the root) or an earlier node")
    if target_probs.dim() != 3 or target_probs.shape[:2] != (b, n + 1):
        raise ValueError(f"target_probs must be (B, N+1, V) = ({b}, {n + 1}, V): the root, then every node")
    v = target_probs.shape[2]
    if draft_probs.shape != (b, n, v):
        raise ValueError(f"draft_probs must be (B, N, V) = ({b}, {n}, {v}), got {tuple(draft_probs.shape)}")
    return b, n, v


def node_values(target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, parents: Sequence[int]
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each node's parent entry (N,), and (B, N) each: P_target(x) at the parent's entry, the node's
    draft probability q(x), and p / q (the ratio reported for a node never tested)."""
    b, v = tokens.shape[0], target_probs.shape[2]
    parent_entry = torch.tensor(parents, dtype=torch.long, device=target_probs.device) + 1  # (N,)
    p = target_probs.reshape(b, -1).gather(1, parent_entry * v + tokens)  # (B, N): entry e's row starts at e V
    q = draft_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, N)
    return parent_entry, p, q, p / q.clamp(min=Q_EPS)


def _too_many_orders(rule: AcceptanceRule, p: Tensor, q: Tensor, tol: Tensor, width: int, max_states: int) -> bool:
    """Would enumerating sampled siblings' orders pass ``max_states``? The histories after the first
    draw (tokens drawn with q > 0 and rejected with mass left to redraw) times ``width`` values each:
    p, q (1, V') and tol as ``node_emitted_distribution`` reads them."""
    first = q * (1 - _accept(rule, p, q, tol))  # (1, V') the first draw's rejection mass, token by token
    return int(((first > 0) & (1.0 - q > 1e-12)).sum()) * width > max_states


def _pick(t: Tensor, idx: Tensor) -> Tensor:
    """t (B, E, V), idx (B,) -> (B, V): row b's entry idx[b] (a copy by index_select, not advanced indexing)."""
    b, e, v = t.shape
    return t.reshape(b * e, v).index_select(0, torch.arange(b, device=t.device) * e + idx)


def _rank_lists(kids: list[list[int]]) -> list[tuple[list[int], list[int]]]:
    """Per rank j: (entries with more than j children, their rank-j child), in entry order."""
    width = max((len(k) for k in kids), default=0)
    return [([e for e, k in enumerate(kids) if len(k) > j], [k[j] for k in kids if len(k) > j])
            for j in range(width)]


def verify_tree(
    target_probs: Tensor,
    draft_probs: Tensor,
    tokens: Tensor,
    parents: Sequence[int] | Tensor,
    rule: AcceptanceRule,
    generator: torch.Generator | None = None,
    *,
    uniforms: Tensor | None = None,
    sample_uniforms: Tensor | None = None,
    with_distortion: bool = False,
    siblings: str = "sampled",
    draft_support: Tensor | None = None,
) -> TreeVerdict:
    """Decide B rows of one tree shape at once; see the module docstring.

    target_probs (B, N+1, V): P_target at the root then after each node; draft_probs (B, N, V);
    tokens (B, N) long; parents: N ints (-1 for the root's children, else an earlier node; siblings
    in rank order). ``uniforms`` (B, N): each node's acceptance draw; ``sample_uniforms`` (B,), or
    (B, D+1) with one draw per depth the walk may stop at. Missing draws come from ``generator``.
    ``siblings``: "sampled" or "fixed", as the tree was built (used only for the distortion).
    ``draft_support`` (N,) ascending: the token ids outside which draft_probs is 0 (a drafter's
    ``support``): a ratio rule's distortion is then enumerated over N + 1 values instead of V.
    """
    parents = parents.tolist() if isinstance(parents, Tensor) else list(parents)
    b, n, v = _check(target_probs, draft_probs, tokens, parents)
    dev = target_probs.device
    depth = max(_depths(parents), default=0)
    kids = _children(parents)
    if uniforms is None:
        uniforms = torch.rand((b, n), generator=generator, device=dev)
    if sample_uniforms is None:
        sample_uniforms = torch.rand((b,), generator=generator, device=dev)
    ch = children_table(parents, dev, kids)  # (N+1, W)
    rows = torch.arange(b, device=dev)

    max_p, top = torch.max(target_probs, dim=-1) if rule.argmax_only else (target_probs.amax(dim=-1), None)  # (B, N+1) each
    tol_e = rule.tolerance(target_probs, max_p)  # (B, N+1)
    flat_tp = target_probs.reshape(b, (n + 1) * v)  # (B, (N+1) V): entry e's row starts at e V
    parent_entry, p_all, q_all, plain_ratio = node_values(target_probs, draft_probs, tokens, parents)
    ratio = plain_ratio.clone()  # (B, N) r_j(x) / q as each node would be tested

    # 1. Every node's test, as if the walk reached it: the residual a rank-j child faces depends
    #    only on its entry and its earlier siblings, so the tests of one rank run at once.
    stands = torch.zeros((b, n), dtype=torch.bool, device=dev)
    pardoned = torch.zeros((b, n), dtype=torch.bool, device=dev)
    if top is not None:  # greedy: a node stands iff it is its entry's argmax; no residuals
        stands = tokens == top[:, parent_entry]  # (B, N)
    res_at = target_probs.new_empty((b, n, v)) if top is None else None  # (B, N, V) the residual a rank >= 1 node faces
    for j, (ents, nodes) in enumerate(_rank_lists(kids) if top is None else []):
        e_t, c_t = torch.tensor(ents, device=dev), torch.tensor(nodes, device=dev)
        m = len(nodes)
        res = (res_at if j else target_probs).index_select(1, c_t if j else e_t)  # (B, m, V) the residual faced
        qd = draft_probs.index_select(1, c_t)  # (B, m, V)
        x = tokens[:, c_t]  # (B, m)
        p = res.gather(-1, x.unsqueeze(-1)).squeeze(-1) if j else p_all[:, c_t]  # (B, m)
        q = q_all[:, c_t]
        r = p / q.clamp(min=Q_EPS)
        flat = lambda t: t.reshape(b * m, 1, *t.shape[2:])  # noqa: E731  one node per rule call (K = 1)
        inputs = RuleInputs(flat(res), flat(qd), flat(x), flat(p), flat(q), flat(r), flat(max_p[:, e_t]),
                            flat(uniforms[:, c_t]))
        acc, par = (t.reshape(b, m) for t in rule.decide(inputs, flat(tol_e[:, e_t])))
        stands[:, c_t], pardoned[:, c_t] = acc | par, par & ~acc
        ratio[:, c_t] = r
        nxt_ents = [i for i, e in enumerate(ents) if len(kids[e]) > j + 1]  # entries with a rank j + 1 child
        if nxt_ents:
            sel = torch.tensor(nxt_ents, device=dev)
            res_at.index_copy_(1, torch.tensor([kids[ents[i]][j + 1] for i in nxt_ents], device=dev),
                               rule.residual(res.index_select(1, sel), qd.index_select(1, sel)))

    # 2. The walk: from the root, the first standing child of each entry, depth by depth.
    valid = ch >= 0  # (N+1, W)
    padded = torch.cat([stands, stands.new_zeros((b, 1))], dim=1)  # (B, N+1): column N stands for 'no child'
    s = padded[:, torch.where(valid, ch, n)]  # (B, N+1, W)
    has = s.any(-1)  # (B, N+1): some child of this entry stands
    first = s.to(torch.uint8).argmax(-1)  # (B, N+1) rank of the first that stands
    goes_to = ch.expand(b, -1, -1).gather(-1, first.unsqueeze(-1)).squeeze(-1)  # (B, N+1) node walked to
    cur = torch.zeros(b, dtype=torch.long, device=dev)  # (B,) current entry
    path = torch.full((b, depth), -1, dtype=torch.long, device=dev)
    for d in range(depth):
        moved, node = has[rows, cur], goes_to[rows, cur]  # (B,): rows that stopped before stay: none stands there
        path[:, d] = torch.where(moved, node, -1)
        cur = torch.where(moved, node + 1, cur)
    num_accepted = (path >= 0).sum(dim=-1)  # (B,)

    # 3. Which nodes were tested: children of an entry on the route, up to the first that stood.
    on_route = torch.zeros((b, n + 1), dtype=torch.bool, device=dev)
    on_route[:, 0] = True
    on_route.scatter_(1, path.clamp(min=-1) + 1, True)  # path -1 marks entry 0, already on the route
    n_kids = valid.sum(-1)  # (N+1,)
    reach = torch.where(has, first, n_kids - 1)  # (B, N+1) the last rank tested at each entry
    rank = torch.tensor([kids[p + 1].index(i) for i, p in enumerate(parents)], dtype=torch.long, device=dev)
    tested = on_route[:, parent_entry] & (rank <= reach[:, parent_entry])  # (B, N)
    kinds = torch.where(stands, torch.where(pardoned, int(DraftKind.PARDONED), int(DraftKind.ACCEPTED)),
                        int(DraftKind.REJECTED))
    kinds = torch.where(tested, kinds, int(DraftKind.NOT_EVALUATED))
    ratio = torch.where(tested, ratio, plain_ratio)

    # 4. The next token: from the residual after the stop entry's last child, or a bonus at a leaf.
    leaf = n_kids[cur] == 0  # (B,)
    last_rej = torch.where(leaf, -1, ch[cur, (n_kids[cur] - 1).clamp(min=0)])  # (B,)
    is_bonus = leaf
    if top is not None:  # greedy: the argmax where the walk stopped
        next_token = top.gather(1, cur.unsqueeze(-1)).squeeze(-1)  # (B,)
        next_p = flat_tp.gather(1, (cur * v + next_token).unsqueeze(-1)).squeeze(-1)
    else:
        at = _pick(target_probs, cur)  # (B, V)
        if n > 0:
            lr = last_rej.clamp(min=0)
            faced = torch.where((rank[lr] == 0)[:, None], at, _pick(res_at, lr))  # (B, V) residual the last one faced
            after = rule.residual(faced, _pick(draft_probs, lr))  # (B, V)
            stop_dist = torch.where(leaf[:, None], rule.bonus(at), after)
        else:
            stop_dist = rule.bonus(at)
        if sample_uniforms.dim() == 2:  # (B, D+1): the draw that belongs to the stop depth
            sample_uniforms = sample_uniforms.gather(1, num_accepted.unsqueeze(-1)).squeeze(-1)
        next_token = sample_with_uniforms(stop_dist, sample_uniforms)  # (B,)
        next_p = at.gather(-1, next_token.unsqueeze(-1)).squeeze(-1)
    if n > 0:  # the rank-0 draft distribution at the stop, at the next token
        q0 = draft_probs.reshape(b, n * v).gather(1, (ch[cur, 0].clamp(min=0) * v + next_token).unsqueeze(-1)).squeeze(-1)
        next_q = torch.where(is_bonus, 0.0, q0)
    else:
        next_q = torch.zeros_like(next_p)

    distortion = exact = None
    if with_distortion:
        distortion, exact = _distortions(rule, target_probs, draft_probs, tokens, ch, tol_e, path,
                                         num_accepted, is_bonus, siblings, draft_support)
    return TreeVerdict(
        num_accepted=num_accepted, path=path, next_token=next_token, is_bonus=is_bonus, last_rejected=last_rej,
        kinds=kinds.to(torch.int8), p=p_all, q=q_all, ratio=ratio, u=uniforms, tolerance=tol_e[:, parent_entry],
        max_p=max_p, next_p=next_p, next_q=next_q, distortion=distortion, distortion_exact=exact,
    )


# ----------------------------------------------------------------------------- exact emission


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


def _distortions(rule, target_probs, draft_probs, tokens, ch, tol_e, path, num_accepted, is_bonus, siblings, support=None):
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
