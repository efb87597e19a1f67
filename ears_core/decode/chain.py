"""The chain round: the drafter proposes k tokens one after another; ``verify`` decides them left to right.

Terms (round, shape, draws: rounds.py; decision: verify.py)
-----
k              drafts this round: K (``stream(k=)``) at most, capped by the loop so ``max_new_tokens`` is exact, and
               fewer when the drafter stops early (no n-gram match, or the size policy).
score          the target reads [last, x_1..x_k] in one ordinary causal pass (``logits_to_keep = k + 1``).
plain step     k = 0: the token from the rule's bonus distribution at position 0 with the position's target
               draw, exactly as verify() would emit it, without its bookkeeping.
host read      the verdict's row 0 in one float64 vector (``RoundHost.read``); on the CPU, where a host read
               is free, verify() reads n early and skips the work no emitted token needs (``emitted_only``).
walk           where the target's head costs grow with its rows, score runs the head row by row up to the first
               draft that falls (row_walk.py): the same verdict for fewer head rows.
size policy    (``policy``, a ``costs.DraftPolicy``, with a ``calibration``) asked by the drafter before each
               draw: verify one more position? It reads only the draft side, so every rule stays exactly as
               lossless (or as distorted) as without it. It backs off where drafting does not pay: a probe
               that drafted nothing paid only if an average first draft (the calibration's mean at depth 1)
               would pay, so where drafting is cheap every round is a probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from ears_core.decode.next_token import draw_after
from ears_core.decode.packed import CHAIN_READ
from ears_core.decode.rounds import Round, RoundContext
from ears_core.decode.row_walk import walk_rows, walks
from ears_core.decode.verify import KIND_NAMES, DraftKind, argmax_path, check_enabled, verify
from ears_core.draft.drafters import target_features
from ears_core.events import DraftRecord, TokenEvent
from ears_core.metrics import expected_tokens
from ears_core.model.passes.kv_cache import drop_last_positions
from ears_core.rules import AcceptanceRule
from ears_core.sampling import Stream, first_argmax

__all__ = ["ChainShape", "RoundHost", "plain_step"]


class ChainShape:
    """K drafts in a row per round (rounds.RoundShape)."""

    def __init__(self, k: int, policy: Any = None, calibration: Any = None) -> None:
        self.depth = k
        self.policy, self.calibration = policy, calibration
        self.backs_off = policy is not None
        self.estimates: list[float] = []  # this round's acceptance estimates, one per position kept

    def start(self, ctx: RoundContext) -> None:
        self.ctx = ctx
        drafter = ctx.drafter
        self.check = check_enabled(ctx.device)  # verify()'s drafter guard: a host read, skipped on CUDA
        self.emitted_only = ctx.device.type == "cpu"
        self.walk = walks(ctx)  # module terms: walk
        self.scored = 0  # rows of the last verify pass whose probabilities were computed
        self.support = getattr(drafter, "support", None)  # (N,) tokens outside which the drafter's q is 0, or None
        self.free_positions = bool(getattr(drafter, "free_positions", False))  # n-gram: no model step per position

    def _keep(self, conf: float | None, limit: int) -> bool:
        """Asked by the drafter before each draw: verify one more position? conf None: asked before the
        drafter computes the position at all (a head step costs ~1/15 of a target step): would an average
        draft at this depth pay after the drafts so far?"""
        policy, depth = self.policy, len(self.estimates) + 1
        if conf is None:
            return policy.keep_going([*self.estimates, policy.prior_at(depth)], limit)
        self.estimates.append(self.calibration(conf, depth))
        # depth >= 2: the drafter ran a model step to find this confidence (depth 1's comes from feeding the
        # committed tokens, which the next drafting round would need anyway)
        if policy.keep_going(self.estimates, limit, looked=depth > 1 and not self.free_positions):
            return True
        self.estimates.pop()
        return False

    def propose(self, produced: int, limit: int, plain: bool) -> None:
        ctx, k = self.ctx, limit
        draft_u = ctx.draws[Stream.DRAFT][None, produced: produced + k]  # (1, k)
        self.estimates.clear()
        if self.policy is None or k == 0:
            tokens, probs = ctx.drafter.propose(k, ctx.probs_fn, draft_u)
        else:
            self.policy.prior = self.calibration.means(k)  # per depth for a DepthCalibration
            tokens, probs = ctx.drafter.propose(k, ctx.probs_fn, draft_u, keep=lambda c: self._keep(c, k))
        self.tokens, self.draft_probs = tokens, probs  # (1, k') long, (1, k', V): a drafter may stop early
        self.k, self.produced = tokens.shape[1], produced

    def score(self, cache: DynamicCache, last: Tensor) -> Tensor:
        ctx, k = self.ctx, self.k
        walking = self.walk and k > 0  # module terms: walk; the pass leaves its head to the walk
        self.out = ctx.target(torch.cat([last, self.tokens], dim=1), past_key_values=cache, use_cache=True,
                              logits_to_keep=k + 1, output_hidden_states=ctx.need_hidden,
                              **({"head": False} if walking else {}))
        if walking:
            accept_u = ctx.draws[Stream.ACCEPT][None, self.produced: self.produced + k]  # (1, k)
            probs, self.scored = walk_rows(ctx, self.out.states[0], self.tokens, self.draft_probs, accept_u)
            return probs  # (1, k+1, V): 0 past the first draft that fell
        self.scored = k + 1
        return ctx.probs_fn(self.out.logits)  # (1, k+1, V)

    def verify(self, target_probs: Tensor, produced: int, step: int) -> Round:
        ctx, k = self.ctx, self.k
        target_u = ctx.draws[Stream.TARGET][produced: produced + k + 1]  # (k+1,)
        if k == 0:
            next_token, host = plain_step(ctx.rule, target_probs, target_u)
        else:
            v = verify(target_probs, self.draft_probs, self.tokens, ctx.rule,
                       uniforms=ctx.draws[Stream.ACCEPT][None, produced: produced + k],  # (1, k)
                       sample_uniforms=target_u[None],  # (1, k+1)
                       with_distortion=ctx.with_distortion, check=self.check, emitted_only=self.emitted_only,
                       draft_support=self.support)
            next_token, host = v.next_token, RoundHost.read(v, self.tokens)  # the round's one host sync
            if host.num_accepted >= self.scored:  # the walk stopped before a draft verify() let stand
                raise RuntimeError(f"the verify pass scored {self.scored} rows but {host.num_accepted} drafts stood: "
                                   f"{type(ctx.rule).__name__} decides from other rows; set its row_by_row = False")
        events, drafts = host.records(k, produced, step)
        pardoned = sum(1 for d in drafts if d.kind == "pardoned")
        return Round(k, host.num_accepted, next_token, events, drafts, pardoned)

    def commit(self, cache: DynamicCache, rnd: Round) -> None:
        drop_last_positions(cache, self.k - rnd.num_accepted)  # the target's positions for drafts that did not stand
        self.ctx.drafter.commit(rnd.num_accepted, rnd.next_token, target_features(self.out, self.ctx.drafter))

    def paid(self, rnd: Round) -> bool:
        return rnd.drafted > 0 or self.policy.keep_going([self.calibration.means(1)[0]], self.depth)

    def learn(self, rnd: Round) -> None:
        if self.policy is None:
            return
        k, n = self.k, rnd.num_accepted
        confs = list(getattr(self.ctx.drafter, "confidence", []))
        for j in range(min(n + 1, k, len(confs))):  # every verified position teaches the calibration
            self.calibration.observe(confs[j], j < n, depth=j + 1)
        rnd.estimates = list(self.estimates[:k])
        rnd.expected = expected_tokens(self.estimates[:k])[k] if len(self.estimates) >= k else None

    def timed(self, round_ms: float, target_ms: float) -> None:
        pass


def plain_step(rule: AcceptanceRule, target_probs: Tensor, u: Tensor) -> tuple[Tensor, "RoundHost"]:
    """A round with no drafts: target_probs (1, 1, V), u (1,) -> the token (1,) and its host record."""
    at = target_probs[:, 0]  # (1, V)
    tok = first_argmax(at) if argmax_path(rule) else draw_after(rule, at, None, True, u[:1])  # (1,)
    p, max_p = torch.stack([at[0, tok[0]], at[0].max()]).double().tolist()  # the round's one host sync
    return tok, RoundHost(0, int(tok[0]), p, 0.0, [], [], [], [], [], [], [], [], [max_p])


@dataclass
class RoundHost:
    """One chain round's verdict on the host, by name: built with a single device-to-host copy."""

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

    confidences: list[float] = field(default_factory=list)  # (c,) the drafter's, where the round read them

    @classmethod
    def read(cls, v: Any, tokens: Tensor) -> "RoundHost":
        """Row 0 of a Verdict in one float64 vector (token ids are exact in float64): few ops, since each
        costs more right after a model pass, and one device-to-host copy."""
        return cls.unpack(cls.pack(v, tokens).tolist(), tokens.shape[1])  # the one sync

    @staticmethod
    def pack(v: Any, tokens: Tensor, confidences: Tensor | None = None) -> Tensor:
        """Row 0 of a Verdict, the drafted tokens (1, k) and the drafter's confidences (k,) if any as one float64
        vector on their device, laid out by ``packed.CHAIN_READ``."""
        k = tokens.shape[1]
        conf = confidences if confidences is not None else v.p.new_zeros(0)  # (c,)
        dist = v.distortion if v.distortion is not None else v.p.new_zeros(v.p.shape)  # (1, k)
        values = dict(p=v.p[0], q=v.q[0], ratio=v.ratio[0], u=v.u[0], tolerance=v.tolerance[0], distortion=dist[0],
                      max_p=v.max_p[0], next_p=v.next_p[:1], next_q=v.next_q[:1], confidences=conf,
                      num_accepted=v.num_accepted[:1], next_token=v.next_token[:1], tokens=tokens[0], kinds=v.kinds[0])
        return CHAIN_READ.pack(values, k=k, c=conf.numel())

    @classmethod
    def unpack(cls, f: list[float], k: int, c: int = 0) -> "RoundHost":
        """The record from ``pack``'s vector, read to the host: k drafts, c confidences."""
        return cls(**CHAIN_READ.unpack(f, k=k, c=c))

    def records(self, k: int, produced: int, step: int) -> tuple[list[TokenEvent], list[DraftRecord]]:
        """Token events (n drafts that stood, then the resampled or bonus token) and draft records."""
        n = self.num_accepted
        kind_of = [KIND_NAMES[DraftKind(c)] for c in self.kinds]
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
