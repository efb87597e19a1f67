"""verify(): the vectorised accept / pardon / reject decision over B rows x K drafts.

Terms
-----
draft tokens    x_1..x_K proposed by the draft for each row, each drawn from draft_probs[:, i]
target probs    P_target at positions 0..K: position i judges x_{i+1}; position K is the bonus
decision        per row and position a ``DraftKind``: ACCEPTED (r >= U), PARDONED (accepted
                only thanks to the rule's tolerance), REJECTED (the first position that does not
                stand), NOT_EVALUATED (everything after it; its draw is never looked at)
num_accepted n  the length of the leading run of accepted or pardoned drafts, in 0..K
next token      the one token every round emits after the n drafts: drawn from the rule's
                residual at position n when n < K (a *resampled* token), or from the rule's
                bonus distribution at position K when n == K (the *bonus* token)
distortion      total-variation distance between P_target and the distribution a rule actually
                emits at one verified position:
                    emit(y) = q(y) a(y) + (1 - sum_x q(x) a(x)) res(y)
                with a(x) the rule's acceptance probability. 0 for a lossless rule.

All of it is tensor code on the probabilities' device: no loop over rows, positions or the
vocabulary. The one host read is the input guard (``check``): a drafted token id outside [0, V)
or a drafted token its drafter gave probability 0 means a broken drafter, and is a ValueError.
It costs one synchronisation per call; the decode loop turns it off on CUDA unless
``EARS_DEBUG=1``. On the CPU, where a host read costs nothing but every V-sized pass costs more
right after a model pass (its data is out of cache), the decode loop sets ``emitted_only``: n is read
first, and only the work the round's emitted tokens need is done (one row at a time).
``decide_drafts`` is the decision half alone, with no host read; the device round (device_round.py) draws
the next token from it on the device. Every path draws the next token with next_token.py's one function.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import IntEnum

import torch
from torch import Tensor

from ears_core.decode.next_token import draw_after, draw_next
from ears_core.rules import Q_EPS, AcceptanceRule, RuleInputs

__all__ = ["DraftKind", "KIND_NAMES", "Verdict", "Decisions", "verify", "decide_drafts", "argmax_path",
           "check_enabled", "check_drafts", "check_read", "default_draws", "debugging", "next_probs"]


class DraftKind(IntEnum):
    ACCEPTED = 0
    PARDONED = 1
    REJECTED = 2
    NOT_EVALUATED = 3


KIND_NAMES = {DraftKind.ACCEPTED: "accepted", DraftKind.PARDONED: "pardoned", DraftKind.REJECTED: "rejected",
              DraftKind.NOT_EVALUATED: ""}  # a draft's kind in events and records ("" if never tested)


def argmax_path(rule: AcceptanceRule) -> bool:
    """Whether verifiers decide and emit by the target's argmax alone: GreedyRule, and the ordinary rule
    or EARS at T = 0 through ``rules.verifying_rule`` (the same verdict, one max over V instead of the
    residual's passes). The one place every verifier and the decode loop ask."""
    return bool(rule.argmax_only)


@dataclass
class Verdict:
    """What verify() decided; every field is a tensor on the input device."""

    num_accepted: Tensor  # (B,) long, 0..K
    next_token: Tensor  # (B,) long: the resampled (n < K) or bonus (n == K) token
    kinds: Tensor  # (B, K) int8, DraftKind values
    p: Tensor  # (B, K) P_target of each draft token
    q: Tensor  # (B, K) P_draft of each draft token
    ratio: Tensor  # (B, K) p / max(q, 1e-10)
    u: Tensor  # (B, K) the uniform draws used
    tolerance: Tensor  # (B, K) the tolerance the rule applied at each position (0 where it has none)
    max_p: Tensor  # (B, K + 1) max P_target at each position (bonus position included)
    next_p: Tensor  # (B,) P_target(next_token) at its position
    next_q: Tensor  # (B,) P_draft(next_token) at its position (0 for a bonus token)
    distortion: Tensor | None  # (B, K) TV(emitted, P_target) per drafted position, if asked

    @property
    def is_bonus(self) -> Tensor:  # (B,) bool
        return self.num_accepted == self.kinds.shape[1]


def _check(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor) -> tuple[int, int, int]:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be (B, K), got shape {tuple(draft_tokens.shape)}")
    b, k = draft_tokens.shape
    if draft_tokens.dtype != torch.long:
        raise ValueError(f"draft_tokens must be torch.long, got {draft_tokens.dtype}")
    if target_probs.dim() != 3 or target_probs.shape[:2] != (b, k + 1):
        raise ValueError(
            f"target_probs must be (B, K+1, V) = ({b}, {k + 1}, V), got {tuple(target_probs.shape)}:"
            " score the K drafts and the bonus position in one pass"
        )
    v = target_probs.shape[2]
    if draft_probs.shape != (b, k, v):
        raise ValueError(
            f"draft_probs must be (B, K, V) = ({b}, {k}, {v}), got {tuple(draft_probs.shape)}: "
            "draft and target must share one vocabulary"
        )
    return b, k, v


def debugging() -> bool:
    """Whether EARS_DEBUG=1 asks for the guards that cost a host synchronisation."""
    return os.environ.get("EARS_DEBUG", "").strip() in {"1", "true", "yes"}


def check_enabled(device: torch.device) -> bool:
    """Whether the decode loop runs verify()'s input guard: always on the CPU, on CUDA only with
    EARS_DEBUG=1 (the guard is a host synchronisation)."""
    return device.type != "cuda" or debugging()


def check_drafts(draft_tokens: Tensor, q: Tensor, in_range: Tensor, v: int) -> None:
    """Raise if any drafted token is outside [0, V) or had draft probability 0: one host read."""
    bad = ~in_range | (q <= 0)  # (B, K)
    if not bool(bad.any()):
        return
    row, col = (int(i) for i in bad.nonzero()[0])
    _refuse(int(draft_tokens[row, col]), row, col, not bool(in_range[row, col]), v)


def check_read(tokens: list[int], q: list[float] | None, v: int) -> None:
    """``check_drafts`` for one row already read to the host (a device round's packed read: no read of its own).
    ``q`` None: only the ids are checked (a greedy tree: ``verify_tree.check_tree_drafts``)."""
    for col, tok in enumerate(tokens):
        if not 0 <= tok < v or (q is not None and q[col] <= 0):
            _refuse(tok, 0, col, not 0 <= tok < v, v)


def _refuse(tok: int, row: int, col: int, outside: bool, v: int) -> None:
    """The guard's ValueError for draft ``tok`` at (row, col): outside [0, V), else drafted with probability 0."""
    if outside:
        raise ValueError(f"draft token id {tok} at row {row}, position {col} is outside the vocabulary [0, {v}): "
                         "the drafter proposed a token the models cannot score (check its vocabulary size)")
    raise ValueError(f"draft token {tok} at row {row}, position {col} has draft probability 0 in draft_probs: "
                     "a drafter must return the distribution each token was drawn from, and it cannot "
                     "have drawn a token of probability 0")


def verify(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_tokens: Tensor,
    rule: AcceptanceRule,
    generator: torch.Generator | None = None,
    *,
    uniforms: Tensor | None = None,
    sample_uniforms: Tensor | None = None,
    with_distortion: bool = False,
    check: bool = True,
    emitted_only: bool = False,
    draft_support: Tensor | None = None,
) -> Verdict:
    """Decide B rows of K drafts at once.

    target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K) long.
    ``uniforms`` (B, K) are the acceptance draws U and ``sample_uniforms`` the draw for the
    next token: (B,), or (B, K+1) with one draw per position the next token may land on (the one
    at position n is used). Either one left out is drawn from ``generator`` (torch's default).
    ``check``: refuse draft token ids outside [0, V) and drafted tokens with q = 0 (a ValueError
    naming the drafter's mistake); one host synchronisation.
    ``emitted_only``: read each row's n to the host first (a synchronisation: free on the CPU, where
    the decode loop sets it), then draw the next token from the one distribution it comes from
    (bonus or residual, a view at n) and compute the distortion only at the positions that emit
    (0 .. n, n < K; 0 after them). Same tokens and decisions as without it.
    ``draft_support`` (N,): the token ids outside which draft_probs is 0 (a drafter's ``support``):
    the distortion is then summed over those N tokens only.
    """
    b, k, _ = _check(target_probs, draft_probs, draft_tokens)
    uniforms, sample_uniforms = default_draws(uniforms, sample_uniforms, (b, k), generator, target_probs.device)
    d = decide_drafts(target_probs, draft_probs, draft_tokens, rule, uniforms, check=check)
    num_accepted = d.num_accepted
    if sample_uniforms.dim() == 2:  # (B, K+1): the draw that belongs to position n
        sample_uniforms = sample_uniforms.gather(1, num_accepted.unsqueeze(-1)).squeeze(1)  # (B,)
    ns = num_accepted.tolist() if emitted_only and d.top is None else None  # a host read that saves work
    next_token, next_p, next_q = _next_token(rule, target_probs, draft_probs, num_accepted, d.top, ns, sample_uniforms)
    distortion = (_distortion(rule, target_probs[:, :k], draft_probs, d.tolerance, num_accepted, ns, draft_support)
                  if with_distortion else None)
    return Verdict(num_accepted=num_accepted, next_token=next_token, kinds=d.kinds, p=d.p, q=d.q, ratio=d.ratio,
                   u=uniforms, tolerance=d.tolerance, max_p=d.max_p, next_p=next_p, next_q=next_q,
                   distortion=distortion)


@dataclass
class Decisions:
    """verify()'s decisions, before the next token is drawn: every field a tensor on the input device."""

    num_accepted: Tensor  # (B,) long, 0..K
    kinds: Tensor  # (B, K) int8, DraftKind values
    p: Tensor  # (B, K) P_target of each draft token
    q: Tensor  # (B, K) P_draft of each draft token
    ratio: Tensor  # (B, K) p / max(q, 1e-10)
    tolerance: Tensor  # (B, K)
    max_p: Tensor  # (B, K + 1)
    top: Tensor | None  # (B, K + 1) the target's first argmax at each position, on the argmax path; else None


def decide_drafts(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, rule: AcceptanceRule,
                  uniforms: Tensor, *, check: bool) -> Decisions:
    """The decision half of verify(): target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K),
    uniforms (B, K). Tensor operations only; ``check`` adds the input guard's one host read."""
    v, k = target_probs.shape[2], draft_tokens.shape[1]
    judged = target_probs[:, :k]  # (B, K, V)
    in_range = (draft_tokens >= 0) & (draft_tokens < v)  # (B, K)
    idx = draft_tokens.clamp(0, max(v - 1, 0)).unsqueeze(-1)  # (B, K, 1): gather never reads outside V
    q = draft_probs.gather(-1, idx).squeeze(-1)  # (B, K)
    if check and k > 0:
        check_drafts(draft_tokens, q, in_range, v)
    if argmax_path(rule):  # one pass over V finds every position's argmax, and its value is max_p
        max_p, top = torch.max(target_probs, dim=-1)  # (B, K+1) each: the first maximum, as argmax
    else:
        top, max_p = None, target_probs.amax(dim=-1)  # (B, K+1): computed once, reused below
    # unchecked (check=False): an id outside [0, V) reads p = 0, which no rule accepts: clamp-and-reject
    p = judged.gather(-1, idx).squeeze(-1).masked_fill(~in_range, 0.0)  # (B, K)
    ratio = p / q.clamp(min=Q_EPS)  # (B, K)
    tolerance = rule.tolerance(judged, max_p[:, :k])  # (B, K)
    inputs = RuleInputs(judged, draft_probs, draft_tokens, p, q, ratio, max_p[:, :k], uniforms)
    accepted, pardoned = _decide(rule, inputs, tolerance, top, in_range)  # (B, K) bool each
    num_accepted, kinds = _leading_run(accepted, pardoned)
    return Decisions(num_accepted, kinds, p, q, ratio, tolerance, max_p, top)


def default_draws(uniforms: Tensor | None, sample_uniforms: Tensor | None, shape: tuple[int, int],
                  generator: torch.Generator | None, device: torch.device) -> tuple[Tensor, Tensor]:
    """The acceptance draws (``shape``: rows x drafts) and the next token's draws (rows,), drawn from
    ``generator`` where the caller gave none."""
    if uniforms is None:
        uniforms = torch.rand(shape, generator=generator, device=device)
    if sample_uniforms is None:
        sample_uniforms = torch.rand((shape[0],), generator=generator, device=device)
    return uniforms, sample_uniforms


def _decide(rule: AcceptanceRule, inputs: RuleInputs, tolerance: Tensor, top: Tensor | None,
            in_range: Tensor) -> tuple[Tensor, Tensor]:
    """accepted, pardoned (B, K) bool: the rule's decisions, or with ``top`` (B, K+1) the greedy test
    (a draft stands iff it is its position's first maximum: what GreedyRule.decide computes)."""
    if top is not None:
        accepted = (inputs.draft_tokens == top[:, :in_range.shape[1]]) & in_range  # (B, K)
        return accepted, torch.zeros_like(accepted)
    return rule.decide(inputs, tolerance)


def _leading_run(accepted: Tensor, pardoned: Tensor) -> tuple[Tensor, Tensor]:
    """accepted, pardoned (B, K) bool -> n (B,) the leading run of drafts that stood, kinds (B, K) int8."""
    k = accepted.shape[1]
    stands = (accepted | pardoned).to(torch.long)  # (B, K)
    num_accepted = stands.cumprod(dim=-1).sum(dim=-1)  # (B,)
    pos = torch.arange(k, device=accepted.device).unsqueeze(0)  # (1, K)
    n = num_accepted.unsqueeze(-1)  # (B, 1)
    kinds = torch.where(
        pos < n,
        torch.where(accepted, int(DraftKind.ACCEPTED), int(DraftKind.PARDONED)),
        torch.where(pos == n, int(DraftKind.REJECTED), int(DraftKind.NOT_EVALUATED)),
    ).to(torch.int8)
    return num_accepted, kinds


def _next_token(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor, num_accepted: Tensor,
                top: Tensor | None, ns: list[int] | None, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The one token each row emits after its n drafts (next_token.py): with ``ns`` (n read to the host) only the
    distribution each row draws from, a view at its n. -> next_token, next_p, next_q (B,) each."""
    k = target_probs.shape[1] - 1
    if ns is None or top is not None:
        next_token = draw_next(rule, target_probs, draft_probs, num_accepted, top, u)  # (B,)
    else:
        next_token = torch.stack([draw_after(rule, target_probs[r, nr], draft_probs[r, nr] if nr < k else None,
                                             nr == k, u[r]) for r, nr in enumerate(ns)])  # (B,): one row in the loop
    return (next_token, *next_probs(target_probs, draft_probs, num_accepted, next_token))


def next_probs(target_probs: Tensor, draft_probs: Tensor, num_accepted: Tensor, next_token: Tensor
               ) -> tuple[Tensor, Tensor]:
    """(B,) P_target(next token) at position n, and (B,) P_draft(next token) at n (0 for a bonus token)."""
    b, k1, v = target_probs.shape
    k = k1 - 1
    n, tok = num_accepted.unsqueeze(-1), next_token.unsqueeze(-1)  # (B, 1) each
    next_p = target_probs.reshape(b, -1).gather(1, n * v + tok).squeeze(-1)  # (B,)
    if k == 0:
        return next_p, torch.zeros_like(next_p)
    at_n = draft_probs.reshape(b, -1).gather(1, n.clamp(max=k - 1) * v + tok).squeeze(-1)  # (B,)
    return next_p, torch.where(num_accepted == k, 0.0, at_n)


def _distortion(rule: AcceptanceRule, judged: Tensor, draft_probs: Tensor, tolerance: Tensor, num_accepted: Tensor,
                ns: list[int] | None, draft_support: Tensor | None) -> Tensor:
    """(B, K) TV(emitted, P_target) per drafted position; with ``ns`` (emitted_only) at positions 0 .. n (< K)
    only, 0 after them."""
    b, k = tolerance.shape
    # a rule whose acceptance looks ahead along the row (FLy) needs every position for the ones that emit
    m = min(max(ns) + 1, k) if ns is not None and not rule.looks_ahead else k
    distortion = rule.exact_distortion(judged[:, :m], draft_probs[:, :m], tolerance[:, :m], draft_support)
    if m < k:
        distortion = torch.cat([distortion, distortion.new_zeros(b, k - m)], dim=1)
    if ns is not None:  # 0 after each row's n (rows that stopped earlier; every row for a look-ahead rule)
        pos = torch.arange(k, device=tolerance.device).unsqueeze(0)  # (1, K)
        distortion = distortion.masked_fill(pos > num_accepted.unsqueeze(-1), 0.0)
    return distortion
