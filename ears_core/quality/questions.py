"""The question set: short questions with one canonical answer and accepted variants, by category.

Terms
-----
question set  ``assets/quality/questions.json``: categories (what each asks, the instruction a prompt
              ends with, a vocabulary of more words that count as an answer) and questions (id, category, question, answer, accepted variants).
prompt        the question, a space and the instruction: the category's, or "Answer with a number."
              when the answer is a number. It goes through the pair's chat template like any prompt.
kept          the categories a score is taken over. ``LEFT_OUT`` names those the embedded target
              fails (all but) entirely when it decodes greedily, below ``LEFT_OUT_BELOW`` right
              (docs/results/quality_greedy_embedded.json, scripts/quality_greedy.py):
              they would add questions every method misses and only narrow the differences. A
              larger target keeps every category (``--quality-categories all``).
selection     ``select(n)``: n questions taking the kept categories in turn, in file order, so a
              short run still covers every category.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ears_core.quality.score import first_answer, is_number_answer, phrases, tokens

__all__ = ["Question", "QuestionSet", "QUESTIONS_FILE", "LEFT_OUT", "LEFT_OUT_BELOW", "NUMBER_INSTRUCTION", "load_questions"]

QUESTIONS_FILE = Path(__file__).resolve().parents[2] / "assets" / "quality" / "questions.json"
NUMBER_INSTRUCTION = "Answer with a number."
LEFT_OUT_BELOW = 0.1  # a category whose greedy accuracy is below this is one the target fails (all but) entirely
# The embedded target's such categories (measured: docs/results/quality_greedy_embedded.json).
LEFT_OUT: tuple[str, ...] = ("colours", "legs_total", "sequences")


@dataclass(frozen=True)
class Question:
    """One question: ``answer`` is canonical, ``accept`` the other answers that count."""

    id: str
    category: str
    question: str
    answer: str
    accept: tuple[str, ...] = ()

    @property
    def number(self) -> bool:
        return is_number_answer(self.answer)

    @property
    def accepted(self) -> frozenset[str]:
        """Every accepted answer, normalised (a number by its value)."""
        return frozenset(" ".join(tokens(a)) for a in (self.answer, *self.accept))


@dataclass
class QuestionSet:
    """The questions and what each category asks (see the module's terms)."""

    questions: list[Question]
    instructions: dict[str, str]
    about: dict[str, str] = field(default_factory=dict)
    vocabulary: dict[str, tuple[str, ...]] = field(default_factory=dict)  # more words that count as answers
    _candidates: dict[str, list[tuple[str, ...]]] = field(default_factory=dict, repr=False)

    @property
    def categories(self) -> list[str]:
        return list(dict.fromkeys(q.category for q in self.questions))

    def prompt(self, q: Question) -> str:
        return f"{q.question} {NUMBER_INSTRUCTION if q.number else self.instructions[q.category]}"

    def candidates(self, category: str) -> list[tuple[str, ...]]:
        """Every word answer of the category (canonical and accepted) and its vocabulary, as ``score.phrases``."""
        if category not in self._candidates:
            answers = [a for q in self.questions if q.category == category and not q.number for a in (q.answer, *q.accept)]
            self._candidates[category] = phrases([*answers, *self.vocabulary.get(category, ())])
        return self._candidates[category]

    def read(self, q: Question, reply: str) -> tuple[str | None, bool]:
        """(the first answer in ``reply``, whether it is accepted) (``score.first_answer``)."""
        found = first_answer(reply, q.question, q.number, () if q.number else self.candidates(q.category))
        return found, found is not None and found in q.accepted

    def kept(self, categories: Sequence[str] | str | None = None) -> list[str]:
        """The categories to score: ``None`` -> every category but ``LEFT_OUT``; "all" -> every one;
        else the names given (checked)."""
        if categories is None:
            return [c for c in self.categories if c not in LEFT_OUT]
        if categories == "all":
            return self.categories
        names = [categories] if isinstance(categories, str) else list(categories)
        unknown = [c for c in names if c not in self.categories]
        if unknown or not names:
            raise ValueError(f"unknown question categories {unknown or names}: choose from {', '.join(self.categories)} "
                             "or 'all'")
        return names

    def select(self, n: int | None, categories: Sequence[str] | str | None = None) -> list[Question]:
        """n questions of the kept categories, taking the categories in turn (all of them if n is None)."""
        if n is not None and n < 1:
            raise ValueError(f"the number of questions must be >= 1, got {n}")
        by_cat = {c: [q for q in self.questions if q.category == c] for c in self.kept(categories)}
        out: list[Question] = []
        for i in range(max(len(v) for v in by_cat.values())):
            out += [group[i] for group in by_cat.values() if i < len(group)]
        return out if n is None else out[:n]


def load_questions(path: str | Path = QUESTIONS_FILE) -> QuestionSet:
    """The question set in ``path`` (see the module's terms), checked: every category has an
    instruction, ids are unique."""
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    cats = data.get("categories") or {}
    questions = [Question(q["id"], q["category"], q["question"], str(q["answer"]), tuple(str(a) for a in q.get("accept", ())))
                 for q in data.get("questions") or ()]
    if not questions:
        raise ValueError(f"{path} holds no questions: it needs a 'questions' list (see assets/quality/questions.json)")
    missing = sorted({q.category for q in questions} - set(cats))
    if missing:
        raise ValueError(f"{path}: categories {missing} have no entry under 'categories' (about, instruction)")
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: question ids must be unique")
    return QuestionSet(questions, {c: v["instruction"] for c, v in cats.items()},
                       {c: v.get("about", "") for c, v in cats.items()},
                       {c: tuple(v.get("vocabulary", ())) for c, v in cats.items()})
