"""Tree decoding (seed 002): each round verifies a tree of drafts in one target pass.

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
             each round's tree is kept in ``TreeGeneration.trees`` as a ``TreeRecord``. For a sibling
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
             decoder's policy does; ``propose(0)`` / ``commit(0, ...)``). The schedule depends on past
             rounds only, so the output stays exact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from ears_core.decode.chain import MAX_BACKOFF, Generation, GenerationResult, _as_input_ids, _check_request, _eos_set, _shared_vocab
from ears_core.draft.drafters import Drafter, ModelDrafter, layers_side_by_side, target_features
from ears_core.events import DraftRecord, StepRecord, TokenEvent
from ears_core.model.kv_cache import drop_last_positions, keep_tail_positions
from ears_core.rules import AcceptanceRule, StandardRule, verifying_rule
from ears_core.sampling import SamplingConfig, Stream, counter_uniforms, logits_to_probs
from ears_core.decode.text import Detokenizer
from ears_core.timing import StepClock
from ears_core.draft.trees import (
    DraftTree, KeepFn, LevelFn, TreeDraws, TreeSpec, accept_uniforms, tree_attention_mask, tree_position_ids,
)
from ears_core.decode.verify import DraftKind
from ears_core.decode.tree_walk import walk_tree
from ears_core.decode.verify_tree import verify_tree

__all__ = ["TreeRecord", "TreeGeneration", "tree_stream", "tree_generate", "score_tree", "keep_path"]

_KIND = {int(DraftKind.ACCEPTED): "accepted", int(DraftKind.PARDONED): "pardoned", int(DraftKind.REJECTED): "rejected",
         int(DraftKind.NOT_EVALUATED): ""}


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


class TreeGeneration(Generation):
    """A ``Generation`` whose rounds also leave a ``TreeRecord`` each in ``trees``."""

    def __init__(self, method: str, budget: int, steps: list[StepRecord], trees: list[TreeRecord],
                 events_iter: Iterator[TokenEvent], deadline_s: float | None = None) -> None:
        super().__init__(method, budget, steps, events_iter, deadline_s)
        self.trees = trees


# ----------------------------------------------------------------------------- the target's side


def score_tree(target: PreTrainedModel, cache: DynamicCache, last: Tensor, tree: DraftTree,
               need_hidden: bool = False, layers: Sequence[int] = (-1,)) -> tuple[Tensor, Tensor | None]:
    """One target pass over [last (1, 1), tree nodes] on top of ``cache``.

    -> logits (1, N+1, V_model): entry 0 judges the root's children, entry i + 1 those of node i;
    and, if ``need_hidden``, the hidden states of ``layers`` side by side (1, N+1, len(layers) * d)."""
    ids = torch.cat([last, tree.tokens[None].to(last.device)], dim=1)  # (1, N+1)
    mask = pos = None
    if not tree.is_chain():  # a chain is an ordinary causal pass
        length = cache.get_seq_length()
        entries = list(range(tree.size + 1))
        mask = tree_attention_mask(tree.parents, length, entries, entries, target.dtype, last.device)
        pos = tree_position_ids(tree.depths, length, entries, last.device)
    out = target(ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                 output_hidden_states=need_hidden)
    return out.logits, (layers_side_by_side(out.hidden_states, tuple(layers)) if need_hidden else None)


def keep_path(cache: DynamicCache, prefix_len: int, tree_size: int, path: Sequence[int]) -> None:
    """After a tree pass: keep the first ``prefix_len`` positions (the committed prefix and the
    root) and the path's nodes, in order; drop the other nodes."""
    if list(path) == list(range(len(path))):  # the path is the first nodes: a plain crop
        drop_last_positions(cache, tree_size - len(path))
        return
    dev = cache.layers[0].keys.device
    nodes = torch.tensor(list(path), dtype=torch.long, device=dev)
    keep_tail_positions(cache, prefix_len, prefix_len + nodes)


# ----------------------------------------------------------------------------- the loop


