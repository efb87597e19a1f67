"""Answering the questions: each decoding setup on each question and seed, interleaved, on a Session.

Terms
-----
setting     one way to decode: target-only (``method="target"``) or a registered rule with its
            parameters (``rules.RULES``); ``knob`` names the parameter a curve sweeps (EARS's beta,
            typical acceptance's eps, ...), None for target-only and the ordinary rule.
run         one setting on one question with one seed: a ``Record`` (the reply, the answer read
            from it, whether it is right, and what the decode measured).
group       the runs of one (question, seed): every setting back to back, the order rotating from
            group to group (interleaved), so a slow spell of the machine touches every setting alike.
draft shape every speculative run drafts a chain (``draft_length`` drafts per round: the cost model's
            policy by default), so settings differ only by their rule.
budget      ``budget_s``: seconds of decoding for the whole sweep (the app's request limit); a run
            that reaches it is cut, marked ``timed_out`` and ends the sweep. Cut runs are not scored.
thread      a run decodes in the caller's thread (the bench), or with ``background`` in a thread of its
            own that ends with it (``serve.runs.Background``: the app, whose long-lived request workers
            must not keep a torch thread pool beside the decodes of other requests, threads.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from ears_core.quality.questions import Question, QuestionSet
from ears_core.rules import rule_spec
from ears_core.serve.runs import Background
from ears_core.serve.session import RunConfig, Session

__all__ = ["Setting", "Record", "Decoding", "sweep", "run_one", "TARGET"]

TARGET = "target"


@dataclass(frozen=True)
class Setting:
    """A decoding setup (see the module's terms)."""

    method: str  # "target" or a registered rule name
    params: tuple[tuple[str, float], ...] = ()
    knob: str | None = None

    def __post_init__(self) -> None:
        if self.method != TARGET:
            object.__setattr__(self, "method", rule_spec(self.method).name)  # an alias -> its name; unknown: ValueError

    @property
    def label(self) -> str:
        if self.method == TARGET:
            return "target-only"
        if self.method == "standard":
            return "ordinary"
        return " ".join([self.method, *(f"{k}={v:g}" for k, v in self.params)])

    @property
    def value(self) -> float | None:
        """The swept parameter's value (None without a knob)."""
        return dict(self.params).get(self.knob) if self.knob else None


@dataclass(frozen=True)
class Decoding:
    """How every run of a sweep decodes: temperature, drafts per round at most, length, draft length."""

    temperature: float = 0.9
    k: int = 4
    max_new_tokens: int = 16
    draft_length: str = "policy"

    def run_config(self, setting: Setting, seed: int) -> RunConfig:
        rule = "standard" if setting.method == TARGET else setting.method
        return RunConfig(rule=rule, params=dict(setting.params), temperature=self.temperature, k=self.k,
                         max_new_tokens=self.max_new_tokens, seed=seed, draft_length=self.draft_length,
                         draft_shape="chain")


@dataclass
class Record:
    """One run (see the module's terms)."""

    setting: str  # Setting.label
    question: str  # Question.id
    category: str
    seed: int
    reply: str
    answer: str | None
    correct: bool
    new_tokens: int
    decode_s: float
    steps: int
    drafted: int
    accepted: int
    pardoned: int
    total_distortion: float
    timed_out: bool = False


def run_one(session: Session, ids: torch.Tensor, setting: Setting, decoding: Decoding, seed: int,
            deadline_s: float | None = None, background: bool = False) -> Any:
    """One run to its end (or ``deadline_s`` seconds of decoding): a ``GenerationResult`` (module
    terms: thread)."""
    cfg = decoding.run_config(setting, seed)
    tracked = (session.baseline(ids, cfg, deadline_s) if setting.method == TARGET
               else session.speculative(ids, cfg, deadline_s))
    if background:
        return Background(tracked).result()
    with torch.inference_mode():
        for _ in tracked:  # registers the decode (contention) and lets the session learn from it
            pass
    return tracked.gen.result()


def _record(qset: QuestionSet, q: Question, setting: Setting, seed: int, res: Any) -> Record:
    answer, correct = qset.read(q, res.text)
    s = res.stats
    return Record(setting.label, q.id, q.category, seed, res.text, answer, correct, s.new_tokens, s.decode_s, s.steps,
                  s.drafted, s.accepted, s.pardoned, s.total_distortion, res.timed_out)


def sweep(session: Session, qset: QuestionSet, questions: Sequence[Question], settings: Sequence[Setting],
          decoding: Decoding, seeds: Sequence[int] = (0,), budget_s: float | None = None,
          stop: Callable[[], bool] | None = None, background: bool = False) -> Iterator[Record]:
    """Every setting on every (question, seed), interleaved (module terms: group), as Records.
    Ends early when ``stop()`` turns true or the budget is spent (the cut run is yielded, marked)."""
    if not settings:
        raise ValueError("a sweep needs at least one setting (e.g. target-only and the ordinary rule)")
    spent, g = 0.0, 0
    for q in questions:
        ids = session.encode(qset.prompt(q))  # (1, T)
        for seed in seeds:
            order = list(settings[g % len(settings):]) + list(settings[:g % len(settings)])
            g += 1
            for setting in order:
                if stop is not None and stop():
                    return
                left = None if budget_s is None else max(budget_s - spent, 1e-3)
                res = run_one(session, ids, setting, decoding, seed, left, background)
                spent += res.stats.decode_s
                yield _record(qset, q, setting, seed, res)
                if res.timed_out:
                    return
