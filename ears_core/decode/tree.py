"""The tree round (seed 002): each round verifies a tree of drafts in one target pass.

Terms (tree, node, entry, spec: trees.py; route, test, emitted: verify_tree.py)
-----
round        the drafter builds a tree (``propose_tree``: best-first up to the spec's budget, depth
             and width); the target scores [last committed token, nodes] in ONE forward with the
             tree mask and position ids; verify_tree walks it and keeps n nodes (the accepted
             path) plus one more token; both caches are rearranged to the path. A round emits
             n + 1 tokens, like a chain round. On the CPU, rules other than greedy are walked on
             the host instead (``tree_walk.walk_tree``: the same verdict, only the tests the route
             reaches; greedy's vectorised path is already one pass over V).
cache        the target's cache holds the committed sequence minus its last token, as in the chain
             decoder; after a tree pass it keeps the prefix, the root and the path (in that order)
             and drops every other node. The prompt is encoded once.
depth cap    a round's tree is no deeper than the tokens still allowed minus one, so that
             ``max_new_tokens`` is exact.
draws        counter based, as in the chain decoder (trees.py: draft draws; accept_keys, computed on the host): a spec
             with width 1 is the chain, draw for draw, and gives the chain decoder's tokens and events.
records      events and step records are the chain's (``TokenEvent``, ``StepRecord``; a step's
             ``drafted`` counts the tree's nodes, its ``drafts`` the nodes that were tested, and
             with a size policy its ``estimates`` / ``expected`` are the policy's per node / E(N));
             each round's tree is kept in ``Generation.trees`` as a ``TreeRecord``. For a sibling
             tried after a rejection, an event's ``ratio`` is against the residual target, its
             ``p`` is still P_target.
distortion   per emitted position, from verify_tree; exact where it can be enumerated, else an
             upper bound (``TreeRecord.distortion_exact``). A lossless rule's is 0 and not computed
             (as in a chain), and its records' ``distortion_exact`` stay empty.
size policy  ``keep(priority, nodes so far, depth)`` (e.g. ``tree_policy.TreeBudget``) ends a round's
             tree before a draw; if it has ``observe_round(record)`` it is shown each finished round,
             and ``observe_cost(nodes, depth, ms)`` the round's measured time.
             With ``backoff``, a round whose tree the policy left empty is followed by plain target
             steps that do not ask the drafter (1, then 3, then at most 7 of them, as the chain
             decoder's policy does; ``propose(0)`` / ``commit(0, ...)``; rounds.py). The schedule depends on
             past rounds only, so the output stays exact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache

from ears_core.decode.rounds import Round, RoundContext
from ears_core.decode.tree_walk import walk_tree
from ears_core.decode.verify import KIND_NAMES, DraftKind, check_enabled
from ears_core.decode.verify_tree import verify_tree
from ears_core.draft.drafters import layers_side_by_side
from ears_core.draft.trees import (
    DraftTree, KeepFn, LevelFn, TreeDraws, TreeSpec, accept_uniforms, additive_mask, tree_position_ids, tree_visibility,
)
from ears_core.events import DraftRecord, TokenEvent
from ears_core.model.passes.kv_cache import cache_device, drop_last_positions, keep_tail_positions, on_device
from ears_core.sampling import Stream

if TYPE_CHECKING:  # annotations only: importing it loads transformers' modeling code (seconds)
    from transformers import PreTrainedModel

__all__ = ["TreeHost", "TreeRecord", "TreeShape", "score_tree", "keep_path"]


@dataclass
class TreeRecord:
    """One round's tree, for drawing it: what was drafted, what was tested, which path stood."""

    step: int
    start: int  # output position of depth 1
    tokens: list[int]
    parents: list[int]  # -1 for the root's children
    depths: list[int]
    ranks: list[int]
    scores: list[float]
    priorities: list[float]  # slot priority of each node when it was drawn
    kinds: list[str]  # per node: accepted / pardoned / rejected, "" if never tested
    path: list[int]  # the accepted nodes, root first
    next_token: int
    next_kind: str  # resampled / bonus / target
    distortion_exact: list[bool] = field(default_factory=list)  # per emitted position

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- the target's side