@dataclass
class _Config:
    spec: TreeSpec
    sampling: SamplingConfig
    max_new_tokens: int
    seed: int
    vocab_size: int
    eos: frozenset[int]
    with_distortion: bool
    keep: KeepFn | None
    backoff: bool = False
    level: LevelFn | None = None


def _tree_events(target: PreTrainedModel, drafter: Any, ids: Tensor, rule: AcceptanceRule, cfg: _Config,
                 steps: list[StepRecord], trees: list[TreeRecord], detok: Detokenizer) -> Iterator[TokenEvent]:
    dev = ids.device
    clock = StepClock(dev)

    def probs_fn(logits: Tensor) -> Tensor:
        return logits_to_probs(logits[..., : cfg.vocab_size], cfg.sampling)

    def rank_fn(logits: Tensor) -> Tensor:  # slots and scores by the raw draft (T = 1), at any temperature
        return torch.softmax(logits[..., : cfg.vocab_size].float(), dim=-1)

    need_h = bool(getattr(drafter, "needs_target_hidden", False))
    rule = verifying_rule(rule, cfg.sampling.greedy)  # the same verdicts; GreedyRule's for the ordinary rule at T = 0
    with_distortion = cfg.with_distortion and not rule.lossless  # 0 for a lossless rule: not computed (as a chain)
    support = getattr(drafter, "support", None)  # (N,) tokens outside which the drafter's q is 0, or None
    walk = dev.type == "cpu"  # the walk on the host: only the tests the route reaches (tree_walk.py)
    with torch.inference_mode():
        cache = DynamicCache(config=target.config)
        hidden = None
        if ids.shape[1] > 1:
            out = target(ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1, output_hidden_states=need_h)
            hidden = target_features(out, drafter)  # (1, T-1, n*d) or None
        drafter.prefill(ids, hidden)
    last = ids[:, -1:]  # (1, 1)
    produced, step = 0, 0
    observe = getattr(cfg.keep, "observe_round", None)  # a size policy that learns from the rounds
    cost = getattr(cfg.keep, "observe_cost", None)
    backoff, skip = 1, 0  # the size policy's probe schedule (module terms)
    target_draws = counter_uniforms(cfg.seed, torch.arange(cfg.max_new_tokens + cfg.spec.depth + 1, device=dev),
                                    Stream.TARGET)  # (positions,): the next token's draw at every output position
    while produced < cfg.max_new_tokens:
        spec = cfg.spec.capped(cfg.max_new_tokens - produced - 1)
        probe = cfg.backoff and skip == 0 and spec.depth > 0
        plain = cfg.backoff and not probe  # a plain target step: the drafter is not asked
        if plain:
            skip = max(skip - 1, 0)
        with torch.inference_mode():
            t0 = clock.mark()
            if plain:
                drafter.propose(0, probs_fn, torch.empty((1, 0), device=dev))
                tree = DraftTree.empty(cfg.vocab_size, dev)
            else:
                tree = drafter.propose_tree(spec, probs_fn, TreeDraws(cfg.seed, produced, cfg.spec.branching),
                                            greedy=cfg.sampling.greedy, rank_fn=rank_fn, keep=cfg.keep,
                                            level=cfg.level)
            told = hasattr(cfg.keep, "estimates") and not plain  # the policy's estimate per drafted node
            estimates = list(cfg.keep.estimates)[: tree.size] if told else []
            t1 = clock.mark()
            prefix = cache.get_seq_length() + 1  # the committed prefix and the root
            logits, hidden = score_tree(target, cache, last, tree, need_h, tuple(getattr(drafter, "feature_layers", (-1,))))
            tprobs = probs_fn(logits)  # (1, N+1, V)
            t2 = clock.mark()
            depth = tree.max_depth
            v = (walk_tree if walk else verify_tree)(
                tprobs, tree.draft_probs[None], tree.tokens[None], tree.parents, rule,
                uniforms=accept_uniforms(cfg.seed, tree.depths, tree.ranks, produced, dev)[None],  # (1, N)
                sample_uniforms=target_draws[None, produced: produced + depth + 1],  # (1, D+1)
                with_distortion=with_distortion, siblings=tree.siblings, draft_support=support,
            )
            n = int(v.num_accepted[0])  # the round's host sync
            path = v.path[0, :n].tolist()
            keep_path(cache, prefix, tree.size, path)
            if plain:
                drafter.commit(0, v.next_token, hidden[:, :1] if need_h else None)
            else:
                drafter.commit_tree(path, v.next_token, hidden[:, [0] + [1 + a for a in path]] if need_h else None)
        last = v.next_token.view(1, 1)
        if probe:  # a probe the policy left empty backs off: the next ones come 2, 4, then 8 rounds later
            backoff = 1 if tree.size else min(2 * backoff, MAX_BACKOFF)
            skip = backoff - 1
        events, drafts, record = _round_records(v, tree, produced, step)
        stop = False
        for j, ev in enumerate(events):
            if ev.token_id in cfg.eos:
                events, stop = events[: j + 1], True
                break
        pardoned = sum(1 for a in path if record.kinds[a] == "pardoned")
        if observe is not None and not plain:
            observe(record)
        expected = 1.0 + sum(estimates) if told and len(estimates) == tree.size else None
        t3 = clock.mark()
        steps.append(StepRecord(step, tree.size, n, pardoned, len(events), clock.ms(t0, t1), clock.ms(t1, t2), drafts,
                                clock.ms(t2, t3), estimates, expected))
        if cost is not None and not plain:  # a size policy that learns a node's price from the rounds
            cost(tree.size, depth, clock.ms(t0, t3), clock.ms(t1, t2))
        trees.append(record)
        for ev in events:
            ev.text = detok.add(ev.token_id)
            yield ev
        produced += len(events)
        step += 1
        if stop:
            return


