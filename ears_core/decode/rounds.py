"""The decode loop: one loop of speculative rounds, whatever the round's shape.

Terms
-----
round       the shape proposes drafts; the target scores [last committed token, drafts] in ONE forward
            pass; the verifier keeps n drafts and emits one more token (*resampled* after a rejection, or
            the *bonus* token when every draft on the way stood); the caches keep the accepted prefix.
            A round emits n + 1 tokens. A round with no drafts is a plain target step (one *target* token).
shape       (``RoundShape``) the four steps that differ between round shapes: ``propose`` / ``score`` /
            ``verify`` / ``commit``. Two ship: a chain of k tokens (chain.py) and a tree of nodes (tree.py).
            A chain is a width-1 tree: the tree shape at width 1 gives the chain's tokens and events, draw
            for draw.
the loop    owns everything else: prefill, the draws, the clock, the cap that keeps ``max_new_tokens``
            exact (a round drafts at most the tokens still allowed minus one), the back-off schedule, the
            end-of-sequence cut, step records, events and the rule's per-round hook. The deadline is
            ``Generation``'s, around the loop.
KV cache    the target's cache holds the committed sequence minus its last token ("last"), which each
            round feeds first; the prompt is encoded once.
draws       derived from (seed, output position) per stream (sampling.py), computed once per generation:
            two rules on the same prompt and seed make the same decisions until the first position where
            they disagree.
back-off    for a shape with a size policy (``backs_off``): a round that asks the drafter is a probe; when a
            probe drafts nothing that pays (``paid``), the next rounds are plain target steps (the drafter is
            told with ``propose(0)``) and the next probe comes 2, then 4, then at most 8 rounds later; a
            probe that paid resets it. The schedule depends on past rounds only, so the output is as exact
            as without it.
host syncs  one per round: the verdict, read to the host once to cut the caches and build the events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

import torch
from torch import Tensor
from transformers import DynamicCache

from ears_core.decode.text import Detokenizer
from ears_core.draft.drafters import target_features
from ears_core.events import DraftRecord, StepRecord, TokenEvent
from ears_core.model.passes.attention import avoid_replanning_attention
from ears_core.model.passes.kv_cache import new_cache
from ears_core.rules import AcceptanceRule, verifying_rule
from ears_core.sampling import SamplingConfig, Stream, counter_uniforms, logits_to_probs
from ears_core.timing import StepClock

if TYPE_CHECKING:  # annotations only: importing it loads transformers' modeling code (seconds)
    from transformers import PreTrainedModel

__all__ = ["DecodeConfig", "Round", "RoundContext", "RoundShape", "Backoff", "decode_rounds", "MAX_BACKOFF"]

MAX_BACKOFF = 8  # rounds between a size policy's probes at most, while drafting does not pay


@dataclass
class DecodeConfig:
    """One request, checked (generation.check_request)."""

    sampling: SamplingConfig
    max_new_tokens: int
    seed: int
    vocab_size: int
    eos: frozenset[int]
    with_distortion: bool  # compute each emitted position's distortion (0 and skipped for a lossless rule)


@dataclass
class RoundContext:
    """What a shape reads from the loop, fixed for the generation."""

    target: PreTrainedModel
    drafter: Any
    rule: AcceptanceRule  # the verifying rule: GreedyRule's path for the ordinary rule at T = 0
    cfg: DecodeConfig
    draws: dict[Stream, Tensor]  # each (positions,): the stream's draw at every output position
    probs_fn: Callable[[Tensor], Tensor]  # logits (..., V_model) -> probabilities (..., V) after T / top-k / top-p
    need_hidden: bool  # the drafter reads the target's hidden states (an EAGLE-style head)
    with_distortion: bool  # asked and the rule is lossy

    @property
    def device(self) -> torch.device:
        return self.draws[Stream.TARGET].device


@dataclass
class Round:
    """One round after its verify, on the host."""

    drafted: int  # drafts sent to the target (a chain's k, a tree's nodes)
    num_accepted: int  # n: drafts that stood
    next_token: Tensor  # (1,) long on the device: the resampled, bonus or target token
    events: list[TokenEvent]  # n + 1, before the end-of-sequence cut
    drafts: list[DraftRecord]  # the drafts that were tested
    pardoned: int  # of the n, how many stood only by the rule's tolerance
    estimates: list[float] = field(default_factory=list)  # a size policy's acceptance estimate per draft
    expected: float | None = None  # the policy's expected tokens for the round
    record: Any = None  # a tree round's TreeRecord


class RoundShape(Protocol):
    depth: int  # the most output positions a round's drafts may cover (K, or the tree's depth)
    backs_off: bool  # a size policy runs the back-off schedule

    def start(self, ctx: RoundContext) -> None: ...
    def propose(self, produced: int, limit: int, plain: bool) -> None: ...  # drafts for positions produced..+limit
    def score(self, cache: DynamicCache, last: Tensor) -> Tensor: ...  # (1, m+1, V) target probabilities
    def verify(self, target_probs: Tensor, produced: int, step: int) -> Round: ...  # the round's one host sync
    def commit(self, cache: DynamicCache, rnd: Round) -> None: ...  # both caches to the accepted prefix
    def paid(self, rnd: Round) -> bool: ...  # a probe's drafting paid (the back-off resets)
    def learn(self, rnd: Round) -> None: ...  # a size policy learns from the round
    def timed(self, round_ms: float, target_ms: float) -> None: ...  # ... and from its measured time


class Backoff:
    """The probe schedule of a size policy (module terms)."""

    def __init__(self, on: bool) -> None:
        self.on, self.wait, self.skip = on, 1, 0

    def next(self, limit: int) -> tuple[bool, bool]:
        """-> (probe, plain) for a round that may draft ``limit`` positions."""
        probe = self.on and self.skip == 0 and limit > 0
        plain = self.on and not probe
        if plain:
            self.skip = max(self.skip - 1, 0)
        return probe, plain

    def after_probe(self, paid: bool) -> None:
        self.wait = 1 if paid else min(2 * self.wait, MAX_BACKOFF)
        self.skip = self.wait - 1


def cut_at_eos(events: list[TokenEvent], eos: frozenset[int]) -> tuple[list[TokenEvent], bool]:
    """The events up to and including the first end-of-sequence token; and whether there was one."""
    for j, ev in enumerate(events):
        if ev.token_id in eos:
            return events[: j + 1], True
    return events, False


def decode_rounds(target: PreTrainedModel, drafter: Any, shape: RoundShape, ids: Tensor, rule: AcceptanceRule,
                  cfg: DecodeConfig, steps: list[StepRecord], trees: list[Any], detok: Detokenizer) -> Iterator[TokenEvent]:
    """Decode ``ids`` (1, T) round by round; yields TokenEvents, appends StepRecords (and TreeRecords)."""
    dev = ids.device
    avoid_replanning_attention(dev)  # a verify pass of a new width each round: no per-shape cuDNN plans
    clock = StepClock(dev)  # CUDA events on a GPU, read after the round's sync
    rule = verifying_rule(rule, cfg.sampling.greedy)  # the same verdicts; GreedyRule's for the ordinary rule at T = 0
    every = torch.arange(cfg.max_new_tokens + shape.depth + 1, device=dev)  # every output position a round may use

    def probs_fn(logits: Tensor) -> Tensor:
        return logits_to_probs(logits[..., : cfg.vocab_size], cfg.sampling)

    probs_fn.sampling_key = (cfg.vocab_size, cfg.sampling)  # names what it computes (draft/step_graphs.py)
    ctx = RoundContext(
        target, drafter, rule, cfg, {s: counter_uniforms(cfg.seed, every, s) for s in Stream}, probs_fn,
        bool(getattr(drafter, "needs_target_hidden", False)), cfg.with_distortion and not rule.lossless)
    observe = getattr(rule, "observe_round", None)  # a rule with state across rounds (e.g. a distortion budget)
    with torch.inference_mode():
        cache = new_cache(target)
        hidden = None
        if ids.shape[1] > 1:
            out = target(ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=ctx.need_hidden)
            hidden = target_features(out, drafter)  # (1, T-1, n*d) or None
        drafter.prefill(ids, hidden)
    shape.start(ctx)
    schedule = Backoff(shape.backs_off)
    last = ids[:, -1:]  # (1, 1) the committed token the target has not seen
    produced = step = 0
    while produced < cfg.max_new_tokens:
        limit = min(shape.depth, cfg.max_new_tokens - produced - 1)
        probe, plain = schedule.next(limit)
        with torch.inference_mode():
            t0 = clock.mark()
            shape.propose(produced, 0 if plain else limit, plain)
            t1 = clock.mark()
            target_probs = shape.score(cache, last)  # (1, m+1, V)
            t2 = clock.mark()
            rnd = shape.verify(target_probs, produced, step)
            shape.commit(cache, rnd)
        last = rnd.next_token.view(1, 1)
        if probe:
            schedule.after_probe(shape.paid(rnd))
        events, stop = cut_at_eos(rnd.events, cfg.eos)
        shape.learn(rnd)
        t3 = clock.mark()
        steps.append(StepRecord(step, rnd.drafted, rnd.num_accepted, rnd.pardoned, len(events), clock.ms(t0, t1),
                                clock.ms(t1, t2), rnd.drafts, clock.ms(t2, t3), rnd.estimates, rnd.expected))
        shape.timed(clock.ms(t0, t3), clock.ms(t1, t2))
        if rnd.record is not None:
            trees.append(rnd.record)
        if observe is not None:
            observe(events)
        for ev in events:
            ev.text = detok.add(ev.token_id)
            yield ev
        produced += len(events)
        step += 1
        if stop:
            return
