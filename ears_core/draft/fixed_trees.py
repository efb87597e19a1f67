"""Fixed-shape draft trees: a tree whose shape is known before the round, drafted with no host read.

Terms (node, parent, rank, entry, siblings, slot, score, spec, draft draws: trees.py)
-----
widths       (w_1, .., w_D): every node at depth d - 1 (the root at depth 0) has w_d children, so the
             tree has w_1 + w_1 w_2 + .. + w_1 .. w_D nodes. Nodes are numbered breadth first: depth by
             depth, and within a depth by parent, then rank. The parents, depths and ranks are host lists
             that follow from the widths alone.
from a spec  ``FixedTreeSpec.of(spec)``: the chain of ``depth`` nodes (no more than the budget), widened
             from depth 1 down, each depth as far as ``width`` allows while the nodes stay within the
             budget: budget 6, depth 2, width 2 is the full binary tree (2, 2); budget 8, depth 4, width 2
             is (2, 1, 1, 1). Where the spec's budget is exactly such a full tree, ``build_tree``'s
             best-first expansion builds the same nodes (the same tokens, draws and distributions; its
             numbering is by creation order instead), since every slot of it is within the budget.
drafting     ``build_fixed_tree``: one draft pass per depth over every node of the depth above (the
             drafter's ``expand``), then each node's w_d children at once, in rank order: fixed siblings
             are the w_d largest values of the score distribution (ties: the lower token first, as
             ``trees.ranked``), sampled siblings are drawn without replacement from the sampling
             distribution with the nodes' counter-based draws (``TreeDraws``: the keys from the node's depth
             and ranks, computed on the device). Tensor operations only: no host read, and no tensor made
             from Python data once the shape's tables exist.
tables       the shape's structure on the device (fixed_tables.py), made once per shape and device
             (``tables_for``) and carried by the tree (``tree.tables``) for the passes over it.
alive        a sampled node of rank j exists in ``build_tree`` only if its parent's draft distribution has
             more than j tokens with mass (drawing without replacement runs out) and its parent exists.
             Here every node is in the tree (fixed shape), and ``alive`` (N,) bool says which of them
             ``build_tree`` would have drawn; the verifier never tests a node that is not alive
             (decode/device_tree.py). A fixed sibling is always alive.
record       scores and slot priorities per node as (N,) float64 tensors (``score_t``, ``priority_t``): the
             same products ``build_tree`` forms on the host, read with the round's verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from ears_core.draft.fixed_tables import FixedTables
from ears_core.draft.trees import DraftTree, ExpandFn, ProbsFn, TreeDraws, TreeSpec, ranked
from ears_core.sampling import sample_with_uniforms

__all__ = ["FixedTreeSpec", "FixedDraftTree", "build_fixed_tree", "tables_for", "widths_for"]


def widths_for(spec: TreeSpec) -> tuple[int, ...]:
    """The widths of a spec's fixed tree (module terms: from a spec)."""
    widths = [1] * min(spec.depth, spec.budget)
    for d in range(len(widths)):
        while widths[d] < spec.kmax and _size(widths[:d] + [widths[d] + 1] + widths[d + 1:]) <= spec.budget:
            widths[d] += 1
    return tuple(widths)


def _size(widths: list[int] | tuple[int, ...]) -> int:
    total, level = 0, 1
    for w in widths:
        level *= w
        total += level
    return total


@dataclass(frozen=True)
class FixedTreeSpec:
    """A fixed tree's shape (module terms): its widths, and the spec it came from (siblings, kmax)."""

    widths: tuple[int, ...]
    spec: TreeSpec

    @staticmethod
    def of(spec: TreeSpec) -> "FixedTreeSpec":
        return FixedTreeSpec(widths_for(spec), spec)

    @property
    def depth(self) -> int:
        return len(self.widths)

    @property
    def size(self) -> int:
        return _size(self.widths)

    def structure(self) -> tuple[list[int], list[int], list[int]]:
        """parents, depths, ranks (host lists, breadth-first numbering)."""
        parents, depths, ranks = [], [], []
        level = [-1]  # the nodes of the depth above (the root)
        for d, w in enumerate(self.widths, start=1):
            start = len(parents)
            for p in level:
                parents += [p] * w
                depths += [d] * w
                ranks += list(range(w))
            level = list(range(start, len(parents)))
        return parents, depths, ranks


@lru_cache(maxsize=64)
def tables_for(spec: FixedTreeSpec, device: torch.device) -> FixedTables:
    """The shape's structure on ``device``, made at the first call for them (module terms: tables)."""
    return FixedTables(spec.widths, *spec.structure(), device)


@dataclass
class FixedDraftTree(DraftTree):
    """A ``DraftTree`` of a fixed shape, with its per-node records as tensors (module terms)."""

    alive: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.bool))  # (N,) bool
    score_t: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.float64))  # (N,)
    priority_t: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.float64))  # (N,)
    tables: Any = None  # the shape's FixedTables (module terms)