def score_tree(target: PreTrainedModel, cache: DynamicCache, last: Tensor, tree: DraftTree,
               need_hidden: bool = False, layers: Sequence[int] = (-1,)) -> tuple[Tensor, Tensor | None]:
    """One target pass over [last (1, 1), tree nodes] on top of ``cache``.

    -> logits (1, N+1, V_model): entry 0 judges the root's children, entry i + 1 those of node i;
    and, if ``need_hidden``, the hidden states of ``layers`` side by side (1, N+1, len(layers) * d)."""
    ids = torch.cat([last, on_device(tree.tokens, last.device)[None]], dim=1)  # (1, N+1)
    mask = pos = None
    tables = getattr(tree, "tables", None)  # a fixed tree's structure on the device (fixed_tables.py)
    if not tree.is_chain():  # a chain is an ordinary causal pass
        length = cache.get_seq_length()
        if tables is not None:
            mask, pos = tables.target_mask(length, target.dtype), tables.positions(length)
        else:
            entries = list(range(tree.size + 1))
            mask = additive_mask(tree_visibility(tree.parents, length, entries, entries, last.device), target.dtype)
            pos = tree_position_ids(tree.depths, length, entries, last.device)
    out = target(ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                 output_hidden_states=need_hidden)
    return out.logits, (layers_side_by_side(out.hidden_states, tuple(layers)) if need_hidden else None)


def keep_path(cache: DynamicCache, prefix_len: int, tree_size: int, path: Sequence[int],
              nodes: Tensor | None = None) -> None:
    """After a tree pass: keep the first ``prefix_len`` positions (the committed prefix and the
    root) and the path's nodes, in order; drop the other nodes. ``nodes``: the path as a (n,) long tensor on the
    cache's device, where the caller has one (no tensor made from the list)."""
    if list(path) == list(range(len(path))):  # the path is the first nodes: a plain crop
        drop_last_positions(cache, tree_size - len(path))
        return
    if nodes is None:
        nodes = torch.tensor(list(path), dtype=torch.long, device=cache_device(cache))
    keep_tail_positions(cache, prefix_len, prefix_len + nodes)


# ----------------------------------------------------------------------------- the shape