def _round_records(v: Any, tree: DraftTree, produced: int, step: int) -> tuple[list[TokenEvent], list[DraftRecord], TreeRecord]:
    """Unpack one round's verdict (row 0) into token events, draft records and the tree record."""
    toks, kinds = tree.tokens.tolist(), [_KIND[int(c)] for c in v.kinds[0].tolist()]
    p, q, ratio, u, tol = (t[0].double().tolist() for t in (v.p, v.q, v.ratio, v.u, v.tolerance))
    max_p = v.max_p[0].double().tolist()
    n, nxt = int(v.num_accepted[0]), int(v.next_token[0])
    path = v.path[0, :n].tolist()
    dist = v.distortion[0].tolist() if v.distortion is not None else [0.0] * (n + 1)
    exact = v.distortion_exact[0].tolist()[: n + 1] if v.distortion_exact is not None else []
    events = [
        TokenEvent(step, produced + e, toks[a], "", kinds[a], p[a], q[a], ratio[a], u[a], tol[a],
                   max_p[tree.parents[a] + 1], dist[e])
        for e, a in enumerate(path)
    ]
    stop_entry = 0 if n == 0 else path[-1] + 1
    next_p, next_q = float(v.next_p[0]), float(v.next_q[0])
    if bool(v.is_bonus[0]):
        kind = "bonus" if tree.size else "target"
        events.append(TokenEvent(step, produced + n, nxt, "", kind, next_p, None, None, None, None, max_p[stop_entry], 0.0))
    else:
        kind, r = "resampled", int(v.last_rejected[0])
        events.append(TokenEvent(step, produced + n, nxt, "", kind, next_p, next_q, ratio[r], u[r], tol[r],
                                 max_p[stop_entry], dist[n], rejected_token=toks[r]))
    tested = sorted((i for i in range(tree.size) if kinds[i]), key=lambda i: (tree.depths[i], tree.ranks[i]))
    drafts = [DraftRecord(produced + tree.depths[i] - 1, toks[i], kinds[i], p[i], q[i], ratio[i], u[i], tol[i],
                          max_p[tree.parents[i] + 1]) for i in tested]
    record = TreeRecord(step, produced, toks, list(tree.parents), list(tree.depths), list(tree.ranks), list(tree.scores),
                        list(tree.priorities), kinds, path, nxt, kind, exact)
    return events, drafts, record


