"""ears_core.quality: the scorer on known replies, the question set's own checks, the pooling and the
bootstrap on known records, the frontier figure's traces. No model runs here (test_quality_section.py)."""
from __future__ import annotations

import numpy as np
import pytest

from ears_core.quality.questions import LEFT_OUT, LEFT_OUT_BELOW, QUESTIONS_FILE, Question, load_questions
from ears_core.quality.runs import Record, Setting
from ears_core.quality.score import first_answer, is_number_answer, number_value, phrases, tokens
from ears_core.quality.summary import PAPER, bootstrap, by_category, first_outside, inside, pool
from ears_core.report.quality_figure import frontier_spec


@pytest.fixture(scope="module")
def qset():
    return load_questions()


# ------------------------------------------------------------------------------------ the scorer


@pytest.mark.parametrize("text, words", [
    ("The capital of Japan is Tokyo.", ["the", "capital", "of", "japan", "is", "tokyo"]),
    ("It is -10 degrees", ["it", "is", "-10", "degrees"]),
    ("12 - 20 = -8", ["12", "20", "-8"]),
    ("12-20=-8", ["12", "20", "-8"]),  # a minus between numbers is not a sign
    ("twenty-one", ["21"]),
    ("one hundred and five apples", ["105", "apples"]),
    ("a hundred", ["100"]),
    ("three thousand six hundred", ["3600"]),
    ("two four six eight", ["2", "4", "6", "8"]),  # a list of numbers, not 20
    ("two and three make five", ["2", "and", "3", "make", "5"]),
    ("negative seven", ["-7"]),
    ("minus 7", ["-7"]),
    ("12 minus 7", ["12", "minus", "7"]),
    ("1,000 metres", ["1000", "metres"]),
    ("half an hour", ["0.5", "an", "hour"]),
    ("Washington, D.C.", ["washington", "dc"]),
    ("Brasília and Bogotá", ["brasilia", "and", "bogota"]),
    ("William Shakespeare's play", ["william", "shakespeare", "play"]),
    ("It's 3.5 kg.", ["it", "3.5", "kg"]),  # "'s" goes (a possessive or "is")
    ("A \u2212 sign: \u22125", ["a", "sign", "-5"]),
])
def test_tokens_normalise_case_punctuation_and_number_words(text, words):
    assert tokens(text) == words


def test_number_values_compare_by_value_and_never_inside_a_longer_number():
    assert number_value("14.0") == number_value("14") == "14"
    assert number_value("-10") == "-10" and number_value("0.50") == "0.5" and number_value("ten") is None
    # "-10" holds no 0 and no 10: the first answer is -10, wrong for 0 and for 10, right for -10
    assert first_answer("The answer is -10.", "What is 5 minus 15?", number=True) == "-10"
    assert first_answer("It is 10.", "What is 5 minus 15?", number=True) != "-10"
    assert first_answer("100", "What is 50 plus 50?", number=True) == "100"


@pytest.mark.parametrize("reply, question, expected", [
    ("7 + 5 = 12", "What is 7 plus 5?", "12"),  # the restated operands are skipped
    ("7 + 5 = 13, no, 12", "What is 7 plus 5?", "13"),  # the first answer counts, not any later one
    ("3 - 10 = -7", "What is 3 minus 10?", "-7"),
    ("3 - 10 = 7", "What is 3 minus 10?", "7"),
    ("A spider has eight legs.", "How many legs does a spider have?", "8"),
    ("1 metre = 100 centimetres", "How many centimetres are in a metre?", "100"),  # "a metre" restated as 1
    ("Two hours is 120 minutes.", "How many minutes are in two hours?", "120"),
    ("0.5 kg is 500 grams", "How many grams are in half a kilogram?", "500"),
    ("The number after 99 is 99.", "What number comes after 99?", None),  # only a restatement: no answer
    ("To find 9 times 3, we can use", "What is 9 times 3?", None),
])
def test_first_number_answer(reply, question, expected):
    assert first_answer(reply, question, number=True) == expected


def test_first_word_answer_reads_the_first_candidate_past_restatements():
    cands = phrases(["Tokyo", "Kyoto", "New Delhi", "Delhi", "cold", "hot", "Mexico City"])
    assert cands[0] == ("mexico", "city") and ("new", "delhi") in cands
    ask = "What is the capital of Japan?"
    assert first_answer("The capital of Japan is Tokyo.", ask, False, cands) == "tokyo"
    assert first_answer("Kyoto, not Tokyo.", ask, False, cands) == "kyoto"
    assert first_answer("The capital of India is New Delhi.", "What is the capital of India?", False, cands) == "new delhi"
    assert first_answer("The opposite of hot is cold.", "What is the opposite of hot?", False, cands) == "cold"
    assert first_answer("Hot is hot.", "What is the opposite of hot?", False, cands) is None
    assert first_answer("Mexico is big; its capital is Mexico City.", "What is the capital of Mexico?", False,
                        cands) == "mexico city"
    assert first_answer("I do not know.", ask, False, cands) is None


