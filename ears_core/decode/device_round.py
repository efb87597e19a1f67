"""The device round: a chain round whose decisions stay tensors until ONE host read at its end.

Terms (round, shape, draws: rounds.py; decision, verdict: verify.py; RoundHost: chain.py)
-----
host read     a transfer the host waits for: ``.item()``, ``.tolist()``, ``.cpu()``, ``bool()`` / ``int()`` /
              ``float()`` of a tensor, or a data-dependent shape (``nonzero``). On CUDA each one stalls the
              host until the GPU has caught up. Today's chain round (chain.py) makes one per draft for the
              draft-length policy (the confidence), one for verify()'s input guard, and on the CPU one for
              n, besides the verdict's. The input guard (a drafter's broken token, verify.check_drafts) runs here
              on every device at no wait of its own: the packed read holds the drafted ids and their q, and the
              host refuses them there (``verify.check_read``); the verdict of such a round is never used.
fixed shape   the drafter drafts exactly k tokens (fewer only if it has none to offer, as an n-gram
              lookup may), k chosen before the round: K, capped by the loop so ``max_new_tokens`` is exact,
              or with a size policy the *planned k*.
planned k     the policy's choice from earlier rounds only: the longest run of depths d = 1, 2, .. at which
              ``keep_going`` says verifying d pays, with every estimate the calibration's mean at its depth
              (``calibration.means``), never this round's confidence. A model drafter records the confidences
              as a tensor (drafters.py: device confidence); they come back with the verdict and teach the
              calibration, as today's round does; a drafter that knows them on the host without a model step
              (the n-gram lookup's ``confidence``) teaches it from there. A probe whose plan is 0 still drafts
              one token (so the calibration keeps learning) and counts as not paid, so the back-off schedule
              runs as before.
decisions     verify.decide_drafts: the rule's accept / pardon test and the leading run n as a cumulative
              product of the flags that stood; no host read.
next token    drawn on the device with the round's counter-based draws at position n by the draw every path
              makes (next_token.py: the inverse CDF of the rule's ``next_mass`` after a rejection, of its
              ``bonus()`` at K; the argmax path takes the target's argmax): bit for bit today's tokens.
packed read   the round's tokens, n, next token, kinds and per-token event fields (p, q, r, U, tolerance,
              max P, distortion) and the drafter's confidences in one float64 vector (``RoundHost.pack``, laid
              out by ``packed.CHAIN_READ``),
              read once (``HostReader``): on CUDA copied into pinned memory with ``non_blocking`` behind an
              event; elsewhere one ``.tolist()``.
KV            the target's and the drafter's caches are cut once, by the n of that read: a cache keeps a
              length over its positions, and the rejected slots are overwritten by the next round's writes.
rules         every registered rule decides with tensor operations (standard, ears, greedy, ears-entropy,
              typical, fly, ears-budget; the budget's beta comes from the events of earlier rounds).

decide graph  on CUDA, device_verify and the packing as one captured graph per key (verify_graphs.py); eager elsewhere
              and for a rule with per-run state.

Users select it with ``stream(..., device_round=True)`` (and ``generate``); it is off by default. For a fixed k
its tokens, decisions and events are the chain round's, draw for draw (tests/test_device_round.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ears_core.decode.chain import ChainShape, RoundHost
from ears_core.decode.rounds import Round, RoundContext
from ears_core.decode.next_token import draw_next
from ears_core.decode.verify import Verdict, check_read, decide_drafts, next_probs
from ears_core.decode.verify_graphs import decide_once, graphs_for
from ears_core.metrics import expected_tokens
from ears_core.rules import AcceptanceRule
from ears_core.sampling import Stream

__all__ = ["DeviceChainShape", "HostReader", "device_verify", "draw_next"]


def device_verify(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, rule: AcceptanceRule,
                  uniforms: Tensor, sample_uniforms: Tensor, *, with_distortion: bool = False, check: bool = False,
                  draft_support: Tensor | None = None) -> Verdict:
    """verify()'s Verdict with no host read (``check`` adds the input guard's). target_probs (B, K+1, V),
    draft_probs (B, K, V), draft_tokens (B, K), uniforms (B, K), sample_uniforms (B, K+1): the draw at each
    position the next token may land on. Off the argmax path the distortion is 0 after each row's n, as on
    verify()'s CPU path."""
    k = draft_tokens.shape[1]
    d = decide_drafts(target_probs, draft_probs, draft_tokens, rule, uniforms, check=check)
    u = sample_uniforms.gather(1, d.num_accepted.unsqueeze(-1)).squeeze(1)  # (B,) the draw at position n
    next_token = draw_next(rule, target_probs, draft_probs, d.num_accepted, d.top, u)  # (B,)
    next_p, next_q = next_probs(target_probs, draft_probs, d.num_accepted, next_token)
    distortion = None
    if with_distortion:
        distortion = rule.exact_distortion(target_probs[:, :k], draft_probs, d.tolerance, draft_support)  # (B, K)
        if d.top is None:  # as verify()'s CPU path (emitted_only), which reads n only off the argmax path
            pos = torch.arange(k, device=target_probs.device).unsqueeze(0)  # (1, K)
            distortion = distortion.masked_fill(pos > d.num_accepted.unsqueeze(-1), 0.0)
    return Verdict(num_accepted=d.num_accepted, next_token=next_token, kinds=d.kinds, p=d.p, q=d.q, ratio=d.ratio,
                   u=uniforms, tolerance=d.tolerance, max_p=d.max_p, next_p=next_p, next_q=next_q,
                   distortion=distortion)


