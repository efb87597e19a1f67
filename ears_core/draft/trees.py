"""Draft trees: many candidate continuations, verified in one target pass.

Terms
-----
node         a drafted token, numbered in creation order (a parent precedes its children); parent -1: a child of
             the root, the last committed token. depth: 1 for the root's children. rank: its place among its
             siblings, 0 tried first.
entry        a row of the tree pass: entry 0 is the root, entry i + 1 is node i; P_target at entry e judges
             e's children, which the draft distribution at e proposed.
siblings     ``sampled``: drawn without replacement from the parent's draft distribution q, rank j from q with
             ranks < j removed and renormalised (its ``draft_probs``, which verify_tree tests it against: exact).
             ``fixed``: the parent's j-th most likely tokens, ``draft_probs`` one-hot (the only choice at T = 0).
score        the product of the draft probabilities along a node's path (EAGLE-2), from ``rank_fn`` (the raw
             draft at T = 1: the drafter's calibrated confidence at every temperature).
slot         the promise of a node's rank-j child, with priority score(parent) * (j-th largest draft probability at
             the parent). Best-first expansion pops the best slot, draws its token and never removes a node, so
             whether a slot exists depends only on earlier draws: sampled trees stay exact. A node's children
             wait for one draft pass over every waiting node, with the estimate score(node) * (parent's top p).
estimate     with a ``level`` function (``tree_budget.TreeBudget.level``), a slot's chance of standing: its
             parent's estimate times level(slot probability, depth, rank), what ``keep`` is asked with. The order
             stays by priority (docs/measurements.md).
spec         budget: the most nodes; depth: the deepest level; width: the most children of one node (1: the chain).
draft draws  counter based (sampling.py): in a spec that cannot branch, node d uses the chain's draw for position
             start + d - 1; a branching spec keys every node by (position, round start, ranks along its path).
tree pass    one forward over [root, nodes] on the committed cache: position ids root_position + depth, a 4D mask
             in which each entry sees the prefix, its ancestors and itself. After it the cache keeps the prefix,
             the root and the accepted path, in that order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from ears_core.sampling import (MASK64, Stream, chained_keys, counter_uniforms, host_uniforms, sample_with_uniforms,
                                splitmix64)

__all__ = ["TreeSpec", "TreeDraws", "DraftTree", "build_tree", "accept_keys", "accept_uniforms", "ancestor_matrix",
           "additive_mask", "children", "children_table", "draft_pass", "node_rows", "ranked", "tree_position_ids",
           "tree_visibility"]

ProbsFn = Callable[[Tensor], Tensor]  # logits (..., V_model) -> probs (..., V)
ExpandFn = Callable[[list[int], "DraftTree"], Tensor]  # (node ids, tree) -> (m, V_model) draft logits after each
KeepFn = Callable[[float, int, int], bool]  # (priority, nodes so far, depth) -> draw this node? False ends the tree
LevelFn = Callable[[float, int, int], float]  # (draft probability at the parent, depth, rank) -> P(stands | parent did)


@dataclass(frozen=True)
class TreeSpec:
    """The shape a round's tree may take; see the module docstring."""

    budget: int
    depth: int
    width: int | None = None  # None: as many children as the budget allows
    siblings: str = "auto"  # "auto" (fixed at T = 0, sampled otherwise), "sampled" or "fixed"

    def __post_init__(self) -> None:
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"tree budget (nodes per round) must be an integer >= 1, got {self.budget!r}")
        if not isinstance(self.depth, int) or self.depth < 0:
            raise ValueError(f"tree depth must be an integer >= 0, got {self.depth!r}")
        if self.width is not None and (not isinstance(self.width, int) or self.width < 1):
            raise ValueError(f"tree width must be an integer >= 1 or None, got {self.width!r}")
        if self.siblings not in ("auto", "sampled", "fixed"):
            raise ValueError(f"siblings must be 'auto', 'sampled' or 'fixed', got {self.siblings!r}")

    @property
    def branching(self) -> bool:
        """Whether a node can have more than one child."""
        return self.width != 1 and self.budget > 1

    @property
    def kmax(self) -> int:
        """The most children of one node (a node's ``ranked`` takes one more)."""
        return min(self.budget, self.width or self.budget)

    def fixed_siblings(self, greedy: bool) -> bool:
        """Whether siblings are fixed (module terms): "fixed", or "auto" at T = 0 (``greedy``)."""
        return self.siblings == "fixed" or (self.siblings == "auto" and greedy)

    def capped(self, depth: int) -> "TreeSpec":
        """The same spec no deeper than ``depth`` (the tokens a round may still emit, minus one)."""
        return TreeSpec(self.budget, max(0, min(self.depth, depth)), self.width, self.siblings)