# ----------------------------------------------------------------------------- public API


def tree_stream(
    target: PreTrainedModel,
    drafter: PreTrainedModel | Drafter,
    input_ids: Any,
    *,
    rule: AcceptanceRule | None = None,
    budget: int = 8,
    depth: int = 4,
    width: int | None = None,
    siblings: str = "auto",
    temperature: float = 0.9,
    max_new_tokens: int = 128,
    seed: int = 0,
    top_k: int | None = None,
    top_p: float | None = None,
    tokenizer: Any | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    vocab_size: int | None = None,
    with_distortion: bool = True,
    keep: KeepFn | None = None,
    level: LevelFn | None = None,
    backoff: bool = False,
    deadline_s: float | None = None,
) -> TreeGeneration:
    """Speculative decoding of one prompt with a tree of drafts per round; iterate for TokenEvents.

    ``drafter``: a Hugging Face causal LM sharing the target's tokenizer (wrapped in a
    ModelDrafter) or a drafter with ``propose_tree`` / ``commit_tree`` (ModelDrafter,
    EagleDrafter). budget / depth / width / siblings: the ``TreeSpec``; width=1 with
    budget = depth = K is the chain decoder with gamma = K, token for token. ``keep(priority,
    nodes so far, depth)`` is asked before each node is drawn and ends the round's tree at the
    first False (a size policy from measured prices, ``tree_policy.TreeBudget``: it sees only what
    precedes the draw). ``level``: per-level acceptance estimates for ``keep`` (``trees.build_tree``;
    default: the keep hook's own ``level``, if it has one). ``backoff``: after a round the policy left empty, plain target steps for
    1, 3, then 7 rounds (module terms). ``deadline_s``: stop after this many seconds of decoding,
    keeping the tokens so far (``Generation``).
    """
    rule = StandardRule() if rule is None else rule
    if not isinstance(rule, AcceptanceRule):
        raise ValueError(f"rule must be an AcceptanceRule such as StandardRule() or EARSRule(0.1), got {rule!r}")
    spec = TreeSpec(budget, depth, width, siblings)
    if drafter is not None and not hasattr(drafter, "propose_tree") and isinstance(drafter, PreTrainedModel):
        drafter = ModelDrafter(drafter)
    if drafter is None or not hasattr(drafter, "propose_tree"):
        raise ValueError(f"tree decoding needs a draft model or a drafter with propose_tree(), got {type(drafter).__name__}")
    vocab = _shared_vocab(target, drafter.vocab_size, vocab_size)
    if isinstance(drafter, ModelDrafter):
        drafter.vocab_size = vocab
    ids = _as_input_ids(input_ids, target.device)
    _check_request(target, ids, max_new_tokens, seed, vocab)
    level = level if level is not None else getattr(keep, "level", None)  # a TreeBudget's own estimates
    cfg = _Config(spec, SamplingConfig(temperature, top_k, top_p), max_new_tokens, seed, vocab, _eos_set(target, eos_token_id),
                  with_distortion, keep, bool(backoff and keep is not None), level)
    steps: list[StepRecord] = []
    trees: list[TreeRecord] = []
    events = _tree_events(target, drafter, ids, rule, cfg, steps, trees, Detokenizer(tokenizer))
    method = f"{rule.describe()} tree(budget={budget}, depth={depth}, width={width})"
    return TreeGeneration(method, budget, steps, trees, events, deadline_s)


def tree_generate(target: PreTrainedModel, drafter: PreTrainedModel | Drafter, input_ids: Any,
                  **kwargs: Any) -> GenerationResult:
    """Tree decoding to the end; same arguments as ``tree_stream``. -> GenerationResult (the trees
    are in ``tree_stream(...).trees``; use that to keep them)."""
    return tree_stream(target, drafter, input_ids, **kwargs).result()
