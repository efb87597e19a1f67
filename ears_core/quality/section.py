"""The bench's ``quality`` section: what each rule and knob costs in right answers, beside its speed.

Terms
-----
settings    target-only, the ordinary rule, and every sweep: a rule with its knob at each value
            (``QUALITY_SWEEPS``: EARS's beta, the entropy tolerance's beta, typical acceptance's eps,
            FLy's gate, the distortion budget's epsilon), all at one temperature (0.9 by default)
            and draft length, on the same questions and seeds (``runs``: interleaved).
greedy      before the sweep, target-only at T = 0 on the same questions: the target's own accuracy
            per category, the ceiling a sampled run is read against (``--quality-greedy``).
lossless    the ordinary rule's accuracy must lie inside target-only's interval: a task-level check
            that it samples from the target's distribution. At T = 0 both are the target's greedy
            output, token for token, so every answer is the same.
first beta  the smallest EARS beta whose accuracy leaves the ordinary rule's interval
            (``summary.first_outside``), or None.
reference   a second session on the same target in another form (the float32 reference beside the
            lean int4 target: model/loading/target_path.py): its greedy and sampled target-only accuracy on the
            same questions and seeds, beside the section's target (``reference`` in the summary).

``run_section`` returns the section's summary (a dict, written as JSON by ``report.quality_report``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ears_core.quality.questions import QUESTIONS_FILE, QuestionSet, load_questions
from ears_core.quality.runs import Decoding, Record, Setting, sweep
from ears_core.quality.summary import PAPER, RESAMPLES, by_category, first_outside, inside, pool
from ears_core.serve.session import Session

__all__ = ["QualitySettings", "QUALITY_SWEEPS", "settings_for", "run_section", "Sweep"]

# Each rule's knob from nearly lossless to loose; EARS at the paper's betas, the others at three values.
QUALITY_SWEEPS = ("ears:beta=0.05/0.1/0.2/0.3/0.5/1,ears-entropy:beta=0.1/0.3/1,typical:eps=0.3/0.1/0.03,"
                  "fly:gate=0.7/0.3/0,ears-budget:epsilon=0.01/0.03/0.1")
Sweep = tuple[str, str, tuple[float, ...], tuple[tuple[str, float], ...]]  # rule, knob, values, fixed params


@dataclass
class QualitySettings:
    """The section's sizes and decoding (``python -m ears_core.bench --help``: the --quality-* flags)."""

    questions_file: Path = QUESTIONS_FILE
    questions: int = 45  # taking the kept categories in turn (5 of each of the 9 kept)
    seeds: int = 2  # per question and setting
    temperature: float = 0.9
    max_new_tokens: int = 16
    categories: str | None = None  # None: every category but questions.LEFT_OUT; "all"; or "a,b,c"
    sweeps: str = QUALITY_SWEEPS  # rule:knob=v1/v2/...[:fixed=value], comma-separated (bench_plan.parse_frontier)
    greedy: bool = True  # the T = 0 target-only pass first

    def check(self) -> None:
        if self.questions < 1 or self.seeds < 1:
            raise ValueError("--quality-questions and --quality-seeds must be >= 1")
        if self.max_new_tokens < 1:
            raise ValueError("--quality-tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("--quality-temperature must be >= 0 (0 is greedy: every setting then answers alike)")

    def category_list(self) -> Sequence[str] | str | None:
        if self.categories is None or self.categories == "all":
            return self.categories
        return [c.strip() for c in self.categories.split(",") if c.strip()]


def settings_for(sweeps: Sequence[Sweep]) -> list[Setting]:
    """Target-only, the ordinary rule, then each sweep's rule at each knob value."""
    out = [Setting("target"), Setting("standard")]
    for name, knob, values, fixed in sweeps:
        out += [Setting(name, ((knob, x), *fixed), knob) for x in values]
    return list(dict.fromkeys(out))


def _greedy(session: Session, qset: QuestionSet, questions: list, max_new: int, progress: Callable[[str], Any] | None
            ) -> dict[str, Any]:
    records = list(sweep(session, qset, questions, [Setting("target")], Decoding(0.0, max_new_tokens=max_new)))
    if progress:
        progress(f"greedy target-only: {sum(r.correct for r in records)}/{len(records)} right")
    return dict(accuracy=round(sum(r.correct for r in records) / len(records), 4), by_category=by_category(records))


def _reference(session: Session, label: str, qset: QuestionSet, questions: list, qs: QualitySettings,
               decoding: Decoding, progress: Callable[[str], Any] | None) -> dict[str, Any]:
    """Target-only on the reference session, greedy and sampled, on the section's questions and seeds."""
    greedy = _greedy(session, qset, questions, qs.max_new_tokens, progress) if qs.greedy else None
    records = list(sweep(session, qset, questions, [Setting("target")], decoding, range(qs.seeds)))
    row = pool([Setting("target")], records)[0]
    if progress:
        progress(f"{label} target-only: {sum(r.correct for r in records)}/{len(records)} right")
    return dict(target=label, greedy=greedy, target_only=row)


def run_section(session: Session, qs: QualitySettings, sweeps: Sequence[Sweep], k: int, draft_length: str = "policy",
                progress: Callable[[str], Any] | None = None, reference: tuple[str, Session] | None = None
                ) -> tuple[dict[str, Any], list[Record]]:
    """Run the section on ``session``'s pair: (its summary, every run's record). ``reference``: (label,
    session) of the same target in another form (module terms)."""
    qs.check()
    qset = load_questions(qs.questions_file)
    kept = qset.kept(qs.category_list())
    questions = qset.select(qs.questions, kept)
    settings = settings_for(sweeps)
    decoding = Decoding(qs.temperature, k, qs.max_new_tokens, draft_length)
    t0 = time.perf_counter()
    greedy = _greedy(session, qset, questions, qs.max_new_tokens, progress) if qs.greedy else None
    records: list[Record] = []
    total = len(questions) * qs.seeds * len(settings)
    for n, rec in enumerate(sweep(session, qset, questions, settings, decoding, range(qs.seeds)), 1):
        records.append(rec)
        if progress and (n % max(1, total // 20) == 0 or n == total):
            el = time.perf_counter() - t0
            progress(f"[quality {n}/{total}] {el:5.0f} s, ~{el / n * (total - n):4.0f} s left  {rec.setting}")
    rows = pool(settings, records)
    summary = dict(section="quality", decoding=asdict(decoding), seeds=qs.seeds, resamples=RESAMPLES,
                   questions=dict(file=str(qs.questions_file.name), count=len(questions),
                                  kept=kept, left_out=[c for c in qset.categories if c not in kept],
                                  per_category={c: sum(q.category == c for q in questions) for c in kept}),
                   greedy=greedy, rows=rows, by_category={r: by_category([x for x in records if x.setting == r])
                                                         for r in ("target-only", "ordinary")},
                   ordinary_inside_target=inside(rows), first_beta_outside_ordinary=first_outside(rows), paper=PAPER,
                   wall_s=round(time.perf_counter() - t0, 1))
    if reference is not None:
        summary["reference"] = _reference(reference[1], reference[0], qset, questions, qs, decoding, progress)
    return summary, records