@dataclass(frozen=True)
class TreeDraws:
    """Counter keys of a round's draft draws: seed, the output position of depth 1, branching."""

    seed: int
    start: int
    branching: bool

    def draft_key(self, depth: int, ranks: Sequence[int]) -> int:
        """An int64 counter for the node reached by ``ranks`` (its path's ranks, root first)."""
        position = self.start + depth - 1
        if not self.branching:
            return position  # the chain's draw for this position
        x = 0
        for part in (position, self.start, *ranks):
            x = splitmix64(x ^ (part & MASK64))
        return (x & ((1 << 62) - 1)) | (1 << 62)  # positive, and never a plain position

    def uniforms(self, nodes: Sequence[tuple[int, Sequence[int]]], device: torch.device) -> Tensor:
        """(n,) float32: ``counter_uniforms`` of the keys of nodes (depth, ranks), computed on the host (the same)."""
        keys = [self.draft_key(depth, ranks) for depth, ranks in nodes]
        return torch.tensor(host_uniforms(self.seed, keys, Stream.DRAFT), device=device)

    def level_uniforms(self, depth: int, ranks: Tensor) -> Tensor:
        """(m,) float32: ``uniforms`` of m nodes at ``depth`` whose paths' ranks are the rows of ``ranks`` (m, depth)
        int64, computed on their device from the round's numbers as scalars (the same draws, bit for bit)."""
        position = self.start + depth - 1
        if not self.branching:
            keys = ranks.new_full(ranks.shape[:1], position)  # (m,) the chain's draw for this position
        else:
            prefix = splitmix64(splitmix64(position & MASK64) ^ (self.start & MASK64))  # draft_key's first two parts
            keys = (chained_keys(prefix, ranks) & ((1 << 62) - 1)) | (1 << 62)  # (m,)
        return counter_uniforms(self.seed, keys, Stream.DRAFT)


def accept_keys(depths: Sequence[int], ranks: Sequence[int], start: int) -> list[int]:
    """(N,) counters of the acceptance draws: output position plus the rank in high bits (rank 0: the chain's key).
    One node's children per depth are tested and a tested position is emitted, so no later round reuses a key."""
    return [start + d - 1 + (r << 40) for d, r in zip(depths, ranks)]


def accept_uniforms(seed: int, depths: Sequence[int], ranks: Sequence[int], start: int, device: torch.device) -> Tensor:
    """(N,) float32 acceptance draws of a tree's nodes: ``counter_uniforms`` of their ``accept_keys``."""
    return torch.tensor(host_uniforms(seed, accept_keys(depths, ranks, start), Stream.ACCEPT), device=device)


@dataclass
class DraftTree:
    """One round's candidates. Structure lists live on the host, tensors on the draft's device."""

    tokens: Tensor  # (N,) long
    draft_probs: Tensor  # (N, V): the distribution each node was drawn from (given earlier siblings)
    parents: list[int]  # -1 for the root's children
    depths: list[int]  # 1-based
    ranks: list[int]  # order among siblings
    scores: list[float]  # product of draft probabilities along the path
    siblings: str  # "sampled" or "fixed"
    priorities: list[float] = field(default_factory=list)  # each node's slot priority, known before its draw

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def is_chain(self) -> bool:
        """One node per depth, in depth order: the tree pass is an ordinary causal pass."""
        return self.parents == list(range(-1, self.size - 1))

    def path_ranks(self, node: int) -> list[int]:
        ranks = []
        while node >= 0:
            ranks.append(self.ranks[node])
            node = self.parents[node]
        return ranks[::-1]

    @staticmethod
    def empty(vocab: int, device: torch.device, siblings: str = "sampled") -> "DraftTree":
        return DraftTree(torch.empty(0, dtype=torch.long, device=device), torch.empty(0, vocab, device=device),
                         [], [], [], [], siblings)


