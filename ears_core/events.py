"""Records of a generation: what the UI, the metrics and the exports read.

Terms
-----
TokenEvent   one emitted token. ``kind`` says how it was decided:
               accepted   a draft token that the ordinary rule accepts (r >= U)
               pardoned   a draft token accepted only thanks to the rule's tolerance
               resampled  drawn from the residual after the draft at this position was rejected
               bonus      drawn from P_target after all K drafts of the round stood
               target     drawn from P_target with no draft involved: target-only decoding, or a
                          round in which the drafter proposed nothing
             ``p``/``q`` are P_target/P_draft of the emitted token at its position. ``ratio``,
             ``u`` and ``tolerance`` describe the test made at that position: for a resampled
             token it is the test the rejected draft (``rejected_token``) failed. Fields that do
             not apply are None (a bonus token has no draft and no test).
StepRecord   one round: how many tokens were drafted, how many stood, the kind of every
             drafted token (including the rejected one), the time spent in the draft, in the
             target and in the rest of the round (milliseconds) and, with a draft-length policy,
             its acceptance estimates and the tokens it expected (``costs``).
DraftRecord  one drafted token inside a step, including rejected ones: what the ratio chart plots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["KINDS", "TokenEvent", "DraftRecord", "StepRecord"]

KINDS = ("accepted", "pardoned", "resampled", "bonus", "target")


@dataclass
class TokenEvent:
    step: int  # the round (0-based) that emitted this token
    position: int  # index among the new tokens (0-based)
    token_id: int
    text: str  # the text this token adds to the decoded output ("" without a tokenizer)
    kind: str  # one of KINDS
    p: float  # P_target(token) at this position
    q: float | None  # P_draft(token) at this position; None for bonus / target tokens
    ratio: float | None  # p / max(q, 1e-10) of the token tested here
    u: float | None  # the uniform draw of that test
    tolerance: float | None  # the rule's tolerance at this position
    max_p: float  # max P_target at this position
    distortion: float  # TV(emitted, P_target) at this position; 0 for bonus / target tokens
    rejected_token: int | None = None  # the draft token that lost the test (resampled only)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DraftRecord:
    position: int  # the output position this draft token was proposed for
    token_id: int
    kind: str  # accepted / pardoned / rejected
    p: float
    q: float
    ratio: float
    u: float
    tolerance: float
    max_p: float


@dataclass
class StepRecord:
    step: int
    drafted: int  # K used this round (can be smaller near max_new_tokens)
    accepted: int  # drafts that stood (accepted + pardoned)
    pardoned: int
    emitted: int  # tokens this round added to the output (after EOS / budget truncation)
    draft_ms: float
    target_ms: float
    drafts: list[DraftRecord] = field(default_factory=list)
    overhead_ms: float = 0.0  # the round's work outside the draft and the verify pass
    estimates: list[float] = field(default_factory=list)  # the policy's acceptance estimate per drafted position
    expected: float | None = None  # tokens the policy expected from this round: E(k)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
