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
             from P_target at e (beta * (1 - max P_target) for EARS). One function makes it for every
             tree verifier (tree_step.judge_child; here, tree_walk.py and device_walk.py).
residual     r_0 = P_target at e; after rank j is rejected r_{j+1} = rule.residual(r_j, q_j)
             (tree_step.sibling_residual), i.e.
             norm(max(0, r_j - q_j)). A rejected token has r_{j+1}(x) = 0, so drawing later
             siblings without replacement loses nothing, and under the ordinary rule the token an
             entry emits is distributed exactly as P_target (recursive rejection sampling:
             SpecInfer / SpecTr, and RSD for siblings drawn without replacement).
next token   where the walk stops: drawn after the last child's rejection, from the residual it leaves, if
             the entry had children (a *resampled* token), else from rule.bonus(P_target) at the leaf (the
             *bonus* token); the one draw of every path (next_token.draw_after).
greedy       GreedyRule accepts a child iff it is the target's argmax: the route is the deepest
             path of target argmaxes and the next token is the argmax where it ends.
emitted      the distribution of the token an entry emits, marginal over its children's draws
             (rules/tree_distortion.py); distortion = TV(emitted, P_target) per emitted position,
             exact or an upper bound (``distortion_exact`` says which).
checks       as verify(): a draft id outside [0, V) or a drafted token with q = 0 is a ValueError
             naming it (``check``, one host read); unchecked, an id outside [0, V) reads p = 0 and is
             rejected, never taken for token 0.

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

from ears_core.decode.next_token import draw_after
from ears_core.decode.tree_step import entry_values, argmax_stands, judge_child, sibling_residual
from ears_core.decode.verify import DraftKind, check_drafts, default_draws
from ears_core.draft.trees import children, children_table  # noqa: F401 - re-exported: the tree verifiers' structure
from ears_core.rules import Q_EPS, AcceptanceRule
from ears_core.rules.tree_distortion import path_distortions