@dataclass
class _Dist:
    """A node's draft distribution, prepared for drawing its children."""

    q: Tensor  # (V,) sampling distribution (sampled) or ranking distribution (fixed)
    s: Tensor  # (V,) score distribution: slot priorities and path scores are products of its values
    top_p: list[float]  # the largest values of s, descending (slot priorities)
    top_ids: list[int]  # their tokens (fixed siblings)
    drawn: list[int]  # children drawn so far


def ranked(s: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(m, V) -> the k + 1 largest values of each row, descending, ties lower token first (as argmax picks; the
    extra one orders a tie at the k-th place): values and tokens (m, k + 1), on the device."""
    vals, ids = s.topk(min(k + 1, s.shape[-1]), dim=-1)  # (m, k+1)
    by_id = ids.argsort(dim=-1, stable=True)  # ascending token first ...
    vals, ids = vals.gather(-1, by_id), ids.gather(-1, by_id)
    by_val = (-vals).argsort(dim=-1, stable=True)  # ... then by value, stable: ties keep the lower token first
    return vals.gather(-1, by_val), ids.gather(-1, by_val)


def build_tree(root_logits: Tensor, expand: ExpandFn, spec: TreeSpec, probs_fn: ProbsFn, draws: TreeDraws, *,
               greedy: bool = False, rank_fn: ProbsFn | None = None, keep: KeepFn | None = None,
               level: LevelFn | None = None) -> DraftTree:
    """Best-first expansion up to ``spec`` (module terms: slot, score, estimate) from root_logits (V_model,), the
    draft's logits for depth 1; ``expand`` runs nodes whose ancestors it ran. ``rank_fn`` (default ``probs_fn``)
    scores, ``probs_fn`` draws; ``keep``, asked before each draw (with ``level``: the estimate as its priority)."""
    b = _Builder(root_logits, spec, probs_fn, draws, greedy, rank_fn, level)
    if spec.depth == 0:
        return b.tree
    b.slot(-1, 0, 1)
    while b.heap and b.tree.size < spec.budget:
        neg_priority, _, parent, rank, estimate = heapq.heappop(b.heap)
        if rank < 0:  # a node whose children were promised: run the draft over every pending node
            if parent not in b.dists:
                b.expand_pending(expand)
            continue
        depth = 1 if parent < 0 else b.tree.depths[parent] + 1
        if keep is not None and not keep(-neg_priority if level is None else estimate, b.tree.size, depth):
            break
        b.add_child(parent, rank, depth, -neg_priority)
    return b.finish()


class _Builder:
    """One best-first expansion (build_tree): the tree so far, each expanded node's prepared distribution, and the
    heap of slots (-priority, order, node, rank, estimate); rank -1: a node whose children await a draft pass."""

    def __init__(self, root_logits: Tensor, spec: TreeSpec, probs_fn: ProbsFn, draws: TreeDraws, greedy: bool,
                 rank_fn: ProbsFn | None, level: LevelFn | None) -> None:
        self.spec, self.probs_fn, self.draws, self.level = spec, probs_fn, draws, level
        self.fixed = spec.fixed_siblings(greedy)
        self.score_fn = rank_fn if rank_fn is not None else probs_fn
        self.dev = root_logits.device
        self.dists: dict[int, _Dist] = {-1: self.prepare(root_logits[None])[0]}  # node id -> dist; -1 root
        self.vocab = self.dists[-1].q.shape[-1]
        self.tree = DraftTree.empty(self.vocab, self.dev, "fixed" if self.fixed else "sampled")
        self.tokens: list[Tensor] = []
        self.probs: list[Tensor] = []  # sampled siblings: the distribution each node was drawn from
        self.values: list[float] = []  # with ``level``: each node's estimate of P(its path stands)
        self.heap: list[tuple[float, int, int, int, float]] = []
        self.order = 0

    def prepare(self, logits: Tensor) -> list[_Dist]:
        """(m, V_model) -> one _Dist per row; a sampled node has no more slots than q has tokens with mass."""
        s, one = self.score_fn(logits), self.fixed or self.score_fn is self.probs_fn  # (m, V); one: s draws too
        q = s if one else self.probs_fn(logits)  # (m, V)
        vals, ids = (t[:, : self.spec.kmax].tolist() for t in ranked(s, self.spec.kmax))  # read to the host
        if one:
            return [_Dist(s[j], s[j], vals[j], ids[j], []) for j in range(s.shape[0])]
        mass = (q > 0).sum(dim=-1).tolist()  # (m,) tokens q can still draw
        return [_Dist(q[j], s[j], vals[j][: mass[j]], ids[j][: mass[j]], []) for j in range(q.shape[0])]

    def push(self, priority: float, node: int, rank: int, estimate: float = 0.0) -> None:
        if priority > 0:
            heapq.heappush(self.heap, (-priority, self.order, node, rank, estimate))
            self.order += 1

    def value(self, node: int) -> float:
        return 1.0 if node < 0 else self.values[node]

    def slot(self, parent: int, rank: int, depth: int) -> None:
        """The promise of the parent's rank-th child."""
        d = self.dists[parent]
        priority = (1.0 if parent < 0 else self.tree.scores[parent]) * d.top_p[rank]
        level = self.level
        self.push(priority, parent, rank, 0.0 if level is None else self.value(parent) * level(d.top_p[rank], depth, rank))

    def expand_pending(self, expand: ExpandFn) -> None:
        """One draft pass over every node not yet expanded (and not at the depth limit)."""
        tree = self.tree
        pending = [i for i in range(tree.size) if i not in self.dists and tree.depths[i] < self.spec.depth]
        tree.tokens = torch.stack(self.tokens)
        logits = expand(pending, tree)  # (m, V_model)
        for i, dist in zip(pending, self.prepare(logits)):
            self.dists[i] = dist
            if dist.top_p:
                self.slot(i, 0, tree.depths[i] + 1)

    def draw(self, parent: int, rank: int, depth: int) -> tuple[int, Tensor | None]:
        """The parent's rank-th child: its token and (sampled siblings) the distribution it was drawn from."""
        d = self.dists[parent]
        if self.fixed:
            return d.top_ids[rank], None
        q_node = d.q
        if d.drawn:  # without replacement: earlier siblings removed, the rest renormalised
            q_node = q_node.clone()
            q_node[d.drawn] = 0.0
            q_node = q_node / q_node.sum()
        ranks = ([] if parent < 0 else self.tree.path_ranks(parent)) + [rank]
        return int(sample_with_uniforms(q_node, self.draws.uniforms([(depth, ranks)], self.dev)[0])), q_node

    def add_child(self, parent: int, rank: int, depth: int, priority: float) -> None:
        """Draw the slot's node, add it, and promise its next sibling and its first child."""
        tree, d = self.tree, self.dists[parent]
        tok, q_node = self.draw(parent, rank, depth)
        d.drawn.append(tok)
        node = tree.size
        s_tok = float(d.s[tok])
        score = (1.0 if parent < 0 else tree.scores[parent]) * s_tok
        for column, value in ((tree.parents, parent), (tree.depths, depth), (tree.ranks, rank), (tree.scores, score),
                              (tree.priorities, priority)):
            column.append(value)
        if self.level is not None:
            self.values.append(self.value(parent) * self.level(s_tok, depth, rank))
        self.tokens.append(torch.tensor(tok, device=self.dev))
        if q_node is not None:
            self.probs.append(q_node)
        if rank + 1 < len(d.top_p):
            self.slot(parent, rank + 1, depth)
        if tree.depths[node] < self.spec.depth:  # its best child's promise, the parent's confidence (module terms: slot)
            self.push(score * d.top_p[0], node, -1)

    def finish(self) -> DraftTree:
        tree = self.tree
        if self.tokens:
            tree.tokens = torch.stack(self.tokens)  # (N,)
            tree.draft_probs = (torch.zeros(tree.tokens.shape[0], self.vocab, device=tree.tokens.device)  # (N, V)
                                .scatter_(-1, tree.tokens[:, None], 1.0) if self.fixed else torch.stack(self.probs))
        return tree


# ----------------------------------------------------------------------------- tree pass
def ancestor_matrix(parents: Sequence[int], device: torch.device | None = None) -> Tensor:
    """(N+1, N+1) bool over entries: [a, b] True iff entry b is entry a or one of its ancestors (the root: all)."""
    n = len(parents)
    anc = torch.eye(n + 1, dtype=torch.bool)
    anc[:, 0] = True
    for i, p in enumerate(parents):  # parents precede children: the parent's row is complete
        if p >= 0:
            anc[i + 1] |= anc[p + 1]
    return anc.to(device) if device is not None else anc


def additive_mask(seen: Tensor, dtype: torch.dtype) -> Tensor:
    """(R, C) bool, True where a query may attend -> (1, 1, R, C) additive mask on seen's device: 0
    where it may attend, the dtype's minimum elsewhere (what a transformers model takes)."""
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, torch.finfo(dtype).min)[None, None]