class HostReader:
    """The round's one host read of a packed vector (module terms). On CUDA: a pinned buffer per length,
    filled by a ``non_blocking`` copy, then one event waited on; elsewhere ``.tolist()``."""

    def __init__(self) -> None:
        self.buffers: dict[int, Tensor] = {}  # length -> pinned (length,) float64

    def read(self, packed: Tensor) -> list[float]:
        if packed.device.type != "cuda":
            return packed.tolist()  # the one read
        n = packed.numel()
        host = self.buffers.get(n)
        if host is None:
            host = self.buffers[n] = torch.empty(n, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        done.synchronize()  # the one wait
        return host.tolist()  # a host tensor: no further transfer


class DeviceChainShape(ChainShape):
    """The chain round on the device (module terms): fixed k, tensor decisions, one host read."""

    def start(self, ctx: RoundContext) -> None:
        super().start(ctx)
        self.check = False  # the input guard reads the packed read instead (module terms: host read)
        self.reader = HostReader()
        self.wants_confidence = self.policy is not None and bool(getattr(ctx.drafter, "device_confidence", False))
        self.planned = 0  # the size policy's planned k for the current round
        self.graphs = graphs_for(ctx.device, ctx.rule)  # the decide captured, where it can be (verify_graphs.py)

    def plan(self, limit: int) -> int:
        """The size policy's k for a round that may draft ``limit`` (module terms: planned k)."""
        means = self.calibration.means(limit)  # per depth
        self.policy.prior = means
        k = 0
        while k < limit and self.policy.keep_going(means[: k + 1], limit):
            k += 1
        return k

    def propose(self, produced: int, limit: int, plain: bool) -> None:
        ctx = self.ctx
        k = limit
        if self.policy is not None and limit > 0:
            self.planned = self.plan(limit)
            k = max(self.planned, 1)  # a probe planned at 0 drafts one token to keep learning
        draft_u = ctx.draws[Stream.DRAFT][None, produced: produced + k]  # (1, k)
        self.estimates.clear()
        extra = {"confidences": True} if self.wants_confidence and k > 0 else {}
        self.tokens, self.draft_probs = ctx.drafter.propose(k, ctx.probs_fn, draft_u, **extra)  # (1, k'), (1, k', V)
        self.k = self.tokens.shape[1]
        conf = getattr(ctx.drafter, "confidence_t", None) if extra else None
        self.conf_t = conf if conf is not None and conf.shape[0] == self.k else None  # (k,) or None

    def verify(self, target_probs: Tensor, produced: int, step: int) -> Round:
        ctx, k = self.ctx, self.k
        inputs = dict(target_probs=target_probs, draft_probs=self.draft_probs, tokens=self.tokens,
                      uniforms=ctx.draws[Stream.ACCEPT][None, produced: produced + k],  # (1, k)
                      sample_uniforms=ctx.draws[Stream.TARGET][None, produced: produced + k + 1],  # (1, k+1)
                      support=self.support, confidences=self.conf_t)
        # the decide as one captured graph where it can be (verify_graphs.py); the input guard reads the packed read
        decide = self.graphs.decide if self.graphs is not None and k > 0 else decide_once
        packed, next_token = decide(device_verify, ctx.rule, inputs, ctx.with_distortion, RoundHost.pack)
        c = 0 if self.conf_t is None else k  # the drafter's confidences, read with the verdict
        host = RoundHost.unpack(self.reader.read(packed), k, c)  # the one read
        check_read(host.tokens, host.q, target_probs.shape[-1])  # the input guard, on what was read
        self.confidences = host.confidences if c else list(getattr(ctx.drafter, "confidence", []))[:k]
        events, drafts = host.records(k, produced, step)
        pardoned = sum(1 for d in drafts if d.kind == "pardoned")
        return Round(k, host.num_accepted, next_token, events, drafts, pardoned)

    def paid(self, rnd: Round) -> bool:
        return self.planned > 0 or self.policy.keep_going([self.calibration.means(1)[0]], self.depth)

    def learn(self, rnd: Round) -> None:
        if self.policy is None:
            return
        k, n, confs = self.k, rnd.num_accepted, self.confidences
        self.estimates[:] = [self.calibration(c, j + 1) for j, c in enumerate(confs)]  # before this round teaches
        for j in range(min(n + 1, k, len(confs))):  # every verified position teaches the calibration
            self.calibration.observe(confs[j], j < n, depth=j + 1)
        rnd.estimates = list(self.estimates[:k])
        rnd.expected = expected_tokens(self.estimates[:k])[k] if len(self.estimates) >= k else None