class TreeShape:
    """A tree of drafts per round (rounds.RoundShape). ``keep``: the size policy's hook (module terms)."""

    def __init__(self, spec: TreeSpec, keep: KeepFn | None = None, level: LevelFn | None = None,
                 backoff: bool = False) -> None:
        self.spec, self.keep, self.level = spec, keep, level
        self.depth = spec.depth
        self.backs_off = bool(backoff and keep is not None)

    def start(self, ctx: RoundContext) -> None:
        self.ctx = ctx
        vocab = ctx.cfg.vocab_size
        self.rank_fn = lambda logits: torch.softmax(logits[..., :vocab].float(), dim=-1)  # slots by the raw draft (T = 1)
        self.support = getattr(ctx.drafter, "support", None)  # (N,) tokens outside which the drafter's q is 0, or None
        self.check = check_enabled(ctx.device)  # the drafter guard: a host read, skipped on CUDA
        self.walk = ctx.device.type == "cpu"  # the walk on the host: only the tests the route reaches (tree_walk.py)
        self.layers = tuple(getattr(ctx.drafter, "feature_layers", (-1,)))
        self.nodes: Tensor | None = None  # the round's path as a tensor on the device, where the round has one

    def propose(self, produced: int, limit: int, plain: bool) -> None:
        ctx = self.ctx
        self.plain = plain
        if plain:  # a plain target step: the drafter is told (its queued update), not asked
            ctx.drafter.propose(0, ctx.probs_fn, torch.empty((1, 0), device=ctx.device))
            self.tree = DraftTree.empty(ctx.cfg.vocab_size, ctx.device)
        else:
            self.tree = ctx.drafter.propose_tree(
                self.spec.capped(limit), ctx.probs_fn, TreeDraws(ctx.cfg.seed, produced, self.spec.branching),
                greedy=ctx.cfg.sampling.greedy, rank_fn=self.rank_fn, keep=self.keep, level=self.level)
        told = hasattr(self.keep, "estimates") and not plain  # the policy's estimate per drafted node
        self.estimates = list(self.keep.estimates)[: self.tree.size] if told else []
        self.expected = 1.0 + sum(self.estimates) if told and len(self.estimates) == self.tree.size else None

    def score(self, cache: DynamicCache, last: Tensor) -> Tensor:
        self.prefix = cache.get_seq_length() + 1  # the committed prefix and the root
        logits, self.hidden = score_tree(self.ctx.target, cache, last, self.tree, self.ctx.need_hidden, self.layers)
        return self.ctx.probs_fn(logits)  # (1, N+1, V)

    def verify(self, target_probs: Tensor, produced: int, step: int) -> Round:
        ctx, tree = self.ctx, self.tree
        self.max_depth = tree.max_depth
        v = (walk_tree if self.walk else verify_tree)(
            target_probs, tree.draft_probs[None], tree.tokens[None], tree.parents, ctx.rule,
            uniforms=accept_uniforms(ctx.cfg.seed, tree.depths, tree.ranks, produced, ctx.device)[None],  # (1, N)
            sample_uniforms=ctx.draws[Stream.TARGET][None, produced: produced + self.max_depth + 1],  # (1, D+1)
            with_distortion=ctx.with_distortion, siblings=tree.siblings, draft_support=self.support, check=self.check,
        )
        return self.finish(v, TreeHost.read(v, tree), produced, step)  # the round's host reads

    def finish(self, v: Any, host: TreeHost, produced: int, step: int) -> Round:
        """The round from its verdict ``v`` read to the host: the path kept for the cache cuts, the records, the
        nodes drawn (alive) counted as drafted."""
        self.path = host.path
        events, drafts, record = host.records(self.tree, produced, step)
        pardoned = sum(1 for a in self.path if host.kinds[a] == int(DraftKind.PARDONED))
        return Round(sum(host.alive), host.num_accepted, v.next_token, events, drafts, pardoned, self.estimates,
                     self.expected, record)

    def commit(self, cache: DynamicCache, rnd: Round) -> None:
        nodes = self.nodes  # (n,) on the device, or None: made from the host path
        keep_path(cache, self.prefix, self.tree.size, self.path, nodes)
        hidden, drafter = self.hidden, self.ctx.drafter
        if self.plain:
            drafter.commit(0, rnd.next_token, hidden[:, :1] if hidden is not None else None)
        elif nodes is None:
            drafter.commit_tree(self.path, rnd.next_token,
                                hidden[:, [0] + [1 + a for a in self.path]] if hidden is not None else None)
        else:  # the root's and the path's entries, selected on the device
            kept = hidden.index_select(1, F.pad(nodes + 1, (1, 0))) if hidden is not None else None
            drafter.commit_tree(self.path, rnd.next_token, kept, nodes=nodes)

    def paid(self, rnd: Round) -> bool:
        return rnd.drafted > 0

    def learn(self, rnd: Round) -> None:
        observe = getattr(self.keep, "observe_round", None)  # a size policy that learns from the rounds
        if observe is not None and not self.plain:
            observe(rnd.record)

    def timed(self, round_ms: float, target_ms: float) -> None:
        cost = getattr(self.keep, "observe_cost", None)  # ... and a node's price from the rounds' times
        if cost is not None and not self.plain:
            cost(self.tree.size, self.max_depth, round_ms, target_ms)


