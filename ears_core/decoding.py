"""The decode loops: speculative (generate / stream) and target-only (autoregressive).

Terms
-----
round (step)   the draft proposes k tokens; the target scores [last token, x_1..x_k] in ONE
               forward pass, giving P_target at k + 1 positions; verify() keeps n drafts and
               emits one more token (resampled or bonus); both KV caches are cut back to the
               kept prefix. A round emits n + 1 tokens.
KV rollback    the target's cache always holds the committed sequence minus its last token;
               after a round it held k extra positions and loses the k - n that did not stand.
               The prompt is encoded once.
k per round    gamma, but never more than the tokens still allowed minus one, so that
               ``max_new_tokens`` is exact without throwing work away.
draws          derived from (seed, output position) per stream (see sampling.py): two rules on
               the same prompt and seed make the same decisions until the first position
               where their rules disagree.
host syncs     one per round (the verdict, needed to cut the caches and build events) and one
               per token for target-only decoding. No ``.item()`` per position.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from .drafters import Drafter, ModelDrafter, model_vocab_size
from .events import DraftRecord, StepRecord, TokenEvent
from .metrics import GenerationStats, summarize
from .rules import AcceptanceRule, StandardRule
from .sampling import SamplingConfig, Stream, counter_uniforms, logits_to_probs, sample_with_uniforms
from .text import Detokenizer
from .timing import StepClock as _Clock  # CUDA events on a GPU, read after the round's sync
from .verify import DraftKind, verify

__all__ = ["GenerationResult", "Generation", "generate", "stream", "autoregressive"]

_DRAFT_KIND = {DraftKind.ACCEPTED: "accepted", DraftKind.PARDONED: "pardoned", DraftKind.REJECTED: "rejected"}


@dataclass
class GenerationResult:
    token_ids: list[int]  # new tokens only
    text: str
    events: list[TokenEvent]
    steps: list[StepRecord]
    stats: GenerationStats


@dataclass
class _Config:
    gamma: int
    sampling: SamplingConfig
    max_new_tokens: int
    seed: int
    vocab_size: int
    eos: frozenset[int]
    with_distortion: bool


class Generation:
    """An iterator of TokenEvents as they are decided; ``result()`` once it is exhausted.

    ``events`` and ``steps`` grow live, so a UI can read step records while iterating.
    """

    def __init__(self, method: str, gamma: int, steps: list[StepRecord], events_iter: Iterator[TokenEvent]) -> None:
        self.method = method
        self.gamma = gamma
        self.events: list[TokenEvent] = []
        self.steps = steps  # appended to by the decode loop, one record per round
        self._it = events_iter
        self._t0: float | None = None
        self.wall_s = 0.0
        self.done = False

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> TokenEvent:
        if self._t0 is None:
            self._t0 = time.perf_counter()
        try:
            ev = next(self._it)
        except StopIteration:
            self.done = True
            raise
        finally:
            self.wall_s = time.perf_counter() - self._t0
        self.events.append(ev)
        return ev

    def result(self) -> GenerationResult:
        for _ in self:  # finish if the caller stopped early
            pass
        ids = [e.token_id for e in self.events]
        text = "".join(e.text for e in self.events)
        stats = summarize(self.method, self.events, self.steps, self.wall_s, self.gamma)
        return GenerationResult(ids, text, self.events, self.steps, stats)


# ----------------------------------------------------------------------------- input checks


def _as_input_ids(input_ids: Any, device: torch.device) -> Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(
            f"input_ids must be one prompt of shape (T,) or (1, T), got {tuple(ids.shape)}; the "
            "decoder runs one prompt at a time (verify() itself is batched)"
        )
    if ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token (type some text)")
    return ids.to(device)


def _eos_set(target: PreTrainedModel, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        gc = getattr(target, "generation_config", None)
        eos_token_id = getattr(gc, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(t) for t in eos_token_id)


def _make_config(
    target: PreTrainedModel,
    ids: Tensor,
    *,
    gamma: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    max_new_tokens: int,
    seed: int,
    vocab_size: int,
    eos_token_id: Any,
    with_distortion: bool,
) -> _Config:
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (K, drafts per round) must be an integer >= 1, got {gamma!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    sampling = SamplingConfig(temperature, top_k, top_p)
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"target's context length ({limit}); shorten the prompt or lower max_new_tokens"
        )
    if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        raise ValueError(f"input_ids hold token ids outside the vocabulary [0, {vocab_size})")
    return _Config(gamma, sampling, max_new_tokens, seed, vocab_size, _eos_set(target, eos_token_id), with_distortion)


def _shared_vocab(target: PreTrainedModel, draft_vocab: int, vocab_size: int | None) -> int:
    target_vocab = model_vocab_size(target)
    if vocab_size is not None:
        if vocab_size > min(target_vocab, draft_vocab):
            raise ValueError(
                f"vocab_size={vocab_size} is larger than the target's ({target_vocab}) or the "
                f"draft's ({draft_vocab}) output head"
            )
        return vocab_size
    if target_vocab != draft_vocab:
        raise ValueError(
            f"draft and target vocabularies differ ({draft_vocab} vs {target_vocab} tokens): the "
            "models must share a tokenizer. If one only pads its output head, pass "
            "vocab_size=len(tokenizer)"
        )
    return target_vocab


# ----------------------------------------------------------------------------- speculative


def _speculative_events(
    target: PreTrainedModel, drafter: Drafter, ids: Tensor, rule: AcceptanceRule, cfg: _Config,
    steps: list[StepRecord], detok: Detokenizer,
) -> Iterator[TokenEvent]:
    dev = ids.device
    clock = _Clock(dev)

    def probs_fn(logits: Tensor) -> Tensor:
        return logits_to_probs(logits[..., : cfg.vocab_size], cfg.sampling)

    need_h = bool(getattr(drafter, "needs_target_hidden", False))  # an EAGLE-style head reads them
    with torch.inference_mode():
        cache = DynamicCache(config=target.config)
        hidden = None
        if ids.shape[1] > 1:
            out = target(ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1, output_hidden_states=need_h)
            hidden = out.hidden_states[-1] if need_h else None  # (1, T-1, d)
        drafter.prefill(ids, hidden)
    last = ids[:, -1:]  # (1, 1) the committed token the target has not seen
    produced, step = 0, 0
    while produced < cfg.max_new_tokens:
        k = min(cfg.gamma, cfg.max_new_tokens - produced - 1)
        pos = torch.arange(produced, produced + k + 1, device=dev)  # (k+1,) output positions
        with torch.inference_mode():
            t0 = clock.mark()
            tokens, dprobs = drafter.propose(k, probs_fn, counter_uniforms(cfg.seed, pos[:k], Stream.DRAFT)[None])
            if tokens.shape[1] < k:  # a drafter may stop early (no n-gram match, low confidence)
                k = tokens.shape[1]
                pos = pos[: k + 1]
            t1 = clock.mark()
            out = target(torch.cat([last, tokens], dim=1), past_key_values=cache, use_cache=True, logits_to_keep=k + 1,
                         output_hidden_states=need_h)
            tprobs = probs_fn(out.logits)  # (1, k+1, V)
            t2 = clock.mark()
            v = verify(
                tprobs, dprobs, tokens, rule,
                uniforms=counter_uniforms(cfg.seed, pos[:k], Stream.ACCEPT)[None],  # (1, k)
                sample_uniforms=counter_uniforms(cfg.seed, pos, Stream.TARGET)[None],  # (1, k+1)
                with_distortion=cfg.with_distortion,
            )
            dist = v.distortion if v.distortion is not None else torch.zeros_like(v.p)
            packed = torch.cat([
                v.num_accepted.double(), v.next_token.double(), v.next_p.double(), v.next_q.double(),
                tokens[0].double(), v.kinds[0].double(), v.p[0].double(), v.q[0].double(),
                v.ratio[0].double(), v.u[0].double(), v.tolerance[0].double(), dist[0].double(),
                v.max_p[0].double(),
            ]).tolist()  # the round's one host sync
        n = int(packed[0])
        if k > n:
            cache.crop(n - k)  # drop the target's positions for drafts that did not stand
        drafter.commit(n, v.next_token, out.hidden_states[-1] if need_h else None)  # (1, k+1, d)
        last = v.next_token.view(1, 1)
        events, drafts = _round_records(packed, k, produced, step)
        stop = False
        for j, ev in enumerate(events):
            if ev.token_id in cfg.eos:
                events, stop = events[: j + 1], True
                break
        pardoned = sum(1 for d in drafts if d.kind == "pardoned")
        steps.append(StepRecord(step, k, n, pardoned, len(events), clock.ms(t0, t1), clock.ms(t1, t2), drafts))
        for ev in events:
            ev.text = detok.add(ev.token_id)
            yield ev
        produced += len(events)
        step += 1
        if stop:
            return



def _round_records(packed: list[float], k: int, produced: int, step: int) -> tuple[list[TokenEvent], list[DraftRecord]]:
    """Unpack one round's verdict (already on the host) into token events and draft records."""
    n, nxt, next_p, next_q = int(packed[0]), int(packed[1]), packed[2], packed[3]
    toks, kinds, p, q, ratio, u, tol, dst = (packed[4 + i * k : 4 + (i + 1) * k] for i in range(8))
    max_p = packed[4 + 8 * k :]  # k + 1 values
    kind_of = [_DRAFT_KIND.get(DraftKind(int(c)), "") for c in kinds]
    events = [
        TokenEvent(step, produced + i, int(toks[i]), "", kind_of[i], p[i], q[i], ratio[i], u[i], tol[i], max_p[i], dst[i])
        for i in range(n)
    ]
    if n < k:
        events.append(TokenEvent(
            step, produced + n, nxt, "", "resampled", next_p, next_q, ratio[n], u[n], tol[n], max_p[n], dst[n],
            rejected_token=int(toks[n]),
        ))
    else:  # all k drafts stood; with k = 0 (nothing drafted) it is a plain target step
        kind = "bonus" if k > 0 else "target"
        events.append(TokenEvent(step, produced + n, nxt, "", kind, next_p, None, None, None, None, max_p[k], 0.0))
    drafts = [
        DraftRecord(produced + i, int(toks[i]), kind_of[i], p[i], q[i], ratio[i], u[i], tol[i], max_p[i])
        for i in range(min(n + 1, k))
    ]
    return events, drafts


