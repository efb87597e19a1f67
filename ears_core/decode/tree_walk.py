"""verify_tree's walk on the host: the same verdict, with only the tests the route reaches.

Terms (route, test, residual, next token: verify_tree.py)
-----
why          ``verify_tree`` tests every node as if the walk reached it, all ranks at once, and pays
             for residuals and tests of nodes the route never reaches: a few hundred small tensor
             operations a round. Right after a target pass each of them costs two to three times its
             usual time on a CPU (its data is out of cache), while a host read costs nothing there. So
             on the CPU the tree decode loop walks the route itself: from the root, each child in
             rank order gets its test (tree_step.judge_child on views of the entry's residual), the
             walk reads the verdict and goes down or on, and a residual is computed only after a
             rejection, for the next sibling or the next token.
equality     the tests, residuals and draws are the ones ``verify_tree`` makes for the nodes on the
             route (``tests/test_tree_walk.py`` checks them field by field); nodes off the route are
             NOT_EVALUATED in both and carry the plain ratio p / q.
greedy       (a rule with ``argmax_only``) one argmax over V per entry, read to the host at once; a child
             stands iff its token is its entry's argmax, and the next token is the argmax where the walk
             stops: no rule call and no residual.
rows         one row at a time (B = 1 in the decode loop); the tree shape is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ears_core.decode.next_token import draw_after
from ears_core.decode.tree_step import entry_values, judge_child, sibling_residual
from ears_core.decode.verify import DraftKind
from ears_core.decode.verify_tree import TreeVerdict, check_tree_drafts, children, children_table, depths, node_values
from ears_core.rules import AcceptanceRule
from ears_core.rules.tree_distortion import path_distortions

__all__ = ["walk_tree"]


@dataclass
class _Walk:
    """What every entry's tests read (one call of ``walk_tree``), and the host-side kinds and path it writes."""

    target_probs: Tensor  # (B, N+1, V)
    draft_probs: Tensor  # (B, N, V)
    tokens: Tensor  # (B, N), clamped into [0, V)
    rule: AcceptanceRule
    uniforms: Tensor  # (B, N)
    sample_uniforms: Tensor  # (B, D+1)
    kids: list[list[int]]
    max_p: Tensor  # (B, N+1)
    tol_e: Tensor  # (B, N+1)
    p_all: Tensor  # (B, N)
    q_all: Tensor  # (B, N)
    ratio: Tensor  # (B, N): a tested node's ratio replaces the plain one
    top: Tensor | None  # (B, N+1) the first maxima (greedy), else None
    tops: list[list[int]] | None  # top on the host (greedy)
    toks: list[list[int]] | None  # tokens on the host (greedy)
    kinds: list[list[int]]  # (B, N) DraftKind values
    path: list[list[int]]  # (B, D) the node accepted at each depth, -1 below the stop


def _test_children(w: _Walk, r: int, cur: int, ch: list[int], at: Tensor) -> tuple[int | None, Tensor, Tensor | None]:
    """Entry ``cur``'s children in rank order until one stands: (the child that stood or None, the residual
    the last test faced (V,), the last tested child's draft probabilities (V,); None when greedy)."""
    res, went, q_c = at, None, None
    for j, c in enumerate(ch):
        if w.tops is not None:  # greedy: no residuals; the plain ratio stays
            if w.toks[r][c] == w.tops[r][cur]:
                w.kinds[r][c], went = int(DraftKind.ACCEPTED), c
                break
            w.kinds[r][c] = int(DraftKind.REJECTED)
            continue
        q_c = w.draft_probs[r, c]  # (V,)
        acc, par, w.ratio[r, c] = judge_child(w.rule, res, q_c, w.tokens[r, c], w.p_all[r, c], w.q_all[r, c],
                                              w.max_p[r, cur], w.tol_e[r, cur], w.uniforms[r, c], first=j == 0)
        a, pa = bool(acc), bool(par)  # the walk's host read (free on the CPU)
        if a or pa:
            w.kinds[r][c] = int(DraftKind.ACCEPTED if a else DraftKind.PARDONED)
            went = c
            break
        w.kinds[r][c] = int(DraftKind.REJECTED)
        if j + 1 < len(ch):
            res = sibling_residual(w.rule, res, q_c)  # (V,) what the next sibling faces
    return went, res, q_c


