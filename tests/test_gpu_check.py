"""``python -m ears_core.gpu_check``: its CPU form passes, it says so in one line without CUDA, and its checks
can fail (a lossy rule, a decoder that parts from greedy, a crash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ears_core.gpu_check import correctness
from ears_core.gpu_check.outcome import EXIT_FAILED, EXIT_NO_CUDA, EXIT_OK, Check, Report
from ears_core.rules import EARSRule

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


def _run(args: list[str], env_extra: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **env_extra}
    return subprocess.run([sys.executable, "-m", "ears_core.gpu_check", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)


def _json(stdout: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("gpu_check: {"))
    return json.loads(line.removeprefix("gpu_check: "))


@pytest.mark.slow
@pytest.mark.timeout(600)  # 130-180 s alone; twice that beside a second worker
def test_the_cpu_form_passes_every_check_and_skips_what_is_not_here(tmp_path):
    # an empty model cache and Hugging Face cache: the real pairs are skipped, the speed part runs on the
    # synthetic skip pair
    proc = _run(["--device", "cpu"], {"EARS_CACHE": str(tmp_path / "ears"), "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    body = _json(proc.stdout)
    status = {c["name"]: c["status"] for c in body["checks"]}
    assert body["ok"] is True and body["device"] == "cpu"
    for name in ("greedy equality float32", "greedy equality bfloat16", "greedy equality captured bfloat16",
                 "lossless ordinary rule",
                 "EARS emits its exact law", "same decisions as CPU", "bad draft ids", "KV rollback float32",
                 "KV rollback bfloat16", "price curve", "tokens/s", "round waits"):
        assert status[name] == "pass", (name, proc.stdout)
    assert status["real pairs"] == "skip"  # never counted as a pass
    curve = next(c for c in body["checks"] if c["name"] == "price curve")["figures"]
    assert len(curve["verify_ms"]) == 16 and curve["steps"][0] == 1.0
    assert "gpu_check OK: 12 passed, 0 failed, 1 skipped" in proc.stdout


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
            "from ears_core.gpu_check import correctness, plan, speed, real_pairs\n"
            "import torch\n"
            "print(correctness.lossless(torch.device('cpu'), rows=2000).status)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "pass", proc.stderr


def test_the_lossless_check_fails_a_lossy_rule():
    assert correctness.lossless(CPU, rows=50_000).status == "pass"
    lossy = correctness.lossless(CPU, rows=50_000, rule=EARSRule(beta=1.0), expect="target")
    assert lossy.status == "fail" and lossy.figures["pvalue"] < 1e-3
    assert correctness.lossless(CPU, rows=50_000, rule=EARSRule(beta=1.0), expect="emitted").status == "pass"


def test_the_greedy_check_fails_a_decoder_that_parts_from_the_target(monkeypatch):
    real = correctness.generate

    def off_by_one(*args, **kwargs):
        out = real(*args, **kwargs)
        out.token_ids[5] = (out.token_ids[5] + 1) % 4096  # a different token: no near-tie explains it
        return out

    monkeypatch.setattr(correctness, "generate", off_by_one)
    check = correctness.greedy_equality(CPU, torch.float32, new_tokens=12)
    assert check.status == "fail" and "chain parts" in check.detail and check.figures["position"] == 5


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


def test_the_rollback_check_sees_a_cache_cut_at_the_wrong_place(monkeypatch):
    assert correctness.rollback(CPU, torch.float32).status == "pass"
    real = correctness.drop_last_positions
    monkeypatch.setattr(correctness, "drop_last_positions", lambda cache, n: real(cache, n + 1))
    assert correctness.rollback(CPU, torch.float32).status == "fail"