# ----------------------------------------------------------------------------- target only


def _autoregressive_events(
    target: PreTrainedModel, ids: Tensor, cfg: _Config, steps: list[StepRecord], detok: Detokenizer
) -> Iterator[TokenEvent]:
    clock = _Clock(ids.device)
    u_all = counter_uniforms(cfg.seed, torch.arange(cfg.max_new_tokens, device=ids.device), Stream.TARGET)
    cache = DynamicCache(config=target.config)
    inp = ids
    for n in range(cfg.max_new_tokens):
        with torch.inference_mode():
            t0 = clock.mark()
            logits = target(inp, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, : cfg.vocab_size]
            probs = logits_to_probs(logits, cfg.sampling)  # (1, V)
            tok = sample_with_uniforms(probs, u_all[n : n + 1])  # (1,)
            t1 = clock.mark()
            tok_id, p, max_p = torch.stack([tok[0].double(), probs[0, tok[0]].double(), probs[0].max().double()]).tolist()
        ev = TokenEvent(n, n, int(tok_id), "", "target", p, None, None, None, None, max_p, 0.0)
        steps.append(StepRecord(n, 0, 0, 0, 1, 0.0, clock.ms(t0, t1)))
        ev.text = detok.add(ev.token_id)
        yield ev
        if ev.token_id in cfg.eos:
            return
        inp = tok.view(1, 1)


