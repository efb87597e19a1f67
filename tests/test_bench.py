"""ears_core.bench: the command on a tiny random pair saved to folders (the path a hub id takes),
the plan, the pooling arithmetic on known numbers, answer extraction and bad input."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch

from ears_core import bench
from ears_core.report.bench_plan import PROMPTS_FILE, BenchSettings, Config, Job, build_plan, final_answer, load_prompts, spread
from ears_core.report.bench_report import RUN_FIELDS, pool, wilson
from ears_core.timing import cpu_ticks
from test_models import save_noisy_pair

HAS_CHROMIUM = os.path.exists("/usr/bin/chromium")


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory) -> tuple[Path, Path]:
    return save_noisy_pair(tmp_path_factory.mktemp("bench_pair"), noise=0.05)


def test_bench_on_a_tiny_pair_writes_every_column(tiny_folders, tmp_path, capsys) -> None:
    target, draft = tiny_folders
    out = tmp_path / "out"
    rc = bench.main(["--target", str(target), "--draft", str(draft), "--device", "cpu", "--prompts", "3",
                     "--sweep-prompts", "2", "--max-new-tokens", "10", "--fidelity-tokens", "10",
                     "--fidelity-seeds", "2", "--betas", "0.1,0.5", "--temperatures", "0.6,1.2",
                     "--ks", "1,2", "--out", str(out), "--frontier", FRONTIER_SMALL, "--draft-length", "fixed",
                     "--policy-tokens", "10", "--policy-ks", "1,2", "--tree-budgets", "2", "--tree-max-nodes", "4",
                     *(["--images"] if HAS_CHROMIUM else [])])
    assert rc == 0 and torch.is_grad_enabled()  # no global side effect on later tests
    printed = capsys.readouterr().out
    for section in ("[main]", "[sweep]", "[k]", "[fidelity]", "[frontier]", "[policy]", "[tree]"):
        assert section in printed
    assert "vs target" in printed and "cost-model S" in printed and "tok/s wall" in printed and "TTFT s" in printed
    assert printed.count("prices at the ") == 2 and "verify price in steps for m = 1..9" in printed  # start and end

    with open(out / "runs.csv", newline="") as f:
        runs = list(csv.DictReader(f))
    assert list(runs[0].keys()) == RUN_FIELDS
    assert {r["method"] for r in runs} == {"target", "ordinary", "ears", "typical", "entropy", "assisted",
                                           "ears-entropy", "fly", "ears-budget"}
    for r in runs:
        assert 1 <= int(r["new_tokens"]) <= 10 and float(r["wall_s"]) >= float(r["decode_s"]) > 0 and r["sections"]
        assert r["method"] == "assisted" or 0 < float(r["ttft_s"]) <= float(r["wall_s"])
        assert float(r["logprob"]) < 0
    spec = [r for r in runs if r["method"] in ("ordinary", "ears", "typical", "entropy") and r["draft_length"] == "fixed"]
    assert all(int(r["drafted"]) > 0 and 0 <= int(r["accepted"]) <= int(r["drafted"]) for r in spec)
    math_rows = [r for r in runs if r["expected"]]
    assert math_rows and all(r["correct"] in ("True", "False") for r in math_rows)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["machine"]["prices_at_start"].startswith("verify price in steps")
    assert summary["machine"]["prices_at_end"].startswith("verify price in steps")
    stolen = summary["machine"]["stolen_share"]  # the runs want seconds of CPU: read wherever /proc/stat reports it
    if cpu_ticks() is not None:
        assert 0.0 <= stolen <= 1.0 and "of the CPU time the runs wanted" in printed
    else:
        assert stolen is None
    assert set(summary["sections"]) == {"main", "sweep", "k", "fidelity", "frontier", "policy", "tree"}
    main = {r["config"].replace(" [fixed]", ""): r for r in summary["sections"]["main"]}
    assert set(main) == {"target T=0.9 K=0", "ordinary T=0.9 K=4", "ears 0.1 T=0.9 K=4", "ears 0.5 T=0.9 K=4",
                         "typical T=0.9 K=4", "entropy 0.1 T=0.9 K=4", "assisted T=0.9 K=4"}
    policy = {r["config"] for r in summary["sections"]["policy"]}
    assert policy == {"target T=0 K=0", "ordinary T=0 K=4", "ordinary [fixed] T=0 K=1", "ordinary [fixed] T=0 K=2",
                      "ordinary [threshold] T=0 K=4", "target T=0.9 K=0", "ordinary T=0.9 K=4",
                      "ordinary [fixed] T=0.9 K=1", "ordinary [fixed] T=0.9 K=2", "ordinary [threshold] T=0.9 K=4",
                      "ears 0.1 T=0.9 K=4", "ears 0.1 [fixed] T=0.9 K=1", "ears 0.1 [fixed] T=0.9 K=2",
                      "ears 0.1 [threshold] T=0.9 K=4"}
    assert {r["draft_length"] for r in runs} == {"policy", "fixed", "threshold"}
    tree = {r["config"]: r for r in summary["sections"]["tree"]}
    assert set(tree) == {f"{m} T={t:g} K={k}" for t, rules in ((0, ("ordinary",)), (0.9, ("ordinary", "ears 0.1")))
                         for m, k in [("target", 0)] + [(x, k) for r in rules for x, k in
                                                         ((f"{r} [fixed]", 2), (f"{r} tree(2) [fixed]", 2), (r, 4),
                                                          (f"{r} tree(4)", 4))]}
    for key, row in tree.items():
        if "tree(" in key:  # a tree: nodes per round within its budget (the cost model may draft none), no theory
            assert 0 <= row.get("drafts_per_round", 0) <= (2 if "tree(2)" in key else 4) and row.get("theory_S") is None
            assert row["ratio"] > 0 and row["shape"] == "tree"
            assert "[fixed]" not in key or row["accepted_per_round"] is not None
    assert tree["ordinary tree(2) [fixed] T=0 K=2"]["drafts_per_round"] == pytest.approx(2, abs=0.2)
    assert {r["draft_shape"] for r in runs} == {"chain", "tree"}
    assert main["target T=0.9 K=0"]["ratio"] == 1.0
    for key in ("ordinary T=0.9 K=4", "ears 0.5 T=0.9 K=4", "typical T=0.9 K=4", "entropy 0.1 T=0.9 K=4"):
        row = main[key]
        for col in ("tokens_per_s", "ratio", "acceptance", "accept_length", "pardon_rate", "distortion",
                    "cost_ratio", "theory_S", "cost_model_S", "logprob"):
            assert row[col] is not None, (key, col)
        assert 0 <= row["acceptance"] <= 1 and row["theory_S"] > 0
    assert main["ordinary T=0.9 K=4"]["distortion"] < 1e-5 and main["ordinary T=0.9 K=4"]["pardon_rate"] == 0
    assert main["ears 0.5 T=0.9 K=4"]["distortion"] > 0.01  # tiny random models are flat: a wide band
    assert main["ears 0.5 T=0.9 K=4"]["acceptance"] >= main["ordinary T=0.9 K=4"]["acceptance"]
    assert main["assisted T=0.9 K=4"]["ratio"] > 0
    assert {r["temperature"] for r in summary["sections"]["sweep"]} == {0.6, 1.2}
    assert {r["k"] for r in summary["sections"]["k"]} == {0, 1, 2}
    fid = {r["config"].replace(" [fixed]", ""): r for r in summary["sections"]["fidelity"]}
    assert fid["target T=0.9 K=0"]["agreement"] == 1.0  # target-only agrees with itself
    assert all(len(r["accuracy_ci"]) == 2 for r in fid.values())
    assert summary["assisted"].startswith("transformers assisted generation")

    if HAS_CHROMIUM:  # the plots as images, drawn by plotly.js in the browser the tests use
        for name in ("speed", "frontier", "k", "fidelity", "lossy"):
            assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    assert html.count("<table>") == 7 and "plotly" in html
    for div in ("speed", "frontier", "k", "fidelity", "lossy", "tree"):
        assert f'id="{div}"' in html

    front = {r["config"].replace(" [fixed]", ""): r for r in summary["sections"]["frontier"]}
    assert set(front) == {"target T=0.9 K=0", "ordinary T=0.9 K=4", "ears 0.5 T=0.9 K=4", "ears 2 T=0.9 K=4",
                          "ears-entropy 0.5 T=0.9 K=4", "typical eps=0.05 T=0.9 K=4", "fly gate=0 window=1 T=0.9 K=4",
                          "fly gate=1.2 window=1 T=0.9 K=4", "ears-budget epsilon=0.01 T=0.9 K=4",
                          "ears-budget epsilon=0.05 T=0.9 K=4"}
    assert front["ordinary T=0.9 K=4"]["distortion"] < 1e-5 and front["fly gate=1.2 window=1 T=0.9 K=4"]["distortion"] == 0
    assert front["fly gate=0 window=1 T=0.9 K=4"]["distortion"] > 0.01 and front["ears 2 T=0.9 K=4"]["distortion"] > 0.01
    for eps in (0.01, 0.05):  # the budget holds in every run, so in the pooled mean too, and is used
        assert 0.3 * eps < front[f"ears-budget epsilon={eps:g} T=0.9 K=4"]["distortion"] <= eps + 1e-5
    assert all(r["ratio"] is not None and r.get("acceptance", 0) >= 0 for r in front.values())

    # --report-only rebuilds the same summary from runs.csv without decoding anything again
    assert bench.main(["--out", str(out), "--report-only"]) == 0
    again = json.loads((out / "summary.json").read_text())
    for sec, rows in summary["sections"].items():
        assert sorted(again["sections"][sec], key=lambda r: r["config"]) == sorted(rows, key=lambda r: r["config"])


FRONTIER_SMALL = ("ears:beta=0.5/2,ears-entropy:beta=0.5,typical:eps=0.05,fly:gate=0/1.2:window=1,"
                  "ears-budget:epsilon=0.01/0.05")


def test_frontier_plan_sweeps_every_lossy_rule_beside_the_lossless_anchor() -> None:
    from ears_core.report.bench_plan import FRONTIER, parse_frontier, section_configs
    from ears_core.rules import RULES

    cfgs = section_configs(BenchSettings(), "frontier", assisted=False)
    assert [c.method for c in cfgs[:2]] == ["target", "ordinary"] and len(cfgs) == len(set(cfgs))
    lossy = {n for n, spec in RULES.items() if spec.params}  # every registered rule with a knob
    assert {c.method for c in cfgs[2:]} == lossy == {"ears", "ears-entropy", "typical", "fly", "ears-budget"}
    swept = {name: (param, values) for name, param, values, _ in parse_frontier(FRONTIER)}
    assert swept["fly"][0] == "gate" and swept["ears-budget"][0] == "epsilon" and swept["typical"][0] == "eps"
    fly = [c.rule() for c in section_configs(BenchSettings(frontier="fly:gate=0.2/0.4:window=3"), "frontier", False)[2:]]
    assert [(r.gate, r.window, r.top_n) for r in fly] == [(0.2, 3, 3), (0.4, 3, 3)]
    assert [c.rule().beta for c in cfgs if c.method == "ears"] == [0.05, 0.1, 0.2, 0.3, 0.5, 1.0]
    s = BenchSettings(sweep_prompts=2, sections=("main", "frontier"))
    jobs, by_section = build_plan(s, load_prompts(PROMPTS_FILE), assisted=False)
    shared = set(by_section["main"]) & set(by_section["frontier"])  # ordinary and EARS runs serve both sections
    assert {j.config.method for j in shared} == {"target", "ordinary", "ears"}
    for bad, needle in (("ears", "name the parameter"), ("ears:eps=0.1", "takes no parameter 'eps'"),
                        ("fly:gate=0.1:window=1/2", "the others take exactly one"), ("", "is empty")):
        with pytest.raises(ValueError, match=needle):
            parse_frontier(bad)


def test_plan_shares_runs_between_sections_and_interleaves() -> None:
    prompts = load_prompts(PROMPTS_FILE)
    assert len(prompts) >= 30 and {p["task"] for p in prompts} == {"creative", "qa", "math"}
    s = BenchSettings(prompts=6, sweep_prompts=3, betas=(0.1,), temperatures=(0.9, 1.2), ks=(2, 4),
                      fidelity_seeds=2, fidelity_betas=(0.1,))
    jobs, by_section = build_plan(s, prompts, assisted=False)
    assert len(jobs) == len(set(jobs))
    assert set(jobs) == {j for js in by_section.values() for j in js}
    ordinary = Job(Config("ordinary", 0.9, 4), spread(prompts, 3)[0]["id"], 0, s.max_new_tokens)
    assert all(ordinary in by_section[sec] for sec in ("main", "sweep", "frontier"))  # one run, three sections
    fixed = Job(Config("ordinary", 0.9, 4, draft="fixed"), spread(prompts, 3)[0]["id"], 0, s.max_new_tokens)
    assert fixed in by_section["k"] and ordinary not in by_section["k"]  # the k section is about fixed K
    policy = {(j.config.temperature, j.config.draft, j.config.k) for j in by_section["policy"] if j.config.method == "ordinary"}
    assert policy == {(t, d, k) for t in (0.0, 0.9) for d, k in [("policy", 4), ("threshold", 4), *(("fixed", k) for k in (1, 2, 3, 4))]}
    tree = {(j.config.temperature, j.config.method, j.config.draft, j.config.shape, j.config.k, j.config.budget)
            for j in by_section["tree"] if j.config.method == "ordinary"}
    assert tree == {(t, "ordinary", d, shape, k, b) for t in (0.0, 0.9) for d, shape, k, b in
                    [("fixed", "chain", 2, 0), ("fixed", "tree", 2, 2), ("fixed", "chain", 4, 0), ("fixed", "tree", 4, 4),
                     ("policy", "chain", 4, 0), ("policy", "tree", 4, 8)]}
    shared = set(by_section["tree"]) & set(by_section["policy"])  # the chains are the policy section's runs
    assert {(j.config.shape, j.config.draft) for j in shared if j.config.method != "target"} == \
        {("chain", "fixed"), ("chain", "policy")} and {j.config.method for j in shared} == {"target", "ordinary", "ears"}
    assert [p["task"] for p in spread(prompts, 6)] == ["creative", "qa", "math"] * 2
    assert all(prompts[j.prompt_id].get("answer") for j in by_section["fidelity"])
    assert {j.seed for j in by_section["fidelity"]} == {0, 1}
    firsts = [jobs[0].config]  # each (prompt, seed) group starts at a rotating config
    for a, b in zip(jobs, jobs[1:]):
        if (a.prompt_id, a.seed, a.max_new_tokens) != (b.prompt_id, b.seed, b.max_new_tokens):
            firsts.append(b.config)
    assert len(set(firsts)) > 1


class _J:
    def __init__(self, config, prompt_id=0, seed=0):
        self.config, self.prompt_id, self.seed = config, prompt_id, seed


def _row(**kw):
    base = dict(new_tokens=0, wall_s=0.0, steps=0, drafted=0, accepted=0, pardoned=0, draft_ms=0.0, target_ms=0.0,
                total_distortion=0.0, logprob=-1.0, answer=None, correct=None)
    return base | kw


def test_pooling_arithmetic_on_known_numbers() -> None:
    tgt, spec = Config("target", 0.9), Config("ears", 0.9, 4, 0.1)
    jobs = [_J(tgt, 0), _J(tgt, 1), _J(spec, 0), _J(spec, 1)]
    rows = {jobs[0]: _row(new_tokens=10, wall_s=1.0, steps=10, target_ms=1000.0, answer="14", correct=True),
            jobs[1]: _row(new_tokens=10, wall_s=1.0, steps=10, target_ms=1000.0, answer="8", correct=True),
            # 20 tokens in 2 s over 8 rounds, 32 drafted, 12 stood (3 pardoned), draft 5 ms/token, verify 150 ms
            jobs[2]: _row(new_tokens=12, wall_s=1.0, steps=4, drafted=16, accepted=8, pardoned=2, draft_ms=80.0,
                          target_ms=600.0, total_distortion=0.6, answer="14", correct=True),
            jobs[3]: _row(new_tokens=8, wall_s=1.0, steps=4, drafted=16, accepted=4, pardoned=1, draft_ms=80.0,
                          target_ms=600.0, total_distortion=0.2, answer="9", correct=False)}
    out = {r["method"]: r for r in pool(jobs, rows)}
    e = out["ears"]
    assert e["tokens_per_s"] == 10.0 and e["ratio"] == 1.0
    assert e["acceptance"] == 0.375 and e["pardon_rate"] == pytest.approx(3 / 32, abs=1e-4)
    assert e["accept_length"] == 2.5 and e["distortion"] == 0.04
    assert e["cost_ratio"] == pytest.approx(5 / 150, abs=1e-4)
    a = 0.375
    big_e = (1 - a ** 5) / (1 - a)
    assert e["theory_E"] == pytest.approx(big_e, abs=1e-3)
    assert e["theory_S"] == pytest.approx(big_e / (4 * 5 / 150 + 1), abs=1e-3)
    assert e["verify_steps"] == 1.5  # a 150 ms pass against a 100 ms target-only step
    assert e["cost_model_S"] == pytest.approx(big_e * 100 / (5 * 4 + 150), abs=1e-3)
    assert e["accuracy"] == 0.5 and e["agreement"] == 0.5
    assert out["target"]["agreement"] == 1.0 and out["target"]["ratio"] == 1.0
    lo, hi = wilson(1, 2)
    assert e["accuracy_ci"] == [round(lo, 3), round(hi, 3)] and 0 < lo < 0.5 < hi < 1


def test_pooling_keeps_the_wall_clock_apart_and_says_why_it_differs() -> None:
    tgt, spec = Config("target", 0.9), Config("ears", 0.9, 4, 0.1)
    jobs = [_J(tgt, 0), _J(spec, 0)]
    rows = {jobs[0]: _row(new_tokens=10, decode_s=1.0, wall_s=1.0, ttft_s=0.1, setup_s=0.0, steps=10, target_ms=1e3),
            # 20 tokens: 1 s decoding, 3 s on the wall clock, 1.5 s of it before the first decode step
            jobs[1]: _row(new_tokens=20, decode_s=1.0, wall_s=3.0, ttft_s=1.6, setup_s=1.5, steps=8, drafted=16,
                          accepted=8, draft_ms=80.0, target_ms=900.0)}
    out = {r["method"]: r for r in pool(jobs, rows)}
    e = out["ears"]
    assert e["tokens_per_s"] == 20.0 and e["ratio"] == 2.0  # the decode clock, as before
    assert e["wall_tokens_per_s"] == pytest.approx(20 / 3, abs=0.01) and e["wall_ratio"] == pytest.approx(0.667, abs=1e-3)
    assert e["ttft_s"] == 1.6 and e["seconds"] == 1.0 and e["wall_seconds"] == 3.0
    assert "200 % above the decode clock" in e["clock_note"] and "1.50 s setting runs up" in e["clock_note"]
    assert "0.50 s between tokens" in e["clock_note"] and out["target"]["clock_note"] is None
    old = {j: {k: v for k, v in r.items() if k not in ("decode_s", "ttft_s", "setup_s")} for j, r in rows.items()}
    assert {r["method"]: r["tokens_per_s"] for r in pool(jobs, old)} == {"target": 10.0, "ears": 6.67}  # old files


def test_wilson_interval_known_value() -> None:
    lo, hi = wilson(8, 10)  # textbook: 0.490 .. 0.943
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)


@pytest.mark.parametrize("text,answer", [
    ("She spends 3 * 4 + 2 = 14 dollars.", "14"), ("The answer is 1,200.", "1200"), ("It takes 15.0 minutes", "15"),
    ("about 2.5 litres", "2.5"), ("no number here", None), ("-3 degrees", "-3"), ("$14.00 in all", "14"),
])
def test_final_answer_is_the_last_number(text, answer) -> None:
    assert final_answer(text) == answer


@pytest.mark.parametrize("args,needle", [
    (["--sections", "main,nonsense"], "unknown section"), (["--k", "0"], "K must be >= 1"), (["--gamma", "0"], "K must be >= 1"),
    (["--policy-gammas", "0"], "--policy-ks >= 1"),
    (["--temperatures", "0,0.9"], "temperatures must be > 0"), (["--betas", "-0.1"], "beta must be >= 0"),
    (["--max-new-tokens", "0"], "must be >= 1"), (["--tree-budgets", "0,2"], "--tree-budgets and --tree-max-nodes"),
])
def test_bad_settings_fail_before_loading_models(args, needle, capsys) -> None:
    assert bench.main(["--target", "/nonexistent/folder", *args]) == 2
    assert needle in capsys.readouterr().err
