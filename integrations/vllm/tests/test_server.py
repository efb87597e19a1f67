"""Through vLLM's OpenAI-compatible server (engine core and worker in their own processes, the
plug-in loaded in each by its entry point), with a real HTTP client: a completion, then the
plug-in's counters and vLLM's own speculative-decoding counters at /metrics."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from conftest import engine_kwargs

pytestmark = pytest.mark.timeout(900)  # vLLM starts take a minute on 2 busy cores (the repo's default: 300 s)

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    port = _free_port()
    kw = engine_kwargs()
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--host", "127.0.0.1",
            "--port", str(port), "--max-model-len", str(kw["max_model_len"]), "--enforce-eager",
            "--kv-cache-memory-bytes", str(kw["kv_cache_memory_bytes"]), "--dtype", "float32", "--seed", "0",
            "--speculative-config", json.dumps(NGRAM)]
    env = {**os.environ, "EARS_VLLM_RULE": "ears", "EARS_VLLM_BETA": "0.3"}
    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "EARS_VLLM_STATS_DIR", "EARS_VLLM_RUN"):
        env.pop(var, None)
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(args, env=env, stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() - t0 > 420:
                pytest.fail(f"the server did not start in 420 s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        print(f"API server up in {time.time() - t0:.1f} s")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _metric(text: str, name: str) -> float:
    total = 0.0
    found = False
    for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M):
        total += float(m.group(1))
        found = True
    assert found, f"{name} not in /metrics"
    return total


def test_completion_and_counters(server, target):
    prompt = ("Repeat this sentence five times: The quick brown fox jumps over the lazy dog. "
              "The quick brown fox jumps over the lazy dog.")
    r = httpx.post(f"{server}/v1/chat/completions", timeout=300, json={
        "model": target, "messages": [{"role": "user", "content": prompt}], "max_tokens": 32,
        "temperature": 0.9, "seed": 1, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 32 and body["choices"][0]["message"]["content"].strip()
    deadline = time.time() + 30
    while True:  # vLLM's counters reach the API process with the step's stats: allow a moment
        text = httpx.get(f"{server}/metrics", timeout=10).text
        drafted = _metric(text, "ears_vllm_drafted_tokens_total")
        vllm_drafted = _metric(text, "vllm:spec_decode_num_draft_tokens_total")
        if drafted == vllm_drafted or time.time() > deadline:
            break
        time.sleep(1)
    accepted = _metric(text, "ears_vllm_accepted_tokens_total")
    pardoned = _metric(text, "ears_vllm_pardoned_tokens_total")
    assert 'rule="ears(beta=0.3)"' in text
    assert drafted > 0 and drafted == vllm_drafted
    assert accepted == _metric(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert 0 <= pardoned <= accepted
    print(f"server: drafted {drafted:g}, accepted {accepted:g}, pardoned {pardoned:g}")
