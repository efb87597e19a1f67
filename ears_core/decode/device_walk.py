"""The tree walk as tensor operations: verify_tree's verdict along the route, with no host read.

Terms (route, test, residual, next token: verify_tree.py; host read: device_round.py; alive: fixed_trees.py)
-----
walk         depth by depth over (B,) tensors: at each row's current entry its children are tested in rank
             order (a Python loop over the tree's width, a handful), each test one ``tree_step.judge_child`` call
             for the B rows on the residual that child faces; the first child that stands becomes the
             row's entry one level deeper. Only the route's tests count (``tree_walk.walk_tree``'s), so a row
             that stopped, a child after the one that stood and a child that is not alive are not tested: their
             kinds stay NOT_EVALUATED and their ratio the plain p / q. Loops run over depth and rank only.
residual     after a rejected child the row's residual is ``tree_step.sibling_residual``; a child that is not
             alive leaves it as it was (``build_tree`` never drew it), so the token after the last alive child is
             drawn from the same residual as ``walk_tree``'s.
next token   where a row stops: the target's argmax on the argmax path; else ``next_token.draw_after`` with the
             row's draw at its stop depth, on the residual the last rejected child faced, or at a leaf.
equality     for the same draws: kinds, ratios, path, next token, next p and q are ``walk_tree``'s (so
             ``verify_tree``'s), field by field (tests/test_device_tree.py).
distortion   when asked, ``rules.tree_distortion.path_distortions`` as in ``walk_tree``, without host reads (its
             fixed shapes); over the children that are alive in every row (exact for B = 1, the decode loop's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ears_core.decode.next_token import draw_after
from ears_core.decode.tree_step import entry_values, argmax_stands, judge_child, sibling_residual
from ears_core.decode.verify import DraftKind
from ears_core.decode.verify_tree import TreeVerdict, children, children_table, depths, node_values
from ears_core.rules import Q_EPS, AcceptanceRule
from ears_core.rules.tree_distortion import path_distortions

__all__ = ["device_walk"]


@dataclass
class _Tree:
    """What every test reads: one call of ``device_walk``."""

    target_probs: Tensor  # (B, N+1, V)
    draft_probs: Tensor  # (B, N, V)
    x: Tensor  # (B, N) tokens clamped into [0, V)
    rule: AcceptanceRule
    uniforms: Tensor  # (B, N)
    alive: Tensor  # (B, N) bool
    ch: Tensor  # (N+1, W) children per entry in rank order, -1 padded
    width: int  # the most children of one entry
    max_p: Tensor  # (B, N+1)
    tol_e: Tensor  # (B, N+1)
    p_all: Tensor  # (B, N)
    q_all: Tensor  # (B, N)
    top: Tensor | None  # (B, N+1) first maxima on the argmax path


@dataclass
class _Stop:
    """Per row, what one entry's tests left: (B,) each, (B, V) for the residuals."""

    went: Tensor  # the child that stood, -1 if none
    stood: Tensor  # bool
    last_rej: Tensor  # the last rejected child, -1 if none
    faced: Tensor  # (B, V) the residual the last rejected child faced
    q_last: Tensor  # (B, V) its draft probabilities


def _at(t: Tensor, idx: Tensor) -> Tensor:
    """t (B, E, ...), idx (B,) -> (B, ...): row b's element idx[b]."""
    return t[torch.arange(t.shape[0], device=t.device), idx]