@dataclass
class _Level:
    """One depth's children, (m, w) each, m the nodes of the depth above."""

    tokens: Tensor  # (m, w) long
    probs: Tensor  # (m, w, V) the distribution each child was drawn from
    alive: Tensor  # (m, w) bool
    s_tok: Tensor  # (m, w) float64: the score distribution at the child's token
    top_p: Tensor  # (m, w) float64: the rank-th largest score value (its slot's factor)


def _children(q: Tensor, s: Tensor, w: int, kmax: int, fixed: bool, u: Tensor) -> _Level:
    """q, s (m, V) the sampling and score distributions of m parents, u (m, w) the children's draws."""
    vals, ids = ranked(s, kmax)  # (m, kmax + 1)
    top_p = vals[:, :w].double()  # (m, w)
    if fixed:
        toks = ids[:, :w]  # (m, w)
        probs = torch.zeros((*toks.shape, q.shape[-1]), device=q.device).scatter_(-1, toks[..., None], 1.0)
        return _Level(toks, probs, torch.ones_like(toks, dtype=torch.bool), top_p, top_p)
    mass = (q > 0).sum(dim=-1, keepdim=True)  # (m, 1) tokens q can draw
    drawn = torch.zeros_like(q, dtype=torch.bool)  # (m, V)
    toks, probs = [], []
    for j in range(w):  # rank by rank: a few
        qj = q
        if j:  # without replacement: earlier siblings removed, the rest renormalised
            qj = q.masked_fill(drawn, 0.0)
            total = qj.sum(dim=-1, keepdim=True)  # (m, 1)
            qj = torch.where(total > 0, qj / torch.where(total > 0, total, 1.0), q)  # q where none is left (not alive)
        tok = sample_with_uniforms(qj, u[:, j])  # (m,)
        drawn.scatter_(-1, tok[:, None], True)
        toks.append(tok)
        probs.append(qj)
    toks_t = torch.stack(toks, dim=1)  # (m, w)
    alive = torch.arange(w, device=q.device)[None] < mass  # (m, w)
    return _Level(toks_t, torch.stack(probs, dim=1), alive, s.gather(-1, toks_t).double(), top_p)


def build_fixed_tree(root_logits: Tensor, expand: ExpandFn, spec: FixedTreeSpec, probs_fn: ProbsFn,
                     draws: TreeDraws, *, greedy: bool = False, rank_fn: ProbsFn | None = None,
                     keep: object = None, level: object = None) -> FixedDraftTree:
    """``trees.build_tree``'s signature for a fixed shape (module terms: drafting); ``keep`` and ``level``
    are not asked (the shape is fixed before the round). root_logits (V_model,) -> a FixedDraftTree."""
    dev = root_logits.device
    score_fn = rank_fn if rank_fn is not None else probs_fn
    fixed = spec.spec.fixed_siblings(greedy)
    tables = tables_for(spec, dev)
    n = tables.size
    probs0 = probs_fn(root_logits[None])  # (1, V)
    vocab = probs0.shape[-1]
    tree = FixedDraftTree(torch.zeros(n, dtype=torch.long, device=dev), torch.zeros(n, vocab, device=dev),
                          tables.parents, tables.depths, tables.ranks, [], "fixed" if fixed else "sampled", tables=tables)
    uniforms = tables.draft_uniforms(draws) if not fixed else torch.zeros(n, device=dev)  # (N,) every node's draft draw
    alive = torch.ones(1, dtype=torch.bool, device=dev)  # (m,) the nodes of the depth above
    score = torch.ones(1, dtype=torch.float64, device=dev)  # (m,)
    scores, priorities, alives = [], [], []
    start, above, logits = 0, [], root_logits[None]  # logits (m, V_model) after each node above
    for w in spec.widths:
        if above:
            logits = expand(above, tree)  # (m, V_model)
        m = logits.shape[0]
        q = probs0 if not above else probs_fn(logits)  # (m, V)
        lv = _children(q, score_fn(logits), w, spec.spec.kmax, fixed, uniforms[start: start + m * w].reshape(m, w))
        ids = slice(start, start + m * w)
        tree.tokens[ids] = lv.tokens.reshape(-1)
        tree.draft_probs[ids] = lv.probs.reshape(m * w, vocab)
        alives.append((alive[:, None] & lv.alive).reshape(-1))
        priorities.append((score[:, None] * lv.top_p).reshape(-1))
        scores.append((score[:, None] * lv.s_tok).reshape(-1))
        alive, score = alives[-1], scores[-1]
        above, start = list(range(start, start + m * w)), start + m * w
    if n:
        tree.alive, tree.score_t, tree.priority_t = torch.cat(alives), torch.cat(scores), torch.cat(priorities)
    return tree
