"""The bench's quality section on a tiny random pair saved to folders: its files are well formed, and on
questions whose answers are known (the tiny target's own greedy replies) every setting at T = 0 answers
exactly as target-only does, run for run. Then the docs' tables from its JSON, and the app's live sweep."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from ears_core import bench
from ears_core.decode.api import autoregressive
from ears_core.pair import load_pair
from ears_core.quality.score import first_answer, phrases
from ears_core.report.quality_report import FILES
from test_models import WORDS, save_noisy_pair

HAS_CHROMIUM = os.path.exists("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
SWEEPS = "ears:beta=0.5/1,typical:eps=0.3,fly:gate=0.3"


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory) -> tuple[Path, Path]:
    return save_noisy_pair(tmp_path_factory.mktemp("quality_pair"), noise=0.1)


@pytest.fixture(scope="module")
def known_questions(tiny_folders, tmp_path_factory) -> Path:
    """Questions in the tiny tokenizer's words whose answer is the first word of the tiny target's
    greedy reply that the question does not hold: target-only at T = 0 is right on every one."""
    pair = load_pair(str(tiny_folders[0]), None, device="cpu")
    cands = phrases(WORDS)
    questions = []
    for i in range(3, 60, 7):
        text = f"w{i} w{i + 1} w{i + 2}"
        ids = pair.encode(f"{text} w9")  # the prompt: the question and the category's instruction
        reply = autoregressive(pair.target, ids, temperature=0.0, max_new_tokens=6, seed=0, tokenizer=pair.tokenizer,
                               vocab_size=pair.vocab_size).text
        answer = first_answer(reply, text, False, cands)
        if answer is not None:
            questions.append(dict(id=f"echo-{i}", category="echo", question=text, answer=answer, accept=[]))
    assert len(questions) >= 4
    path = tmp_path_factory.mktemp("questions") / "questions.json"
    path.write_text(json.dumps(dict(categories={"echo": dict(about="the tiny target's own replies", instruction="w9",
                                                             vocabulary=WORDS)}, questions=questions)))
    return path


def run_section(folders, questions, out, *extra) -> dict:
    target, draft = folders
    rc = bench.main(["--target", str(target), "--draft", str(draft), "--device", "cpu", "--sections", "quality",
                     "--quality-questions-file", str(questions), "--quality-questions", "4", "--quality-seeds", "2",
                     "--quality-tokens", "6", "--quality-sweeps", SWEEPS, "--quality-categories", "all",
                     "--draft-length", "fixed", "--out", str(out), *extra])
    assert rc == 0 and torch.is_grad_enabled()
    return json.loads((out / "quality.json").read_text())


def runs_of(out: Path) -> list[dict]:
    with open(out / "quality_runs.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def sampled(tiny_folders, known_questions, tmp_path_factory):
    out = tmp_path_factory.mktemp("quality_out")
    return run_section(tiny_folders, known_questions, out, *(["--images"] if HAS_CHROMIUM else [])), out


def test_the_section_writes_its_json_runs_and_figure(sampled, capsys):
    summary, out = sampled
    assert all((out / f).is_file() for f in FILES) and not (out / "summary.json").exists()  # only the section ran
    labels = ["target-only", "ordinary", "ears beta=0.5", "ears beta=1", "typical eps=0.3", "fly gate=0.3"]
    rows = {r["setting"]: r for r in summary["rows"]}
    assert list(rows) == labels
    for r in rows.values():
        lo, hi = r["accuracy_ci"]
        assert 0 <= lo <= r["accuracy"] <= hi <= 1 and r["runs"] == 8 and r["questions"] == 4 and r["speedup"] > 0
    assert rows["target-only"]["speedup"] == 1.0 and "distortion" not in rows["target-only"]
    o = rows["ordinary"]
    assert o["distortion"] < 1e-5 and o["pardon_rate"] == 0 and 0 < o["acceptance"] < 1
    assert rows["ears beta=1"]["distortion"] > 0.01 and rows["ears beta=1"]["pardon_rate"] > 0
    assert rows["ears beta=1"]["knob"] == "beta" and rows["typical eps=0.3"]["value"] == 0.3
    assert summary["questions"]["count"] == 4 and summary["seeds"] == 2 and summary["decoding"]["temperature"] == 0.9
    assert summary["greedy"]["accuracy"] == 1.0  # the known answers: the target's own greedy replies
    assert isinstance(summary["ordinary_inside_target"], bool) and summary["paper"]["speedup"] == 1.18
    assert summary["command"].startswith("python -m ears_core.bench ") and "--sections quality" in summary["command"]
    runs = runs_of(out)
    assert len(runs) == 4 * 2 * len(labels) and {r["setting"] for r in runs} == set(labels)
    assert all(r["correct"] in ("True", "False") for r in runs)
    html = (out / "quality.html").read_text()
    assert 'id="quality"' in html and "plotly" in html and "accuracy [95 %]" in html
    if HAS_CHROMIUM:
        assert (out / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_at_t0_every_setting_answers_as_target_only_run_for_run(tiny_folders, known_questions, tmp_path):
    """The task-level lossless check on known data: at T = 0 every rule verifies greedily, so each run's
    reply is target-only's, and every setting is right on every question."""
    summary = run_section(tiny_folders, known_questions, tmp_path, "--quality-temperature", "0", "--no-quality-greedy")
    assert summary["greedy"] is None
    assert all(r["accuracy"] == 1.0 and r["accuracy_ci"] == [1.0, 1.0] for r in summary["rows"])
    replies: dict[tuple, set] = defaultdict(set)
    for r in runs_of(tmp_path):
        replies[(r["question"], r["seed"])].add(r["reply"])
    assert len(replies) == 8 and all(len(v) == 1 for v in replies.values())
    assert summary["ordinary_inside_target"] is True and summary["first_beta_outside_ordinary"] is None