# ----------------------------------------------------------------------------- public API


def stream(
    target: PreTrainedModel,
    draft: PreTrainedModel | Drafter,
    input_ids: Any,
    *,
    rule: AcceptanceRule | None = None,
    gamma: int = 5,
    temperature: float = 0.9,
    max_new_tokens: int = 128,
    seed: int = 0,
    top_k: int | None = None,
    top_p: float | None = None,
    tokenizer: Any | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    vocab_size: int | None = None,
    with_distortion: bool = True,
) -> Generation:
    """Speculative decoding of one prompt; iterate the result for TokenEvents as they are decided.

    ``draft`` is a Hugging Face causal LM sharing the target's tokenizer, or any ``Drafter``.
    ``rule`` defaults to StandardRule (lossless). ``tokenizer`` (optional) fills event text.
    """
    rule = StandardRule() if rule is None else rule
    if not isinstance(rule, AcceptanceRule):
        raise ValueError(f"rule must be an AcceptanceRule such as StandardRule() or EARSRule(0.1), got {rule!r}")
    if draft is None:
        raise ValueError("a draft is required for speculative decoding; use autoregressive() for target-only decoding")
    drafter = draft if isinstance(draft, Drafter) else ModelDrafter(draft)
    vocab = _shared_vocab(target, drafter.vocab_size, vocab_size)
    if isinstance(drafter, ModelDrafter):
        drafter.vocab_size = vocab
    ids = _as_input_ids(input_ids, target.device)
    cfg = _make_config(
        target, ids, gamma=gamma, temperature=temperature, top_k=top_k, top_p=top_p,
        max_new_tokens=max_new_tokens, seed=seed, vocab_size=vocab, eos_token_id=eos_token_id,
        with_distortion=with_distortion,
    )
    steps: list[StepRecord] = []
    events = _speculative_events(target, drafter, ids, rule, cfg, steps, Detokenizer(tokenizer))
    return Generation(rule.describe(), gamma, steps, events)


def generate(target: PreTrainedModel, draft: PreTrainedModel | Drafter, input_ids: Any, **kwargs: Any) -> GenerationResult:
    """Speculative decoding to the end; same arguments as ``stream``. -> GenerationResult."""
    return stream(target, draft, input_ids, **kwargs).result()


def autoregressive_stream(
    target: PreTrainedModel,
    input_ids: Any,
    *,
    temperature: float = 0.9,
    max_new_tokens: int = 128,
    seed: int = 0,
    top_k: int | None = None,
    top_p: float | None = None,
    tokenizer: Any | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    vocab_size: int | None = None,
) -> Generation:
    """Target-only decoding, one token per forward pass: the baseline, streamed."""
    vocab = vocab_size if vocab_size is not None else model_vocab_size(target)
    ids = _as_input_ids(input_ids, target.device)
    cfg = _make_config(
        target, ids, gamma=1, temperature=temperature, top_k=top_k, top_p=top_p,
        max_new_tokens=max_new_tokens, seed=seed, vocab_size=vocab, eos_token_id=eos_token_id,
        with_distortion=False,
    )
    steps: list[StepRecord] = []
    events = _autoregressive_events(target, ids, cfg, steps, Detokenizer(tokenizer))
    return Generation("target-only", 0, steps, events)


def autoregressive(target: PreTrainedModel, input_ids: Any, **kwargs: Any) -> GenerationResult:
    """Target-only decoding to the end; same arguments as ``autoregressive_stream``."""
    return autoregressive_stream(target, input_ids, **kwargs).result()