# ------------------------------------------------------------------------------------ the question set


def test_the_question_set_is_a_few_hundred_short_questions_in_every_category(qset):
    assert len(qset.questions) >= 300
    cats = qset.categories
    assert {"capitals", "arithmetic", "units", "opposites", "facts", "legs"} <= set(cats)
    assert all(sum(q.category == c for q in qset.questions) >= 15 for c in cats)
    assert all(qset.instructions[c] for c in cats)
    assert set(LEFT_OUT) < set(cats) and 0 < LEFT_OUT_BELOW < 0.5
    assert any(q.number and q.answer.startswith("-") for q in qset.questions)  # negative answers: "-10" is not "0"


def test_no_question_restates_its_own_answer_and_every_answer_reads_back(qset):
    """Each canonical answer and variant, given as a reply in a sentence that restates the question,
    reads as right; another answer of the category given first reads as wrong."""
    for q in qset.questions:
        ask = tokens(q.question)
        for a in (q.answer, *q.accept):
            assert " ".join(tokens(a)) not in " ".join(ask).split(" ") or len(tokens(a)) > 1, (q.id, a)
            assert qset.read(q, f"{q.question} The answer is {a}.") == (" ".join(tokens(a)), True), (q.id, a)
        if q.number:
            assert number_value(tokens(q.answer)[0]) not in {number_value(w) for w in ask}, q.id
            assert q.answer != "1" or not {"a", "an"} & set(ask), q.id
        else:
            other = next(c for c in qset.candidates(q.category) if " ".join(c) not in q.accepted and
                         " ".join(c) not in " ".join(ask))
            assert qset.read(q, f"{' '.join(other)}, or maybe {q.answer}") == (" ".join(other), False), q.id


def test_prompts_end_with_the_category_instruction(qset):
    q = next(q for q in qset.questions if q.id == "capitals-01")
    assert qset.prompt(q) == "What is the capital of France? Answer with the name of the city."
    legs = next(q for q in qset.questions if q.category == "legs")
    assert legs.number and qset.prompt(legs).endswith("Answer with a number.")
    assert is_number_answer("-7") and not is_number_answer("New Delhi")


def test_selection_takes_the_kept_categories_in_turn(qset):
    kept = qset.kept()
    assert not set(LEFT_OUT) & set(kept)
    first = qset.select(len(kept))
    assert [q.category for q in first] == kept  # one of each, in order
    assert len(qset.select(None)) == sum(q.category in kept for q in qset.questions)
    assert {q.category for q in qset.select(None, "all")} == set(qset.categories)
    assert [q.category for q in qset.select(3, ["units"])] == ["units"] * 3
    with pytest.raises(ValueError, match="unknown question categories"):
        qset.select(3, ["astrology"])
    with pytest.raises(ValueError, match=">= 1"):
        qset.select(0)


def test_a_bad_question_file_is_refused_with_the_fix(tmp_path):
    bad = tmp_path / "q.json"
    bad.write_text('{"categories": {}, "questions": [{"id": "a", "category": "x", "question": "?", "answer": "1"}]}')
    with pytest.raises(ValueError, match="no entry under 'categories'"):
        load_questions(bad)
    bad.write_text('{"categories": {}, "questions": []}')
    with pytest.raises(ValueError, match="holds no questions"):
        load_questions(bad)
    assert QUESTIONS_FILE.name == "questions.json"


# ------------------------------------------------------------------------------------ pooling


def rec(setting, q, correct, seed=0, tokens=10, s=1.0, drafted=0, accepted=0, pardoned=0, dist=0.0, cut=False, cat="c"):
    return Record(setting, q, cat, seed, "", None, correct, tokens, s, 1, drafted, accepted, pardoned, dist, cut)


def test_bootstrap_interval_is_exact_at_the_extremes_and_covers_the_mean():
    assert bootstrap(np.ones(30)) == (1.0, 1.0) and bootstrap(np.zeros(5)) == (0.0, 0.0)
    vals = np.array([1.0] * 30 + [0.0] * 30)
    lo, hi = bootstrap(vals)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(2 * 1.96 * 0.5 / np.sqrt(60), abs=0.04)  # the normal width
    assert bootstrap(vals) == (lo, hi)  # seeded
    assert all(np.isnan(bootstrap(np.array([]))))


