"""``python -m ears_core.gpu_check`` and ``scripts/gpu_round.sh``: the CPU form passes every check and writes one
JSON naming the machine, it says so in one line without CUDA, and its checks can fail (a lossy rule, a decoder
that parts from greedy, a device round that decides or emits otherwise than today's, a crash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ears_core.decode.device_round import device_verify
from ears_core.gpu_check import correctness, device_rounds, json_path, speed
from ears_core.gpu_check.outcome import EXIT_FAILED, EXIT_NO_CUDA, EXIT_OK, Check, Report
from ears_core.rules import RULES, EARSRule

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


def _run(args: list[str], env_extra: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **env_extra}
    return subprocess.run([sys.executable, "-m", "ears_core.gpu_check", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)


def _json(stdout: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("gpu_check: {"))
    return json.loads(line.removeprefix("gpu_check: "))


EXPECTED = ("greedy equality float32", "greedy equality bfloat16", "greedy equality captured float32",
            "greedy equality captured bfloat16", "lossless ordinary rule", "EARS emits its exact law",
            "lossless, device verify", "EARS exact, device verify", "same decisions as CPU",
            "device round decides as CPU", "device round = today's, T = 0.9", "bad draft ids", "KV rollback float32",
            "KV rollback bfloat16", "price curve", "tokens/s T = 0", "tokens/s EARS 0.1, T = 0.9", "round waits",
            "target-only waits", "Space shapes")


@pytest.mark.slow
@pytest.mark.timeout(300)  # about a minute alone on two cores; more beside a second worker
def test_the_prepared_command_runs_every_check_in_its_cpu_form_and_writes_one_json(tmp_path):
    # scripts/gpu_round.sh as a GPU machine runs it, on the CPU; an empty model cache and Hugging Face cache:
    # the real pairs are skipped, the speed part runs on the synthetic skip pair
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PY": sys.executable, "EARS_CACHE": str(tmp_path / "ears"),
           "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_round.sh"), "--device", "cpu"], cwd=tmp_path, env=env,
                          text=True, capture_output=True, timeout=290)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    body = json.loads((out / "gpu_check.json").read_text())
    assert body == _json(proc.stdout) and _json((out / "gpu_check.log").read_text()) == body
    assert body["ok"] is True and body["complete"] is True and body["device"] == "cpu"
    assert "CPU" in body["device_name"] and body["torch"] == torch.__version__ and body["sizes"]["warm_up"] is False
    status = {c["name"]: c["status"] for c in body["checks"]}
    for name in EXPECTED:
        assert status[name] == "pass", (name, proc.stdout)
    assert status["real pairs"] == "skip"  # never counted as a pass
    assert f"gpu_check OK: {len(EXPECTED)} passed, 0 failed, 1 skipped" in proc.stdout
    figures = {c["name"]: c.get("figures", {}) for c in body["checks"]}
    curve = figures["price curve"]
    assert len(curve["verify_ms"]) == 16 and curve["steps"][0] == 1.0
    assert figures["greedy equality float32"]["shapes"] == ["chain", "tree", "device chain", "device tree"]
    assert figures["device round decides as CPU"]["rules"] == list(RULES)
    for setting in ("T = 0", "EARS 0.1, T = 0.9"):
        runs = figures[f"tokens/s {setting}"]
        assert runs["setting"]["tree_widths"] == [2, 1, 1, 1] and runs["setting"]["k"] == 8
        names = ["target-only", "chain k=8", "device chain k=8", "tree 8 nodes, depth 4", "device tree 8 nodes, depth 4"]
        assert [n for n in runs if n != "setting"] == names
        assert all(runs[n]["tokens_per_s"] > 0 and runs[n]["rounds"] > 0 for n in names)


def test_without_cuda_it_exits_2_with_one_line():
    proc = _run([], {"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU the child process may still see")
    assert proc.returncode == EXIT_NO_CUDA
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--device cpu" in lines[0]


def test_the_quick_form_imports_no_ui_or_test_packages(tmp_path):
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in {'gradio', 'plotly', 'pytest', 'playwright', 'gradio_client'}:\n"
            "            raise ImportError('the GPU check must not need ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from ears_core.gpu_check import correctness, device_rounds, plan, speed, real_pairs\n"
            "import torch\n"
            "print(correctness.lossless(torch.device('cpu'), rows=2000).status)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "pass", proc.stderr


def test_the_lossless_check_fails_a_lossy_rule():
    assert correctness.lossless(CPU, rows=50_000).status == "pass"
    lossy = correctness.lossless(CPU, rows=50_000, rule=EARSRule(beta=1.0), expect="target")
    assert lossy.status == "fail" and lossy.figures["pvalue"] < 1e-3
    assert correctness.lossless(CPU, rows=50_000, rule=EARSRule(beta=1.0), expect="emitted").status == "pass"


def test_the_lossless_check_through_the_device_verify_fails_a_lossy_rule():
    assert correctness.lossless(CPU, rows=50_000, verifier=device_verify).status == "pass"
    lossy = correctness.lossless(CPU, rows=50_000, rule=EARSRule(beta=1.0), verifier=device_verify)
    assert lossy.status == "fail" and lossy.figures["verifier"] == "device_verify"
    exact = correctness.lossless(CPU, rows=50_000, rule=EARSRule(beta=1.0), expect="emitted", verifier=device_verify)
    assert exact.status == "pass"


def test_the_greedy_check_fails_a_decoder_that_parts_from_the_target(monkeypatch):
    real = correctness.generate

    def off_by_one(*args, **kwargs):
        out = real(*args, **kwargs)
        out.token_ids[5] = (out.token_ids[5] + 1) % 4096  # a different token: no near-tie explains it
        return out

    monkeypatch.setattr(correctness, "generate", off_by_one)
    check = correctness.greedy_equality(CPU, torch.float32, new_tokens=12, prompts=1)
    assert check.status == "fail" and "chain parts" in check.detail and check.figures["position"] == 5


def off_on_the_device(real, position):
    """``real`` (generate or tree_generate) with the device round's token at ``position`` moved by one."""
    def off(*args, **kwargs):
        out = real(*args, **kwargs)
        if kwargs.get("device_round"):
            out.token_ids[position] = (out.token_ids[position] + 1) % 4096
        return out
    return off