def tree_visibility(parents: Sequence[int], prefix_len: int, rows: Sequence[int], cols: Sequence[int],
                    device: torch.device | None = None) -> Tensor:
    """(R, prefix_len + C) bool, True where query entry ``rows[r]`` may attend: the prefix (visible to all), then
    entries ``cols`` in cache order that are the row's ancestors or itself (``additive_mask`` makes it a model's)."""
    anc = ancestor_matrix(parents)
    seen = anc[list(rows)][:, list(cols)]  # (R, C)
    return torch.cat([torch.ones(len(rows), prefix_len, dtype=torch.bool), seen], dim=1).to(device)


def tree_position_ids(depths: Sequence[int], root_position: int, entries: Sequence[int], device: torch.device) -> Tensor:
    """(1, len(entries)) long: root_position + depth of each entry (the root has depth 0)."""
    full = [0] + list(depths)
    return torch.tensor([[root_position + full[e] for e in entries]], dtype=torch.long, device=device)


def draft_pass(tree: DraftTree, ids: list[int], slots: list[int], prefix_len: int, device: torch.device
               ) -> tuple[Tensor | None, Tensor | None]:
    """A drafter's pass over nodes ``ids`` after its cached nodes ``slots`` (cache order), on ``prefix_len`` entries:
    (visibility (m, prefix_len + len(slots) + m) bool, positions (m,)), or (None, None) for the chain's next node."""
    if ids == [len(slots)] and tree.parents[: len(slots) + 1] == list(range(-1, len(slots))):
        return None, None
    tables = getattr(tree, "tables", None)  # a fixed tree's (fixed_tables.py): its levels, in node order
    if tables is not None and slots == list(range(len(slots))) and ids == list(range(len(slots), len(slots) + len(ids))):
        return tables.draft_pass(len(slots), len(ids), prefix_len)
    rows = [i + 1 for i in ids]
    return (tree_visibility(tree.parents, prefix_len, rows, [i + 1 for i in slots] + rows, device),
            tree_position_ids(tree.depths, prefix_len - 1, rows, device)[0])


def children(parents: Sequence[int]) -> list[list[int]]:
    """The children of each entry (0: the root, i + 1: node i) in rank order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i)
    return kids


def children_table(parents: Sequence[int], device: torch.device | None = None,
                   kids: list[list[int]] | None = None) -> Tensor:
    """(N + 1, W) long: the children of each entry in rank order, -1 padded (W >= 1)."""
    kids = children(parents) if kids is None else kids
    w = max(1, max(len(k) for k in kids))
    table = torch.full((len(kids), w), -1, dtype=torch.long)
    for e, k in enumerate(kids):
        table[e, : len(k)] = torch.tensor(k, dtype=torch.long)
    return table.to(device) if device is not None else table


def node_rows(t: Tensor, ids: list[int]) -> Tensor:
    """Rows ``ids`` (node numbers) of t: a slice where they are consecutive (a fixed tree's level), else an index."""
    if ids and ids == list(range(ids[0], ids[0] + len(ids))):
        return t[ids[0]: ids[0] + len(ids)]
    return t[ids]