def _test(t: _Tree, j: int, c: Tensor, cur: Tensor, res: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Child c (B,) of entry cur (B,), rank j, against the residual res (B, V) (tree_step.py): accepted, pardoned
    (B,) bool, its ratio as tested (B,), and its draft probabilities (B, V) (None on the argmax path)."""
    cc = c.clamp(min=0)
    xc, p0, qn = _at(t.x, cc), _at(t.p_all, cc), _at(t.q_all, cc)  # (B,) each
    if t.top is not None:  # greedy: the plain ratio stays
        acc = argmax_stands(xc, _at(t.top, cur), p0)
        return acc, torch.zeros_like(acc), p0 / qn.clamp(min=Q_EPS), None
    q_c = _at(t.draft_probs, cc)  # (B, V)
    acc, par, rat = judge_child(t.rule, res, q_c, xc, p0, qn, _at(t.max_p, cur), _at(t.tol_e, cur), _at(t.uniforms, cc),
                                first=j == 0)
    return acc, par, rat, q_c


def _entry(t: _Tree, cur: Tensor, walking: Tensor, kinds: Tensor, ratio: Tensor) -> _Stop:
    """The tests at each walking row's entry cur (B,), in rank order until one stands; writes kinds and ratio
    (B, N) of the tested children."""
    b = cur.shape[0]
    rows = torch.arange(b, device=cur.device)
    kid = t.ch[cur]  # (B, W)
    res = _at(t.target_probs, cur)  # (B, V) r_0: P_target at the entry
    none = torch.full((b,), -1, dtype=torch.long, device=cur.device)
    st = _Stop(none, torch.zeros(b, dtype=torch.bool, device=cur.device), none, res, torch.zeros_like(res))
    for j in range(t.width):
        c = kid[:, j]  # (B,)
        cc = c.clamp(min=0)
        test = walking & ~st.stood & (c >= 0) & _at(t.alive, cc)  # (B,)
        acc, par, rat, q_c = _test(t, j, c, cur, res)
        stands = acc | par
        kind = torch.where(stands, torch.where(acc, int(DraftKind.ACCEPTED), int(DraftKind.PARDONED)),
                           int(DraftKind.REJECTED))
        kinds[rows, cc] = torch.where(test, kind.to(kinds.dtype), kinds[rows, cc])
        ratio[rows, cc] = torch.where(test, rat, ratio[rows, cc])
        st.went = torch.where(test & stands, c, st.went)
        st.stood = st.stood | (test & stands)
        rej = test & ~stands
        st.last_rej = torch.where(rej, c, st.last_rej)
        if q_c is not None:
            st.faced = torch.where(rej[:, None], res, st.faced)
            st.q_last = torch.where(rej[:, None], q_c, st.q_last)
            if j + 1 < t.width:  # what the next sibling faces
                res = sibling_residual(t.rule, res, q_c, rej)
    return st


def _next(t: _Tree, stop: Tensor, last: _Stop, num_accepted: Tensor, sample_uniforms: Tensor
          ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """At each row's stop entry (B,): leaf? (B,) bool, the next token, its P_target and its rank-0 draft
    probability there (0 at a leaf), (B,) each (module terms: next token)."""
    at = _at(t.target_probs, stop)  # (B, V)
    if t.width == 0:  # no drafts: a draw from the rule's bonus distribution at the root
        tok = _at(t.top, stop) if t.top is not None else draw_after(t.rule, at, None, True, sample_uniforms[:, 0])
        next_p = at.gather(-1, tok[:, None]).squeeze(-1)
        return torch.ones_like(stop, dtype=torch.bool), tok, next_p, torch.zeros_like(next_p)
    kid = t.ch[stop]  # (B, W) the stop entry's children
    lives = (kid >= 0) & t.alive.gather(1, kid.clamp(min=0))  # (B, W)
    leaf = ~lives.any(dim=-1)  # no child alive: a leaf of the tree ``build_tree`` drew
    first = kid.gather(1, lives.to(torch.uint8).argmax(dim=-1, keepdim=True)).squeeze(1)  # (B,) its first alive child
    if t.top is not None:
        tok = _at(t.top, stop)
    else:
        u = sample_uniforms.gather(1, num_accepted[:, None]).squeeze(1)  # (B,) the draw at the stop depth
        tok = draw_after(t.rule, torch.where(leaf[:, None], at, last.faced), last.q_last, leaf, u)
    next_p = at.gather(-1, tok[:, None]).squeeze(-1)
    q0 = _at(t.draft_probs, first.clamp(min=0)).gather(-1, tok[:, None]).squeeze(-1)
    return leaf, tok, next_p, torch.where(leaf, 0.0, q0)


def device_walk(target_probs: Tensor, draft_probs: Tensor, tokens: Tensor, parents: Sequence[int],
                rule: AcceptanceRule, *, uniforms: Tensor, sample_uniforms: Tensor, alive: Tensor | None = None,
                with_distortion: bool = False, siblings: str = "sampled", draft_support: Tensor | None = None,
                tables: Any = None) -> TreeVerdict:
    """``walk_tree``'s verdict with no host read (module terms). target_probs (B, N+1, V),
    draft_probs (B, N, V), tokens (B, N), parents N ints, uniforms (B, N), sample_uniforms (B, D+1) or (B,),
    alive (N,) or (B, N) bool (default: every node); siblings and draft_support as ``verify_tree``'s; ``tables``:
    the tree's structure on the device where the caller has it (fixed_tables.py: its ``children`` and
    ``parent_entry`` are used, no tensor is made from ``parents``)."""
    b, n = tokens.shape
    dev, v = target_probs.device, target_probs.shape[2]
    kids = children(parents)
    depth = max(depths(parents), default=0)
    max_p, top, tol_e = entry_values(rule, target_probs)  # (B, N+1) each; top: greedy's first maxima, else None
    parent_entry, p_all, q_all, plain = node_values(target_probs, draft_probs, tokens,
                                                    parents if tables is None else tables.parent_entry)
    alive = torch.ones((b, n), dtype=torch.bool, device=dev) if alive is None else alive.expand(b, n)
    t = _Tree(target_probs, draft_probs, tokens.clamp(0, max(v - 1, 0)), rule, uniforms, alive,
              children_table(parents, dev, kids) if tables is None else tables.children,
              max((len(k) for k in kids), default=0), max_p, tol_e, p_all, q_all, top)
    if sample_uniforms.dim() == 1:
        sample_uniforms = sample_uniforms[:, None].expand(b, depth + 1)  # (B, D+1)
    kinds = torch.full((b, n), int(DraftKind.NOT_EVALUATED), dtype=torch.int8, device=dev)
    ratio = plain.clone()  # (B, N): a tested node's ratio replaces the plain one
    path = torch.full((b, depth), -1, dtype=torch.long, device=dev)
    cur = torch.zeros(b, dtype=torch.long, device=dev)  # (B,) each row's entry
    walking = torch.ones(b, dtype=torch.bool, device=dev)
    stop, last = cur, None
    for d in range(depth + 1):  # a row at depth D is at a leaf: it stops there
        st = _entry(t, cur, walking, kinds, ratio)
        ends = walking & ~st.stood
        stop = torch.where(ends, cur, stop)
        last = st if last is None else _Stop(last.went, last.stood, torch.where(ends, st.last_rej, last.last_rej),
                                             torch.where(ends[:, None], st.faced, last.faced),
                                             torch.where(ends[:, None], st.q_last, last.q_last))
        goes = walking & st.stood
        if d < depth:
            path[:, d] = torch.where(goes, st.went, -1)
        cur = torch.where(goes, st.went + 1, cur)
        walking = goes
    num_accepted = (path >= 0).sum(dim=-1)  # (B,)
    leaf, next_token, next_p, next_q = _next(t, stop, last, num_accepted, sample_uniforms)
    distortion = exact = None
    if with_distortion:  # host reads of its own (module terms)
        drew = alive.all(dim=0)[t.ch.clamp(min=0)] if n else False  # (N+1, W) alive in every row (B = 1: its own)
        lives = (t.ch >= 0) & drew  # the children today's tree drew
        distortion, exact = path_distortions(rule, target_probs, draft_probs, t.x, torch.where(lives, t.ch, -1), tol_e,
                                             path, num_accepted, leaf, siblings, draft_support, reads=False)
    return TreeVerdict(
        num_accepted=num_accepted, path=path, next_token=next_token, is_bonus=leaf,
        last_rejected=torch.where(leaf, -1, last.last_rej), kinds=kinds, p=p_all, q=q_all, ratio=ratio, u=uniforms,
        tolerance=tol_e[:, parent_entry], max_p=max_p, next_p=next_p, next_q=next_q, distortion=distortion,
        distortion_exact=exact,
    )