def test_the_greedy_check_fails_a_device_tree_that_parts_from_the_target(monkeypatch):
    monkeypatch.setattr(correctness, "tree_generate", off_on_the_device(correctness.tree_generate, 3))
    check = correctness.greedy_equality(CPU, torch.float32, new_tokens=12, prompts=1)
    assert check.status == "fail" and check.figures["shape"] == "device tree" and check.figures["position"] == 3


def wrong_next_token(real):
    """``real`` (a verifier) with row 1's next token moved by one."""
    def wrong(*args, **kwargs):
        v = real(*args, **kwargs)
        v.next_token[1] = (v.next_token[1] + 1) % 256
        return v
    return wrong


@pytest.mark.parametrize("verifier", ["device_verify", "device_walk"])
def test_the_device_verdict_check_sees_one_wrong_next_token(monkeypatch, verifier):
    assert device_rounds.same_verdicts(CPU, rows=8).status == "pass"
    monkeypatch.setattr(device_rounds, verifier, wrong_next_token(getattr(device_rounds, verifier)))
    check = device_rounds.same_verdicts(CPU, rows=8)
    assert check.status == "fail" and f"{verifier} standard" in check.detail and "next_token: 1 rows" in check.detail
    assert len(check.figures["mismatches"]) >= len(RULES)


def test_the_device_verdict_check_fails_without_power(monkeypatch):
    """Rows whose every draft stands (the draft is the target): no row rejects, so the check cannot pass."""
    real = device_rounds.random_round

    def agreeing(b, n, v, seed):
        tp, dp, tokens, u, su = real(b, n, v, seed)
        return tp, tp[:, :n].clone(), tp[:, :n].argmax(-1), torch.zeros_like(u), su
    monkeypatch.setattr(device_rounds, "random_round", agreeing)
    check = device_rounds.same_verdicts(CPU, rows=8)
    assert check.status == "fail" and "no row ended chain: first rejected" in check.detail