def test_pool_on_known_records():
    settings = [Setting("target"), Setting("standard"), Setting("ears", (("beta", 0.3),), "beta")]
    records = []
    for i in range(10):  # target right on 6 of 10, ordinary on 6, EARS on 1; EARS twice as fast
        records += [rec("target-only", f"q{i}", i < 6, s=2.0), rec("ordinary", f"q{i}", i < 6, drafted=4, accepted=2),
                    rec("ears beta=0.3", f"q{i}", i < 1, drafted=4, accepted=3, pardoned=1, dist=0.5)]
    records.append(rec("ears beta=0.3", "q0", False, cut=True, tokens=1000))  # a cut run counts nowhere
    rows = {r["setting"]: r for r in pool(settings, records)}
    assert list(rows) == ["target-only", "ordinary", "ears beta=0.3"]
    t, o, e = rows["target-only"], rows["ordinary"], rows["ears beta=0.3"]
    assert t["accuracy"] == 0.6 and t["speedup"] == 1.0 and "delta" not in t and "acceptance" not in t
    assert o["accuracy"] == 0.6 and o["delta"] == 0.0 and o["delta_ci"] == [0.0, 0.0] and o["distortion"] == 0.0
    assert e["accuracy"] == 0.1 and e["delta"] == -0.5 and -0.9 < e["delta_ci"][0] < -0.5 < e["delta_ci"][1] < 0  # paired
    assert e["delta_ordinary"] == -0.5 and e["delta_ordinary_ci"] == e["delta_ci"] and "delta_ordinary" not in o
    assert e["speedup"] == 2.0 and e["acceptance"] == 0.75 and e["pardon_rate"] == 0.25 and e["distortion"] == 0.05
    assert e["runs"] == 10 and e["questions"] == 10 and e["value"] == 0.3 and e["knob"] == "beta"
    assert inside(list(rows.values())) is True
    assert first_outside(list(rows.values())) == 0.3
    cats = by_category(records)
    assert cats["c"] == dict(questions=10, runs=30, right=13, accuracy=0.4333)


def test_seeds_average_within_a_question_before_the_questions_are_resampled():
    records = [rec("target-only", "q0", True, seed=0), rec("target-only", "q0", False, seed=1),
               rec("target-only", "q1", True, seed=0), rec("target-only", "q1", True, seed=1)]
    row = pool([Setting("target")], records)[0]
    assert row["accuracy"] == 0.75 and row["questions"] == 2 and row["runs"] == 4
    assert row["accuracy_ci"][0] == 0.5 and row["accuracy_ci"][1] == 1.0


def test_settings_resolve_aliases_and_refuse_unknown_rules():
    assert Setting("ordinary").method == "standard" and Setting("ordinary").label == "ordinary"
    assert Setting("entropy", (("beta", 0.1),), "beta").label == "ears-entropy beta=0.1"
    with pytest.raises(ValueError, match="unknown rule"):
        Setting("nonsense")


# ------------------------------------------------------------------------------------ the figure


def rows_for_figure():
    return [dict(setting="target-only", method="target", knob=None, value=None, accuracy=0.5, accuracy_ci=[0.4, 0.6],
                 speedup=1.0),
            dict(setting="ordinary", method="standard", knob=None, value=None, accuracy=0.52, accuracy_ci=[0.42, 0.62],
                 speedup=1.1, distortion=0.0),
            *[dict(setting=f"ears beta={b}", method="ears", knob="beta", value=b, accuracy=0.5 - b / 10,
                   accuracy_ci=[0.4 - b / 10, 0.6 - b / 10], speedup=1.1 + b / 5, distortion=b / 10) for b in (0.5, 0.1)],
            dict(setting="fly gate=0.3", method="fly", knob="gate", value=0.3, accuracy=0.5, accuracy_ci=[0.4, 0.6],
                 speedup=1.05, distortion=0.01)]


def test_the_frontier_figure_has_a_curve_per_rule_coloured_by_distortion_and_the_papers_point():
    import plotly.graph_objects as go

    spec = frontier_spec(rows_for_figure(), PAPER)
    names = [t["name"] for t in spec["data"]]
    assert names == ["target-only", "ordinary", "EARS (beta)", "FLy (gate)", "EARS paper (relative to ordinary)"]
    ears = spec["data"][2]
    assert ears["x"] == pytest.approx([1.12, 1.2]) and ears["text"] == ["0.1", "0.5"]  # in knob order
    assert ears["marker"]["color"] == pytest.approx([0.01, 0.05]) and ears["marker"]["coloraxis"] == "coloraxis"
    assert ears["error_y"]["array"] == pytest.approx([0.1, 0.1])
    paper = spec["data"][-1]
    assert paper["x"] == [pytest.approx(1.1 * 1.18)] and paper["y"] == [pytest.approx(0.52 - 0.0084)]
    assert spec["layout"]["shapes"][0]["y0"] == 0.4  # target-only's band
    go.Figure(spec)  # valid plotly
    live = frontier_spec(rows_for_figure(), PAPER, live=rows_for_figure()[:3])
    assert [t["name"] for t in live["data"]][-4:-1] == ["target-only (live)", "ordinary (live)", "EARS (beta) (live)"]
    assert live["data"][-2]["marker"]["symbol"] == "circle-open"
    empty = frontier_spec([], None, title="nothing yet")
    assert empty["data"] == [] and empty["layout"]["title"]["text"] == "nothing yet"