__all__ = ["TreeVerdict", "verify_tree", "children", "children_table", "depths", "node_values", "check_tree_drafts"]


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


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth (1 for the root's children)."""
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


def node_values(target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, parents: Sequence[int] | Tensor
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each node's parent entry (N,), and (B, N) each: P_target(x) at the parent's entry, the node's
    draft probability q(x), and p / q (the ratio reported for a node never tested). ``parents``: N ints, or the
    parent entries (N,) long on the device where the caller has them (no tensor made from the list)."""
    b, v = tokens.shape[0], target_probs.shape[2]
    parent_entry = (parents if isinstance(parents, Tensor) else
                    torch.tensor(parents, dtype=torch.long, device=target_probs.device) + 1)  # (N,)
    in_range = (tokens >= 0) & (tokens < v)  # (B, N)
    x = tokens.clamp(0, max(v - 1, 0))  # (B, N): gathers never read outside V
    p = target_probs.reshape(b, -1).gather(1, parent_entry * v + x)  # (B, N): entry e's row starts at e V
    p = p.masked_fill(~in_range, 0.0)  # an id outside [0, V) reads p = 0, which no rule accepts
    q = draft_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # (B, N)
    return parent_entry, p, q, p / q.clamp(min=Q_EPS)


def check_tree_drafts(tokens: Tensor, q: Tensor, vocab: int, greedy: bool = False) -> None:
    """Refuse draft ids outside [0, V) and drafted tokens with q = 0 (verify()'s guard): one host read.
    ``greedy``: q is not checked (a greedy tree's later siblings are the draft's runners-up, and its
    distribution at T = 0 is one-hot; the argmax test never reads q)."""
    check_drafts(tokens, torch.ones_like(q) if greedy else q, (tokens >= 0) & (tokens < vocab), vocab)


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
    check: bool = True,
) -> TreeVerdict:
    """Decide B rows of one tree shape at once; see the module docstring.

    target_probs (B, N+1, V): P_target at the root then after each node; draft_probs (B, N, V);
    tokens (B, N) long; parents: N ints (-1 for the root's children, else an earlier node; siblings
    in rank order). ``uniforms`` (B, N): each node's acceptance draw; ``sample_uniforms`` (B,), or
    (B, D+1) with one draw per depth the walk may stop at. Missing draws come from ``generator``.
    ``siblings``: "sampled" or "fixed", as the tree was built (used only for the distortion).
    ``draft_support`` (N,) ascending: the token ids outside which draft_probs is 0 (a drafter's
    ``support``): a ratio rule's distortion is then enumerated over N + 1 values instead of V.
    ``check``: refuse draft ids outside [0, V) and drafted tokens with q = 0 (one host read).
    """
    parents = parents.tolist() if isinstance(parents, Tensor) else list(parents)
    b, n, v = _check(target_probs, draft_probs, tokens, parents)
    dev = target_probs.device
    kids = children(parents)
    uniforms, sample_uniforms = default_draws(uniforms, sample_uniforms, (b, n), generator, dev)
    ch = children_table(parents, dev, kids)  # (N+1, W)
    max_p, top, tol_e = entry_values(rule, target_probs)  # (B, N+1) each; top: greedy's first maxima, else None
    parent_entry, p_all, q_all, plain_ratio = node_values(target_probs, draft_probs, tokens, parents)
    if check and n > 0:
        check_tree_drafts(tokens, q_all, v, top is not None)
    x = tokens.clamp(0, max(v - 1, 0))  # (B, N): ids for the gathers (an id outside V already has p = 0)

    # 1. every node's test, as if the walk reached it; 2. the route; 3. which nodes were tested
    stands, pardoned, ratio, res_at = _node_tests(rule, target_probs, draft_probs, x, kids, parent_entry, p_all, q_all,
                                                  plain_ratio, max_p, tol_e, uniforms, top)
    path, cur, has, first = _route(stands, ch, max(depths(parents), default=0))
    num_accepted = (path >= 0).sum(dim=-1)  # (B,)
    rank = torch.tensor([kids[p + 1].index(i) for i, p in enumerate(parents)], dtype=torch.long, device=dev)  # (N,)
    kinds, tested = _kinds(stands, pardoned, path, ch, has, first, rank, parent_entry)
    ratio = torch.where(tested, ratio, plain_ratio)

    # 4. the next token: from the residual after the stop entry's last child, or a bonus at a leaf
    leaf, last_rej, next_token, next_p, next_q = _at_the_stop(rule, target_probs, draft_probs, res_at, ch, cur, rank,
                                                              num_accepted, sample_uniforms, top)
    distortion = exact = None
    if with_distortion:
        distortion, exact = path_distortions(rule, target_probs, draft_probs, x, ch, tol_e, path, num_accepted, leaf,
                                             siblings, draft_support)
    return TreeVerdict(
        num_accepted=num_accepted, path=path, next_token=next_token, is_bonus=leaf, last_rejected=last_rej,
        kinds=kinds.to(torch.int8), p=p_all, q=q_all, ratio=ratio, u=uniforms, tolerance=tol_e[:, parent_entry],
        max_p=max_p, next_p=next_p, next_q=next_q, distortion=distortion, distortion_exact=exact,
    )


def _at_the_stop(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor, res_at: Tensor | None, ch: Tensor,
                 cur: Tensor, rank: Tensor, num_accepted: Tensor, sample_uniforms: Tensor, top: Tensor | None
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """At each row's stop entry ``cur`` (B,): leaf? (B,) bool, the last rejected node (B,) (-1 at a leaf), the
    next token (B,), its P_target (B,) and its rank-0 draft probability there (B,) (0 at a leaf)."""
    b, n, v = draft_probs.shape
    n_kids = (ch >= 0).sum(-1)  # (N+1,)
    leaf = n_kids[cur] == 0  # (B,)
    last_rej = torch.where(leaf, -1, ch[cur, (n_kids[cur] - 1).clamp(min=0)])  # (B,)
    next_token, next_p = _next_token(rule, target_probs, draft_probs, res_at, cur, leaf, last_rej, rank, num_accepted,
                                     sample_uniforms, top)
    if n > 0:  # the rank-0 draft distribution at the stop, at the next token
        q0 = draft_probs.reshape(b, n * v).gather(1, (ch[cur, 0].clamp(min=0) * v + next_token).unsqueeze(-1)).squeeze(-1)
        next_q = torch.where(leaf, 0.0, q0)
    else:
        next_q = torch.zeros_like(next_p)
    return leaf, last_rej, next_token, next_p, next_q


def _node_tests(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, kids: list[list[int]],
                parent_entry: Tensor, p_all: Tensor, q_all: Tensor, plain_ratio: Tensor, max_p: Tensor, tol_e: Tensor,
                uniforms: Tensor, top: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Every node's test as if the walk reached it: the residual a rank-j child faces depends only on its
    entry and its earlier siblings, so the tests of one rank run at once (tree_step.judge_child, K = 1 per node).
    -> stands, pardoned (B, N) bool, ratio (B, N) as tested, res_at (B, N, V) the residual a rank >= 1 node
    faces (None for greedy: a node stands iff it is its entry's argmax)."""
    b, n = tokens.shape
    v, dev = target_probs.shape[2], target_probs.device
    ratio = plain_ratio.clone()  # (B, N)
    pardoned = torch.zeros((b, n), dtype=torch.bool, device=dev)
    if top is not None:
        return argmax_stands(tokens, top[:, parent_entry], p_all), pardoned, ratio, None  # (B, N)
    stands = torch.zeros((b, n), dtype=torch.bool, device=dev)
    res_at = target_probs.new_empty((b, n, v))  # (B, N, V)
    for j, (ents, nodes) in enumerate(_rank_lists(kids)):
        e_t, c_t = torch.tensor(ents, device=dev), torch.tensor(nodes, device=dev)
        res = (res_at if j else target_probs).index_select(1, c_t if j else e_t)  # (B, m, V) the residual faced
        qd = draft_probs.index_select(1, c_t)  # (B, m, V)
        acc, par, r = judge_child(rule, res, qd, tokens[:, c_t], p_all[:, c_t], q_all[:, c_t], max_p[:, e_t],
                                  tol_e[:, e_t], uniforms[:, c_t], first=j == 0)  # (B, m) each
        stands[:, c_t], pardoned[:, c_t] = acc | par, par & ~acc
        ratio[:, c_t] = r
        nxt_ents = [i for i, e in enumerate(ents) if len(kids[e]) > j + 1]  # entries with a rank j + 1 child
        if nxt_ents:
            sel = torch.tensor(nxt_ents, device=dev)
            res_at.index_copy_(1, torch.tensor([kids[ents[i]][j + 1] for i in nxt_ents], device=dev),
                               sibling_residual(rule, res.index_select(1, sel), qd.index_select(1, sel)))
    return stands, pardoned, ratio, res_at


def _route(stands: Tensor, ch: Tensor, depth: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The walk: from the root, the first standing child of each entry, depth by depth.
    -> path (B, D) (-1 past its end), cur (B,) the stop entry, has (B, N+1) some child stands, first (B, N+1)
    the rank of the first that stands."""
    b, n = stands.shape
    rows = torch.arange(b, device=stands.device)
    valid = ch >= 0  # (N+1, W)
    padded = torch.cat([stands, stands.new_zeros((b, 1))], dim=1)  # (B, N+1): column N stands for 'no child'
    s = padded[:, torch.where(valid, ch, n)]  # (B, N+1, W)
    has = s.any(-1)  # (B, N+1)
    first = s.to(torch.uint8).argmax(-1)  # (B, N+1)
    goes_to = ch.expand(b, -1, -1).gather(-1, first.unsqueeze(-1)).squeeze(-1)  # (B, N+1) node walked to
    cur = torch.zeros(b, dtype=torch.long, device=stands.device)  # (B,) current entry
    path = torch.full((b, depth), -1, dtype=torch.long, device=stands.device)
    for d in range(depth):
        moved, node = has[rows, cur], goes_to[rows, cur]  # (B,): rows that stopped before stay: none stands there
        path[:, d] = torch.where(moved, node, -1)
        cur = torch.where(moved, node + 1, cur)
    return path, cur, has, first


def _kinds(stands: Tensor, pardoned: Tensor, path: Tensor, ch: Tensor, has: Tensor, first: Tensor, rank: Tensor,
           parent_entry: Tensor) -> tuple[Tensor, Tensor]:
    """Which nodes were tested (children of an entry on the route, up to the first that stood) and each
    node's DraftKind. -> kinds (B, N) long, tested (B, N) bool."""
    b, n = stands.shape
    dev = stands.device
    on_route = torch.zeros((b, n + 1), dtype=torch.bool, device=dev)
    on_route[:, 0] = True
    on_route.scatter_(1, path.clamp(min=-1) + 1, True)  # path -1 marks entry 0, already on the route
    reach = torch.where(has, first, (ch >= 0).sum(-1) - 1)  # (B, N+1) the last rank tested at each entry
    tested = on_route[:, parent_entry] & (rank <= reach[:, parent_entry])  # (B, N)
    kinds = torch.where(stands, torch.where(pardoned, int(DraftKind.PARDONED), int(DraftKind.ACCEPTED)),
                        int(DraftKind.REJECTED))
    return torch.where(tested, kinds, int(DraftKind.NOT_EVALUATED)), tested


def _next_token(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor, res_at: Tensor | None, cur: Tensor,
                leaf: Tensor, last_rej: Tensor, rank: Tensor, num_accepted: Tensor, sample_uniforms: Tensor,
                top: Tensor | None) -> tuple[Tensor, Tensor]:
    """The token where the walk stopped: the argmax (greedy), else ``next_token.draw_after`` on the residual the
    stop entry's last child faced, or on the rule's bonus at a leaf. -> next_token, next_p (B,) each."""
    b, n1, v = target_probs.shape
    if top is not None:
        next_token = top.gather(1, cur.unsqueeze(-1)).squeeze(-1)  # (B,)
        next_p = target_probs.reshape(b, n1 * v).gather(1, (cur * v + next_token).unsqueeze(-1)).squeeze(-1)
        return next_token, next_p
    at = _pick(target_probs, cur)  # (B, V)
    if sample_uniforms.dim() == 2:  # (B, D+1): the draw that belongs to the stop depth
        sample_uniforms = sample_uniforms.gather(1, num_accepted.unsqueeze(-1)).squeeze(-1)
    if n1 > 1:
        lr = last_rej.clamp(min=0)
        faced = torch.where((rank[lr] == 0)[:, None] | leaf[:, None], at, _pick(res_at, lr))  # (B, V)
        next_token = draw_after(rule, faced, _pick(draft_probs, lr), leaf, sample_uniforms)  # (B,)
    else:
        next_token = draw_after(rule, at, None, True, sample_uniforms)
    return next_token, at.gather(-1, next_token.unsqueeze(-1)).squeeze(-1)