@dataclass
class TreeHost:
    """One tree round's verdict (row 0) on the host, by name: what its records are made of. ``read`` takes it
    from a verdict field by field (today's round); the device round unpacks it from one read (device_tree.py)."""

    num_accepted: int
    next_token: int
    is_bonus: bool
    last_rejected: int
    next_p: float
    next_q: float
    path: list[int]  # (n,) the accepted nodes, root first
    tokens: list[int]  # (N,)
    kinds: list[int]  # (N,) DraftKind values
    alive: list[bool]  # (N,) the nodes a best-first tree would have drawn (fixed_trees.py: alive)
    p: list[float]
    q: list[float]
    ratio: list[float]
    u: list[float]
    tolerance: list[float]
    scores: list[float]
    priorities: list[float]
    max_p: list[float]  # (N + 1,) per entry
    distortion: list[float] = field(default_factory=list)  # (D + 1,) per emitted position, where computed
    distortion_exact: list[bool] = field(default_factory=list)  # (D + 1,)

    @classmethod
    def read(cls, v: Any, tree: DraftTree) -> "TreeHost":
        """Row 0 of a verdict of today's tree, each field read to the host."""
        n = int(v.num_accepted[0])
        p, q, ratio, u, tol, max_p = (t[0].double().tolist() for t in (v.p, v.q, v.ratio, v.u, v.tolerance, v.max_p))
        dist, exact = ((v.distortion[0].tolist(), v.distortion_exact[0].tolist()) if v.distortion is not None
                       else ([], []))
        return cls(n, int(v.next_token[0]), bool(v.is_bonus[0]), int(v.last_rejected[0]), float(v.next_p[0]),
                   float(v.next_q[0]), v.path[0, :n].tolist(), tree.tokens.tolist(), v.kinds[0].tolist(),
                   [True] * tree.size, p, q, ratio, u, tol, list(tree.scores), list(tree.priorities), max_p, dist,
                   exact)

    def records(self, tree: DraftTree, produced: int, step: int) -> tuple[list[TokenEvent], list[DraftRecord], TreeRecord]:
        """Token events, draft records and the tree record of the nodes that are alive."""
        kinds, n, par = [KIND_NAMES[DraftKind(c)] for c in self.kinds], self.num_accepted, tree.parents
        dist = self.distortion or [0.0] * (n + 1)
        exact = self.distortion_exact[: n + 1]
        events = [TokenEvent(step, produced + e, self.tokens[a], "", kinds[a], self.p[a], self.q[a], self.ratio[a],
                             self.u[a], self.tolerance[a], self.max_p[par[a] + 1], dist[e])
                  for e, a in enumerate(self.path)]
        stop = 0 if n == 0 else self.path[-1] + 1
        next_kind = ("bonus" if tree.size else "target") if self.is_bonus else "resampled"
        if self.is_bonus:
            events.append(TokenEvent(step, produced + n, self.next_token, "", next_kind, self.next_p, None, None, None,
                                     None, self.max_p[stop], 0.0))
        else:
            r = self.last_rejected
            events.append(TokenEvent(step, produced + n, self.next_token, "", next_kind, self.next_p, self.next_q,
                                     self.ratio[r], self.u[r], self.tolerance[r], self.max_p[stop], dist[n],
                                     rejected_token=self.tokens[r]))
        tested = sorted((i for i in range(tree.size) if kinds[i]), key=lambda i: (tree.depths[i], tree.ranks[i]))
        drafts = [DraftRecord(produced + tree.depths[i] - 1, self.tokens[i], kinds[i], self.p[i], self.q[i],
                              self.ratio[i], self.u[i], self.tolerance[i], self.max_p[par[i] + 1]) for i in tested]
        kept = [i for i in range(tree.size) if self.alive[i]]
        new = {old: j for j, old in enumerate(kept)}
        record = TreeRecord(step, produced, [self.tokens[i] for i in kept], [new.get(par[i], -1) for i in kept],
                            [tree.depths[i] for i in kept], [tree.ranks[i] for i in kept],
                            [self.scores[i] for i in kept], [self.priorities[i] for i in kept],
                            [kinds[i] for i in kept], [new[a] for a in self.path], self.next_token, next_kind, exact)
        return events, drafts, record
