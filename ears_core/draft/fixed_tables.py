"""A fixed tree's structure on the device, made once per shape: what a device tree round reads of its tree.

Terms (widths, breadth-first numbering: fixed_trees.py; entry, rank, tree pass, draft draws: trees.py)
-----
tables      one shape's structure on one device: the host lists (parents, depths, ranks) and, as device tensors,
            each node's parent entry, each entry's children in rank order, each entry's depth, the acceptance
            keys' offsets, the ranks along each node's path per depth (the draft draws' keys) and the ancestor
            matrix. Made once per shape and device (``fixed_trees.tables_for``); a round then makes no tensor from
            Python data and copies nothing from the host: the round's own numbers (its first output position, a
            cache's length) enter tensor operations as scalars.
level       depth d's nodes are the numbers [start_d, start_d + size_d): the draft pass before depth d + 1 runs
            them on top of the nodes of the depths above, which is all the drafter holds of the tree, in node order.
prefix      every row of a tree pass sees all the positions before the tree (the committed tokens; for the target
            also the root). A pass's mask is the cached block over the tree's entries after a visible prefix, padded
            on the device each pass: a model takes a 4D mask over every key (transformers passes it on as it is).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ears_core.draft.trees import TreeDraws, accept_keys, additive_mask, ancestor_matrix, children_table
from ears_core.sampling import Stream, counter_uniforms

__all__ = ["FixedTables"]


class FixedTables:
    """One fixed shape's structure on one device (module terms: tables)."""

    def __init__(self, widths: Sequence[int], parents: list[int], depths: list[int], ranks: list[int],
                 device: torch.device) -> None:
        self.widths, self.device = tuple(widths), device
        self.parents, self.depths, self.ranks = parents, depths, ranks  # host lists, breadth first
        self.size, self.depth = len(parents), len(self.widths)
        sizes = [math.prod(self.widths[:d]) for d in range(1, self.depth + 1)]  # nodes per depth
        self.levels = [(sum(sizes[:d]), sizes[d]) for d in range(self.depth)]  # (start, size) of depth d + 1
        self.parent_entry = torch.tensor(parents, dtype=torch.long, device=device) + 1  # (N,)
        self.entry_depth = torch.tensor([0] + depths, dtype=torch.long, device=device)  # (N+1,)
        self.accept_offsets = torch.tensor(accept_keys(depths, ranks, 0), dtype=torch.long, device=device)  # (N,)
        self.children = children_table(parents, device)  # (N+1, W): each entry's children in rank order
        self.path_ranks = [self._path_ranks(d) for d in range(1, self.depth + 1)]  # (size_d, d) per depth
        self.visible = ancestor_matrix(parents, device)  # (N+1, N+1) bool: entry a sees entry b
        self._blocks: dict[torch.dtype, Tensor] = {}  # dtype -> (N+1, N+1) additive block of ``visible``

    def _path_ranks(self, depth: int) -> Tensor:
        """(size, depth) int64: the ranks along each path to depth ``depth``'s nodes, root first (the digits of the
        node's place in its level, in the widths' mixed radix)."""
        place = torch.arange(self.levels[depth - 1][1], device=self.device)[:, None]  # (size, 1)
        below = [math.prod(self.widths[j + 1: depth]) for j in range(depth)]  # nodes under one rank at each depth
        return (place // torch.tensor(below, device=self.device)) % torch.tensor(self.widths[:depth], device=self.device)

    # ------------------------------------------------------------------ per round: scalars into tensor operations
    def accept_uniforms(self, seed: int, start: int) -> Tensor:
        """(N,) float32: ``trees.accept_uniforms`` of the nodes for a round whose depth 1 is output position start."""
        return counter_uniforms(seed, self.accept_offsets + start, Stream.ACCEPT)

    def draft_uniforms(self, draws: TreeDraws) -> Tensor:
        """(N,) float32: ``draws.uniforms`` of every node in node order (``TreeDraws.level_uniforms`` per depth)."""
        if not self.size:
            return torch.zeros(0, device=self.device)
        return torch.cat([draws.level_uniforms(d + 1, r) for d, r in enumerate(self.path_ranks)])

    def positions(self, root_position: int) -> Tensor:
        """(1, N+1) long: the tree pass's position ids, the root at ``root_position`` (``trees.tree_position_ids``)."""
        return (self.entry_depth + root_position)[None]

    def target_mask(self, prefix_len: int, dtype: torch.dtype) -> Tensor:
        """(1, 1, N+1, prefix_len + N+1) additive mask of the target's tree pass over a cache of prefix_len
        positions (module terms: prefix)."""
        block = self._blocks.get(dtype)
        if block is None:
            block = self._blocks[dtype] = additive_mask(self.visible, dtype)[0, 0]
        return F.pad(block, (prefix_len, 0))[None, None]

    def draft_pass(self, first: int, m: int, prefix_len: int) -> tuple[Tensor, Tensor]:
        """A drafter's pass over nodes [first, first + m) after nodes [0, first) on ``prefix_len`` cached positions
        (``trees.draft_pass``'s answer): (visibility (m, prefix_len + first + m) bool, positions (m,))."""
        rows = slice(first + 1, first + m + 1)  # their entries
        seen = F.pad(self.visible[rows, 1: first + m + 1], (prefix_len, 0), value=True)
        return seen, self.entry_depth[rows] + (prefix_len - 1)