def test_the_whole_run_check_sees_a_device_round_that_emits_other_tokens(monkeypatch):
    kw = dict(rules=("ears",), prompts=1, new_tokens=8)
    ok = device_rounds.same_runs(CPU, **kw)
    assert ok.status == "pass" and ok.figures["trees"] == {"ears": (6, 2, 2)} and ok.figures["tokens"] == 16
    monkeypatch.setattr(device_rounds, "generate", off_on_the_device(device_rounds.generate, 4))
    check = device_rounds.same_runs(CPU, **kw)
    assert check.status == "fail" and check.figures["parted"] == ["ears chain, prompt [1, 5, 7, 9]: parts at token 4"]


def test_the_budget_rule_runs_whole_on_a_tree_the_device_takes():
    assert device_rounds.tree_spec_for("ears-budget") == (3, 1, 3)
    assert device_rounds.tree_spec_for("standard") == (6, 2, 2)


def test_the_speed_runs_differ_in_the_device_round_alone():
    for setting in speed.SETTINGS:
        runs = speed.like_for_like(setting, 16, 8, (8, 4))
        names = list(runs)
        assert names == ["target-only", "chain k=8", "device chain k=8", "tree 8 nodes, depth 4",
                         "device tree 8 nodes, depth 4"]
        chain, device_chain, tree, device_tree = (runs[n] for n in names[1:])
        assert chain.draft_length == tree.draft_length == "fixed"  # no size policy
        assert (chain.draft_shape, chain.k, tree.draft_shape, tree.k, tree.tree_budget) == ("chain", 8, "tree", 4, 8)
        assert not chain.device_round and not tree.device_round
        assert device_chain == replace(chain, device_round=True) and device_tree == replace(tree, device_round=True)
        assert (chain.rule, chain.temperature) == (setting.rule, setting.temperature)
    assert [(s.rule, s.params, s.temperature) for s in speed.SETTINGS] == [("greedy", {}, 0.0),
                                                                         ("ears", {"beta": 0.1}, 0.9)]


def test_a_crashing_check_is_a_failure_and_the_report_goes_on():
    report = Report({"device": "cpu"}, out=open(os.devnull, "w"))
    report.run("fine", lambda: Check("", "pass", "ok"))
    report.run("broken", lambda: 1 / 0)
    report.run("absent", lambda: Check("", "skip", "not here"))
    assert [c.status for c in report.checks] == ["pass", "fail", "skip"]
    assert "ZeroDivisionError" in report.checks[1].detail and report.exit_code() == EXIT_FAILED
    assert json.loads(report.json_line().removeprefix("gpu_check: "))["ok"] is False
    only_skips = Report({"device": "cpu"}, [Check("absent", "skip", "not here")])
    assert only_skips.exit_code() == EXIT_OK


def test_the_json_file_is_written_after_every_check_and_says_when_the_run_is_complete(tmp_path):
    path = tmp_path / "deep" / "gpu_check.json"
    report = Report({"device": "cpu", "device_name": "a CPU"}, out=open(os.devnull, "w"), json_path=path)
    report.run("fine", lambda: Check("", "pass", "ok", {"x": 1}))
    first = json.loads(path.read_text())
    assert first["complete"] is False and first["device_name"] == "a CPU" and [c["name"] for c in first["checks"]] == ["fine"]
    report.run("broken", lambda: 1 / 0)
    report.finish()
    last = json.loads(path.read_text())
    assert last["complete"] is True and last["ok"] is False and [c["status"] for c in last["checks"]] == ["pass", "fail"]
    assert last == json.loads(report.json_line().removeprefix("gpu_check: ")) and not list(path.parent.glob("*.part"))


def test_the_json_file_goes_to_out_where_it_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert json_path(None) == tmp_path / "gpu_check.json"
    assert json_path(tmp_path / "x.json") == tmp_path / "x.json"
    monkeypatch.delenv("OUT")
    assert json_path(None) == Path("gpu_check.json")


def test_the_rollback_check_sees_a_cache_cut_at_the_wrong_place(monkeypatch):
    assert correctness.rollback(CPU, torch.float32).status == "pass"
    real = correctness.drop_last_positions
    monkeypatch.setattr(correctness, "drop_last_positions", lambda cache, n: real(cache, n + 1))
    assert correctness.rollback(CPU, torch.float32).status == "fail"
