"""The device tree round: a tree round drafted and decided on the device, with ONE host read a round.

Terms (host read, packed read, KV: device_round.py; tree, node, entry, spec: trees.py; widths, alive:
fixed_trees.py; walk: device_walk.py; records: tree.py)
-----
fixed shape   the round's tree has the widths of ``FixedTreeSpec.of(spec)``, chosen before the round from the
              spec and the tokens still allowed (the depth cap), never from this round's draft scores: the
              drafter builds it with ``build_fixed_tree`` (one draft pass per depth, the children drawn or
              ranked with tensor operations). Where the spec's budget is a full tree (budget 6, depth 2,
              width 2; budget = depth, width 1: the chain) today's best-first tree has the same nodes, so the
              round emits today's tokens and events.
decisions     ``device_walk``: today's tree walk (``tree_walk.walk_tree``) as tensor operations, depth by depth
              and rank by rank; the next token drawn on the device.
packed read   the round's n, next token, bonus flag, last rejected node, path, and per node the token, kind,
              alive flag, p, q, ratio, U, tolerance, score and slot priority, max P per entry, next p and q: one
              float64 vector (``pack``, laid out by ``packed.TREE_READ``, a lossy rule's distortion and exact flag
              per emitted position included), read once (``HostReader``) and unpacked as a ``TreeHost`` (tree.py).
KV            the target's cache keeps the prefix, the root and the path (``tree.keep_path``), the drafter's the
              path (``commit_tree``): the verdict's path tensor cut at the n of that read.
records       today's (``TokenEvent``, ``DraftRecord``, ``TreeRecord``); the nodes that are not alive are left
              out of the round's ``drafted`` count and of its ``TreeRecord`` (today's tree never drew them).
rules         every registered rule decides on the device (standard, ears, greedy, ears-entropy, typical, fly,
              ears-budget), with the same uniforms as today's tree round; a lossy rule's distortion (when asked,
              ``with_distortion``, the default) is computed there too (``rules.tree_distortion``: fixed shapes,
              no host read) and rides in the packed read. The input guard (``verify_tree.check_tree_drafts``'s
              refusal of a broken drafter's ids or q = 0) runs on the host on what the packed read holds
              (``verify.check_read``): on every device, at no wait of its own.
today's path  (``takes``) runs where the device tree could not decide as today's: with a size policy (``keep``,
              back-off: it chooses the tree from this round's draft scores), and for ears-budget on a tree that
              branches below depth 1 (its beta reads max P over the entries in node order, a chain's worst case:
              rules/lossy.py; today's nodes are numbered in creation order, which follows the draft's scores,
              the fixed tree's breadth first). On a chain or a one-level tree ears-budget runs here.
structure     the tree's structure, positions, draw keys and masks are made on the device once per shape
              (``fixed_trees.tables_for``; every shape the depth cap may ask for is made in ``start``, before the
              first round) and read from there each round: the draft and acceptance draws are hashed on the
              device from the round's first position (a scalar), the passes' masks are the cached block after a
              visible prefix (fixed_tables.py: prefix).
on CUDA       one wait a round: the packed read. No tensor is made from Python data, nothing is copied from the
              host and nothing else is read inside a round (counted on the CPU per kind, decode/waits.py;
              ``gpu_check``'s round waits run the same counter on CUDA beside ``torch.cuda.set_sync_debug_mode``).
              Not measured on a GPU yet.

Users select it with ``tree_stream(..., device_round=True)`` (and ``tree_generate``; ``RunConfig.device_round`` with
the tree draft shape); it is off by default.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ears_core.decode.device_round import HostReader
from ears_core.decode.device_walk import device_walk
from ears_core.decode.packed import TREE_READ
from ears_core.decode.rounds import Round, RoundContext
from ears_core.decode.tree import TreeHost, TreeShape
from ears_core.decode.verify import check_read
from ears_core.decode.verify_tree import TreeVerdict
from ears_core.draft.fixed_trees import FixedTreeSpec, build_fixed_tree, tables_for
from ears_core.draft.trees import TreeDraws, TreeSpec
from ears_core.rules import AcceptanceRule, BudgetEARSRule
from ears_core.sampling import Stream

__all__ = ["DeviceTreeShape", "pack", "unpack"]


def pack(v: TreeVerdict, tokens: Tensor, alive: Tensor, scores: Tensor, priorities: Tensor) -> Tensor:
    """Row 0 of a TreeVerdict (its distortion per emitted position where it has one), the tokens (1, N), alive (N,),
    scores and priorities (N,) as one float64 vector on their device, laid out by ``packed.TREE_READ`` (module
    terms: packed read)."""
    none = v.p.new_zeros(0)  # (0,): a round that computed no distortion
    dist, exact = (v.distortion[0], v.distortion_exact[0]) if v.distortion is not None else (none, none.bool())
    values = dict(p=v.p[0], q=v.q[0], ratio=v.ratio[0], u=v.u[0], tolerance=v.tolerance[0], max_p=v.max_p[0],
                  next_p=v.next_p[:1], next_q=v.next_q[:1], scores=scores, priorities=priorities,
                  num_accepted=v.num_accepted[:1], next_token=v.next_token[:1], last_rejected=v.last_rejected[:1],
                  path=v.path[0], tokens=tokens[0], kinds=v.kinds[0], is_bonus=v.is_bonus[:1], alive=alive,
                  distortion=dist, distortion_exact=exact)
    return TREE_READ.pack(values, n=tokens.shape[1], depth=v.path.shape[1], e=dist.numel())


def unpack(f: list[float], n: int, depth: int, e: int = 0) -> TreeHost:
    """The round's ``TreeHost`` (tree.py) from ``pack``'s vector read to the host; n nodes, depth D, e emitted
    positions with a distortion (D + 1, or 0)."""
    fields = TREE_READ.unpack(f, n=n, depth=depth, e=e)
    fields["path"] = fields["path"][: fields["num_accepted"]]  # the accepted nodes only
    return TreeHost(**fields)


class DeviceTreeShape(TreeShape):
    """The tree round on the device (module terms): a fixed shape, tensor decisions, one host read."""

    @staticmethod
    def takes(rule: AcceptanceRule, spec: TreeSpec, keep: object = None) -> bool:
        """Whether this round decides as today's tree round for ``rule``, ``spec`` and a size policy ``keep``
        (module terms: today's path)."""
        order = isinstance(rule, BudgetEARSRule) and spec.branching and spec.depth > 1
        return keep is None and not order

    def start(self, ctx: RoundContext) -> None:
        super().start(ctx)
        self.reader = HostReader()
        for depth in range(self.spec.depth + 1):  # every shape the depth cap may ask for (module terms: structure)
            tables_for(FixedTreeSpec.of(self.spec.capped(depth)), ctx.device)

    def propose(self, produced: int, limit: int, plain: bool) -> None:
        ctx = self.ctx
        self.plain = False
        self.fixed = FixedTreeSpec.of(self.spec.capped(limit))
        self.tree = ctx.drafter.propose_tree(
            self.fixed, ctx.probs_fn, TreeDraws(ctx.cfg.seed, produced, self.spec.branching),
            greedy=ctx.cfg.sampling.greedy, rank_fn=self.rank_fn, build=build_fixed_tree)
        self.estimates, self.expected = [], None
        tables = tables_for(self.fixed, ctx.device)
        self.tables = tables if self.tree.size == tables.size else tables_for(FixedTreeSpec.of(self.spec.capped(0)),
                                                                                ctx.device)  # a drafter with nothing

    def verify(self, target_probs: Tensor, produced: int, step: int) -> Round:
        ctx, tree = self.ctx, self.tree
        self.max_depth = tree.max_depth
        n, dev = tree.size, target_probs.device
        alive = getattr(tree, "alive", None) if n else None
        alive = alive if alive is not None else torch.ones(n, dtype=torch.bool, device=dev)  # (N,)
        tokens = tree.tokens[None]  # (1, N)
        v = device_walk(target_probs, tree.draft_probs[None], tokens, tree.parents, ctx.rule,
                        uniforms=self.tables.accept_uniforms(ctx.cfg.seed, produced)[None],  # (1, N)
                        sample_uniforms=ctx.draws[Stream.TARGET][None, produced: produced + self.max_depth + 1],
                        alive=alive, with_distortion=ctx.with_distortion, siblings=tree.siblings,
                        draft_support=self.support, tables=self.tables)
        zeros = torch.zeros(n, dtype=torch.float64, device=dev)
        packed = pack(v, tokens, alive, getattr(tree, "score_t", zeros), getattr(tree, "priority_t", zeros))
        e = 0 if v.distortion is None else self.max_depth + 1  # emitted positions with a distortion
        host = unpack(self.reader.read(packed), n, self.max_depth, e)  # the round's one host read
        check_read(host.tokens, None if ctx.rule.argmax_only else host.q, target_probs.shape[-1])  # the input guard
        self.nodes = v.path[0, : host.num_accepted]  # (n,) the path on the device, for the cache cuts
        return self.finish(v, host, produced, step)