def test_bad_quality_flags_are_refused_with_the_fix(tiny_folders, known_questions, tmp_path, capsys):
    target, draft = tiny_folders
    base = ["--target", str(target), "--draft", str(draft), "--device", "cpu", "--out", str(tmp_path)]
    assert bench.main([*base, "--sections", "quality", "--quality-seeds", "0"]) == 2
    assert "--quality-seeds must be >= 1" in capsys.readouterr().err
    assert bench.main([*base, "--sections", "quality", "--quality-sweeps", "ears:k=1"]) == 2
    assert "takes no parameter 'k'" in capsys.readouterr().err
    assert bench.main([*base, "--sections", "qualty"]) == 2
    assert "quality" in capsys.readouterr().err  # the list of sections names it


def bench_markdown():
    spec = importlib.util.spec_from_file_location("bench_markdown", ROOT / "scripts" / "bench_markdown.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_render_the_quality_tables_from_its_json(sampled, tmp_path):
    summary, out = sampled
    md = bench_markdown()
    table = md.render(summary, "quality").splitlines()
    assert table[0].startswith("| setting | accuracy [95 % CI] |") and len(table) == 2 + len(summary["rows"])
    assert "| ordinary |" in table[3] and f"{summary['rows'][1]['speedup']:.2f}x" in table[3]
    note = md.render(summary, "quality_notes")
    assert "4 questions" in note and "beta 0.5" in note
    greedy = md.render(md.load("docs/results/quality_greedy_embedded.json"), "greedy")
    assert "| capitals |" in greedy and "left out" in greedy
    with pytest.raises(ValueError, match="quality"):
        md.render(md.load("docs/results/bench_xeon_policy_tree.json"), "quality")
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- FIGURES: from (none) view=quality -->\nold\n<!-- /FIGURES -->\n"
                   "<!-- FIGURES: from docs/results/bench_xeon_policy_tree.json view=machine -->\nx\n<!-- /FIGURES -->\n")
    filled = md.updated(doc.read_text(), str(out / "quality.json"))
    assert f"from {out / 'quality.json'} view=quality" in filled and "| ordinary |" in filled
    assert "from docs/results/bench_xeon_policy_tree.json view=machine" in filled  # a bench summary's block stays


def test_a_reference_form_of_the_target_answers_the_same_questions_and_seeds(tiny_folders, known_questions):
    """The reference block (the float32 reference beside a lean target): its target-only runs on the same
    questions and seeds; here the reference is the target itself at T = 0, so it is right where the target is."""
    from ears_core.quality.section import QualitySettings
    from ears_core.quality.section import run_section as section
    from ears_core.report.quality_report import format_quality
    from ears_core.serve.session import Session

    session = Session(load_pair(str(tiny_folders[0]), str(tiny_folders[1]), device="cpu"))
    qs = QualitySettings(questions_file=known_questions, questions=4, seeds=2, temperature=0.0, max_new_tokens=6,
                         categories="all", sweeps="ears:beta=0.5")
    summary, records = section(session, qs, bench.parse_frontier(qs.sweeps), 2, "fixed",
                               reference=("float32 reference", session))
    ref = summary["reference"]
    assert ref["target"] == "float32 reference" and ref["greedy"]["accuracy"] == summary["greedy"]["accuracy"] == 1.0
    assert ref["target_only"]["runs"] == 8 and ref["target_only"]["accuracy"] == 1.0
    assert "float32 reference on the same questions and seeds: greedy 1.000, target-only 1.000" in format_quality(summary)
