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
               per token for target-only decoding; on the CPU, where a read is free, verify() reads
               n early to skip work (``emitted_only``). No ``.item()`` per position. With a draft-length
               policy, one more per drafted position (the drafter's confidence, read before the draw).
policy         (``costs.DraftPolicy``) each round sends the drafts that pay on this machine. A round
               that asks the drafter is a probe; when a probe drafts nothing, the next rounds are
               plain target steps (k = 0, no drafter call, the head's update queued) and the next
               probe comes 2, then 4, then at most 8 rounds later; a probe that drafts resets it.
               It backs off only while an average first draft (the calibration's mean at depth 1)
               would not pay: where drafting is cheap (a flat price curve) every round is a probe,
               and a low-confidence round costs one head step, not the next seven rounds' drafts.
               The schedule depends on past rounds only, so the output is as exact as without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from ears_core.policy.costs import expected_tokens
from ears_core.draft.drafters import Drafter, ModelDrafter, model_vocab_size, target_features
from ears_core.events import DraftRecord, StepRecord, TokenEvent
from ears_core.model.kv_cache import drop_last_positions
from ears_core.metrics import GenerationStats, summarize
from ears_core.rules import AcceptanceRule, StandardRule, verifying_rule
from ears_core.sampling import SamplingConfig, Stream, counter_uniforms, first_argmax, logits_to_probs, sample_with_uniforms
from ears_core.decode.text import Detokenizer
from ears_core.timing import StepClock as _Clock  # CUDA events on a GPU, read after the round's sync
from ears_core.decode.verify import DraftKind, check_enabled, verify

__all__ = ["GenerationResult", "Generation", "generate", "stream", "autoregressive"]

_DRAFT_KIND = {DraftKind.ACCEPTED: "accepted", DraftKind.PARDONED: "pardoned", DraftKind.REJECTED: "rejected"}


@dataclass
class GenerationResult:
    token_ids: list[int]  # new tokens only
    text: str
    events: list[TokenEvent]
    steps: list[StepRecord]
    stats: GenerationStats
    timed_out: bool = False  # the deadline stopped decoding: the tokens so far


@dataclass
class _Config:
    gamma: int
    sampling: SamplingConfig
    max_new_tokens: int
    seed: int
    vocab_size: int
    eos: frozenset[int]
    with_distortion: bool
    policy: Any = None  # costs.DraftPolicy: how many drafts each round sends; None: always gamma
    calibration: Any = None  # costs.Calibration: drafter confidence -> acceptance estimate


class Generation:
    """An iterator of TokenEvents as they are decided; ``result()`` once it is exhausted (or stopped).

    ``events`` and ``steps`` grow live, so a UI can read step records while iterating.
    clock      ``decode_s`` counts only the time spent inside ``next()`` (decoding), never the
               caller's time between tokens (rendering), so a run that streams charts and one
               that does not are measured alike; ``samples`` holds (decode_s, tokens so far) after
               every token, for a throughput chart.
    deadline   ``deadline_s`` seconds of decoding at most: once they are spent (and at least one
               token is out) iteration ends, ``timed_out`` is set and ``result()`` gives the tokens
               so far.
    """

    def __init__(self, method: str, gamma: int, steps: list[StepRecord], events_iter: Iterator[TokenEvent],
                 deadline_s: float | None = None) -> None:
        self.method = method
        self.gamma = gamma
        self.events: list[TokenEvent] = []
        self.steps = steps  # appended to by the decode loop, one record per round
        self.samples: list[tuple[float, int]] = [(0.0, 0)]
        self.deadline_s = deadline_s
        self.decode_s = 0.0
        self.timed_out = False
        self._it = events_iter
        self._finished = False

    @property
    def wall_s(self) -> float:
        return self.decode_s

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> TokenEvent:
        if self._finished:
            raise StopIteration
        if self.deadline_s is not None and self.events and self.decode_s >= self.deadline_s:
            self.timed_out = self._finished = True
            raise StopIteration
        t0 = time.perf_counter()
        try:
            ev = next(self._it)
        except StopIteration:
            self._finished = True
            raise
        finally:
            self.decode_s += time.perf_counter() - t0
        self.events.append(ev)
        self.samples.append((self.decode_s, len(self.events)))
        return ev

    def stats(self) -> GenerationStats:
        """Metrics of the tokens so far, on the decode clock."""
        return summarize(self.method, self.events, self.steps, self.decode_s, self.gamma)

    def result(self) -> GenerationResult:
        """Finish decoding (unless the deadline passed) and fold everything into a result."""
        for _ in self:
            pass
        ids = [e.token_id for e in self.events]
        text = "".join(e.text for e in self.events)
        return GenerationResult(ids, text, self.events, self.steps, self.stats(), self.timed_out)


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
    _check_request(target, ids, max_new_tokens, seed, vocab_size)
    sampling = SamplingConfig(temperature, top_k, top_p)
    return _Config(gamma, sampling, max_new_tokens, seed, vocab_size, _eos_set(target, eos_token_id), with_distortion)


def _check_request(target: PreTrainedModel, ids: Tensor, max_new_tokens: Any, seed: Any, vocab_size: int) -> None:
    """The checks every decode loop makes of a request: length, seed, context, token ids."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"target's context length ({limit}); shorten the prompt or lower max_new_tokens"
        )
    if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        raise ValueError(f"input_ids hold token ids outside the vocabulary [0, {vocab_size})")


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
    rule = verifying_rule(rule, cfg.sampling.greedy)  # the same verdicts; GreedyRule's for the ordinary rule at T = 0

    def probs_fn(logits: Tensor) -> Tensor:
        return logits_to_probs(logits[..., : cfg.vocab_size], cfg.sampling)

    need_h = bool(getattr(drafter, "needs_target_hidden", False))  # an EAGLE-style head reads them
    check = check_enabled(dev)  # verify()'s drafter guard: a host read, skipped on CUDA
    emitted_only = dev.type == "cpu"  # verify() reads n first and skips the work no emitted token needs
    support = getattr(drafter, "support", None)  # (N,) tokens outside which the drafter's q is 0, or None
    observe = getattr(rule, "observe_round", None)  # rule.observe_round(events): the round's TokenEvents
    with_distortion = cfg.with_distortion and not rule.lossless  # 0 for a lossless rule: not computed
    policy, calib = cfg.policy, cfg.calibration
    estimates: list[float] = []  # this round's acceptance estimates, one per position kept
    free_positions = bool(getattr(drafter, "free_positions", False))  # n-gram: no step per position

    def keep(conf: float | None, limit: int) -> bool:
        """Asked by the drafter before each draw: verify one more position? (costs.DraftPolicy)
        conf None: asked before the drafter computes the position at all (a head step costs ~1/15 of
        a target step): would an average draft at this depth pay after the drafts so far? (A
        position that would not is rarely worth the head step that finds out.)"""
        depth = len(estimates) + 1
        if conf is None:
            return policy.keep_going([*estimates, policy.prior_at(depth)], limit)  # the round's prior: calib.means(k)
        estimates.append(calib(conf, depth))
        # depth >= 2: the drafter ran a model step to find this confidence (depth 1's comes from
        # feeding the committed tokens, which the next drafting round would need anyway)
        if policy.keep_going(estimates, limit, looked=depth > 1 and not free_positions):
            return True
        estimates.pop()
        return False
    with torch.inference_mode():
        cache = DynamicCache(config=target.config)
        hidden = None
        if ids.shape[1] > 1:
            out = target(ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1, output_hidden_states=need_h)
            hidden = target_features(out, drafter)  # (1, T-1, n*d) or None
        drafter.prefill(ids, hidden)
    last = ids[:, -1:]  # (1, 1) the committed token the target has not seen
    produced, step = 0, 0
    backoff, skip = 1, 0  # the policy's probe schedule (see the module's terms)
    every = torch.arange(cfg.max_new_tokens + cfg.gamma + 1, device=dev)  # every output position a round may use
    draws = {s: counter_uniforms(cfg.seed, every, s) for s in Stream}  # each (positions,): one call per stream
    while produced < cfg.max_new_tokens:
        k = min(cfg.gamma, cfg.max_new_tokens - produced - 1)
        probe = policy is not None and skip == 0 and k > 0
        if policy is not None and not probe:
            k, skip = 0, max(skip - 1, 0)
        span = slice(produced, produced + k + 1)  # the round's k + 1 output positions
        with torch.inference_mode():
            t0 = clock.mark()
            draft_u = draws[Stream.DRAFT][span][None, :k]  # (1, k)
            estimates.clear()
            if policy is None or k == 0:
                tokens, dprobs = drafter.propose(k, probs_fn, draft_u)
            else:
                policy.prior = calib.means(k)  # per depth for a DepthCalibration
                tokens, dprobs = drafter.propose(k, probs_fn, draft_u, keep=lambda c, lim=k: keep(c, lim))
            if tokens.shape[1] < k:  # a drafter may stop early (no n-gram match, the policy)
                k = tokens.shape[1]
                span = slice(produced, produced + k + 1)
            t1 = clock.mark()
            out = target(torch.cat([last, tokens], dim=1), past_key_values=cache, use_cache=True, logits_to_keep=k + 1,
                         output_hidden_states=need_h)
            tprobs = probs_fn(out.logits)  # (1, k+1, V)
            t2 = clock.mark()
            if k == 0:  # a plain target step: what verify() does with no drafts, without its bookkeeping
                next_token, host = _plain_step(rule, tprobs, draws[Stream.TARGET][span])
            else:
                v = verify(
                    tprobs, dprobs, tokens, rule,
                    uniforms=draws[Stream.ACCEPT][span][None, :k],  # (1, k)
                    sample_uniforms=draws[Stream.TARGET][span][None],  # (1, k+1)
                    with_distortion=with_distortion, check=check, emitted_only=emitted_only,
                    draft_support=support,
                )
                next_token, host = v.next_token, _RoundHost.read(v, tokens)  # the round's one host sync
        n = host.num_accepted
        drop_last_positions(cache, k - n)  # the target's positions for drafts that did not stand
        drafter.commit(n, next_token, target_features(out, drafter))  # (1, k+1, n*d) or None
        last = next_token.view(1, 1)
        if probe:  # a probe that drafted nothing backs off (2, 4, then 8 rounds) unless drafting pays on average
            pays = k > 0 or policy.keep_going([calib.means(1)[0]], cfg.gamma)
            backoff = 1 if pays else min(2 * backoff, MAX_BACKOFF)
            skip = backoff - 1
        events, drafts = host.records(k, produced, step)
        stop = False
        for j, ev in enumerate(events):
            if ev.token_id in cfg.eos:
                events, stop = events[: j + 1], True
                break
        pardoned = sum(1 for d in drafts if d.kind == "pardoned")
        expected = None
        if policy is not None:
            confs = list(getattr(drafter, "confidence", []))
            for j in range(min(n + 1, k, len(confs))):  # every verified position teaches the calibration
                calib.observe(confs[j], j < n, depth=j + 1)
            expected = expected_tokens(estimates[:k])[k] if len(estimates) >= k else None
        t3 = clock.mark()
        steps.append(StepRecord(step, k, n, pardoned, len(events), clock.ms(t0, t1), clock.ms(t1, t2), drafts,
                                clock.ms(t2, t3), list(estimates[:k]) if policy is not None else [], expected))
        if observe is not None:  # a rule with state across rounds (e.g. a distortion budget)
            observe(events)
        for ev in events:
            ev.text = detok.add(ev.token_id)
            yield ev
        produced += len(events)
        step += 1
        if stop:
            return



MAX_BACKOFF = 8  # rounds between the policy's probes at most, while drafting does not pay


def _plain_step(rule: AcceptanceRule, tprobs: Tensor, u: Tensor) -> tuple[Tensor, "_RoundHost"]:
    """A round with no drafts: the token from the rule's bonus distribution at position 0 with the
    position's target draw, exactly as verify() would emit it. tprobs (1, 1, V), u (1,)."""
    at = tprobs[:, 0]  # (1, V)
    tok = first_argmax(at) if rule.argmax_only else sample_with_uniforms(rule.bonus(at), u)  # (1,): the same token
    p, max_p = torch.stack([at[0, tok[0]], at[0].max()]).double().tolist()  # the round's one host sync
    return tok, _RoundHost(0, int(tok[0]), p, 0.0, [], [], [], [], [], [], [], [], [max_p])


@dataclass
class _RoundHost:
    """One round's verdict on the host, by name: built with a single device-to-host copy."""

    num_accepted: int
    next_token: int
    next_p: float
    next_q: float
    tokens: list[int]  # (k,) drafted tokens
    kinds: list[int]  # (k,) DraftKind values
    p: list[float]
    q: list[float]
    ratio: list[float]
    u: list[float]
    tolerance: list[float]
    distortion: list[float]
    max_p: list[float]  # (k + 1,)

    @classmethod
    def read(cls, v: Any, tokens: Tensor) -> "_RoundHost":
        """Row 0 of a Verdict in one float64 vector (token ids are exact in float64): few ops, since
        each costs more after a model pass, and one device-to-host copy."""
        k = tokens.shape[1]
        dist = v.distortion if v.distortion is not None else v.p.new_zeros(v.p.shape)
        floats = torch.cat([v.p[0], v.q[0], v.ratio[0], v.u[0], v.tolerance[0], dist[0], v.max_p[0],
                            v.next_p, v.next_q])  # (7k + 3,)
        ints = torch.cat([v.num_accepted, v.next_token, tokens[0], v.kinds[0].long()])  # (2 + 2k,)
        f = torch.cat([floats.double(), ints.double()]).tolist()  # the one sync
        i = [int(x) for x in f[7 * k + 3:]]
        col = lambda j, n=k: f[j * k: j * k + n]  # noqa: E731
        return cls(num_accepted=i[0], next_token=i[1], next_p=f[7 * k + 1], next_q=f[7 * k + 2],
                   tokens=i[2: 2 + k], kinds=i[2 + k:], p=col(0), q=col(1), ratio=col(2), u=col(3),
                   tolerance=col(4), distortion=col(5), max_p=col(6, k + 1))

    def records(self, k: int, produced: int, step: int) -> tuple[list[TokenEvent], list[DraftRecord]]:
        """Token events (n drafts that stood, then the resampled or bonus token) and draft records."""
        n = self.num_accepted
        kind_of = [_DRAFT_KIND.get(DraftKind(c), "") for c in self.kinds]
        events = [
            TokenEvent(step, produced + i, self.tokens[i], "", kind_of[i], self.p[i], self.q[i], self.ratio[i],
                       self.u[i], self.tolerance[i], self.max_p[i], self.distortion[i])
            for i in range(n)
        ]
        if n < k:
            events.append(TokenEvent(
                step, produced + n, self.next_token, "", "resampled", self.next_p, self.next_q, self.ratio[n],
                self.u[n], self.tolerance[n], self.max_p[n], self.distortion[n], rejected_token=self.tokens[n],
            ))
        else:  # all k drafts stood; with k = 0 (nothing drafted) it is a plain target step
            kind = "bonus" if k > 0 else "target"
            events.append(TokenEvent(step, produced + n, self.next_token, "", kind, self.next_p, None, None, None,
                                     None, self.max_p[k], 0.0))
        drafts = [
            DraftRecord(produced + i, self.tokens[i], kind_of[i], self.p[i], self.q[i], self.ratio[i], self.u[i],
                        self.tolerance[i], self.max_p[i])
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
            # (1,): at T = 0 probs is one-hot, and the draw from it is its argmax
            tok = first_argmax(probs) if cfg.sampling.greedy else sample_with_uniforms(probs, u_all[n : n + 1])
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
    deadline_s: float | None = None,
    policy: Any = None,
    calibration: Any = None,
) -> Generation:
    """Speculative decoding of one prompt; iterate the result for TokenEvents as they are decided.

    ``draft`` is a Hugging Face causal LM sharing the target's tokenizer, or any ``Drafter``.
    ``rule`` defaults to StandardRule (lossless). ``tokenizer`` (optional) fills event text.
    ``deadline_s``: stop after this many seconds of decoding, keeping the tokens so far.
    ``policy`` (``costs.DraftPolicy``): each round sends as many drafts (0 .. gamma) as the measured
    prices and the acceptance estimates (``calibration``, a ``costs.Calibration``) say pay; None:
    always gamma. The policy reads only the draft side before each draw: every rule stays exactly
    as lossless (or as distorted) as without it.
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
    if policy is not None:
        from ears_core.policy.costs import Calibration
        cfg.policy, cfg.calibration = policy, calibration if calibration is not None else Calibration()
    steps: list[StepRecord] = []
    events = _speculative_events(target, drafter, ids, rule, cfg, steps, Detokenizer(tokenizer))
    return Generation(rule.describe(), gamma, steps, events, deadline_s)


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
    deadline_s: float | None = None,
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
    return Generation("target-only", 0, steps, events, deadline_s)


def autoregressive(target: PreTrainedModel, input_ids: Any, **kwargs: Any) -> GenerationResult:
    """Target-only decoding to the end; same arguments as ``autoregressive_stream``."""
    return autoregressive_stream(target, input_ids, **kwargs).result()