def _walk_row(w: _Walk, r: int) -> tuple[int, Tensor, bool, int, Tensor, Tensor]:
    """Row r from the root down to its stop: (nodes accepted, next token, bonus?, the last rejected node or -1,
    P_target and the rank-0 draft probability of the next token)."""
    cur, stops = 0, 0  # current entry; nodes accepted so far
    while True:
        ch = w.kids[cur]
        at = w.target_probs[r, cur]  # (V,) P_target at the entry
        if not ch:  # a leaf: the bonus token
            u = w.sample_uniforms[r, stops]
            tok = w.top[r, cur] if w.tops is not None else draw_after(w.rule, at, None, True, u)
            return stops, tok, True, -1, at[tok], at.new_zeros(())
        went, res, q_c = _test_children(w, r, cur, ch, at)
        if went is None:  # every child rejected: the next token from the residual after the last one
            u = w.sample_uniforms[r, stops]
            tok = w.top[r, cur] if w.tops is not None else draw_after(w.rule, res, q_c, False, u)
            return stops, tok, False, ch[-1], at[tok], w.draft_probs[r, ch[0], tok]
        w.path[r][stops] = went
        stops += 1
        cur = went + 1


def walk_tree(target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, parents: Sequence[int], rule: AcceptanceRule,
              *, uniforms: Tensor, sample_uniforms: Tensor, with_distortion: bool = False, siblings: str = "sampled",
              draft_support: Tensor | None = None, check: bool = True) -> TreeVerdict:
    """``verify_tree`` with the same arguments (draws given), walked on the host (module terms)."""
    parents = list(parents)
    b, n = tokens.shape
    dev, v = target_probs.device, target_probs.shape[2]
    depth = max(depths(parents), default=0)
    kids = children(parents)
    max_p, top, tol_e = entry_values(rule, target_probs)  # (B, N+1) each; top: greedy's first maxima, else None
    tops, toks = (top.tolist(), tokens.tolist()) if top is not None else (None, None)  # greedy: the walk reads ids
    parent_entry, p_all, q_all, ratio = node_values(target_probs, draft_probs, tokens, parents)  # ratio: replaced when tested
    if check and n > 0:
        check_tree_drafts(tokens, q_all, v, top is not None)
    tokens = tokens.clamp(0, max(v - 1, 0))  # an id outside [0, V) already reads p = 0: rejected, never token 0's test
    if sample_uniforms.dim() == 1:
        sample_uniforms = sample_uniforms[:, None].expand(b, depth + 1)  # (B, D+1): one draw, whatever the stop depth
    w = _Walk(target_probs, draft_probs, tokens, rule, uniforms, sample_uniforms, kids, max_p, tol_e, p_all, q_all,
              ratio, top, tops, toks, kinds=[[int(DraftKind.NOT_EVALUATED)] * n for _ in range(b)],
              path=[[-1] * depth for _ in range(b)])
    num, nxt, bonus, last_rej, next_p, next_q = zip(*(_walk_row(w, r) for r in range(b)))
    num_accepted = torch.tensor(num, dtype=torch.long, device=dev)
    next_token = torch.stack(nxt).to(torch.long)
    is_bonus = torch.tensor(bonus, device=dev)
    path = torch.tensor(w.path, dtype=torch.long, device=dev).reshape(b, depth)  # (B, D)
    distortion = exact = None
    if with_distortion:
        table = children_table(parents, dev, kids)
        distortion, exact = path_distortions(rule, target_probs, draft_probs, tokens, table, tol_e, path, num_accepted,
                                             is_bonus, siblings, draft_support)
    return TreeVerdict(
        num_accepted=num_accepted, path=path, next_token=next_token, is_bonus=is_bonus,
        last_rejected=torch.tensor(last_rej, dtype=torch.long, device=dev),
        kinds=torch.tensor(w.kinds, dtype=torch.int8, device=dev).reshape(b, n), p=p_all, q=q_all,
        ratio=ratio, u=uniforms, tolerance=tol_e[:, parent_entry], max_p=max_p, next_p=torch.stack(next_p),
        next_q=torch.stack(next_q), distortion=distortion, distortion_exact=exact,
    )
