"""Tiny random Llama models built in memory: fast, deterministic, no files, no downloads."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time


def _worker_share() -> int:
    """The cores one pytest-xdist worker may use: all of them alone, its share beside the other workers. Two
    OpenMP threads on two cores beside a busy worker run a test 3-7x slower (each parallel region waits for its
    descheduled thread): the embedded pair's 32-token greedy check 5.7 s alone, 27 s beside a busy loop, 7.5 s
    there on one thread."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, len(os.sched_getaffinity(0)) // workers)


WORKER_THREADS = _worker_share()
if WORKER_THREADS < len(os.sched_getaffinity(0)):  # beside other workers: every thread a test starts (OpenMP reads
    os.environ.setdefault("OMP_NUM_THREADS", str(WORKER_THREADS))  # it when torch loads) and process shares too


import pytest  # noqa: E402  (after OMP_NUM_THREADS: OpenMP reads it once, when torch loads)
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny models: one thread avoids OpenMP overhead (and stalls when another process holds a core).
torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """The test files longest first, each file's tests in their own order. ``pytest -n 2 --dist loadfile
    --no-loadscope-reorder`` (the Makefile) hands files to the workers in this order, so the last ones are short and
    the workers end together (by their number of tests, xdist's default, the browser files came last and one worker
    waited 15-30 s for the other). The seconds are each file's in a full run here (``file_seconds.json``: its tests'
    wall times summed, e.g. from ``--junitxml``); a file not there counts 0.3 s a test."""
    import json
    from collections import Counter
    from pathlib import Path

    seconds = json.loads((Path(__file__).parent / "file_seconds.json").read_text())
    file_of = {item: item.nodeid.split("::")[0] for item in items}
    tests = Counter(file_of.values())
    # a stable sort: each file keeps its tests' order
    items.sort(key=lambda item: -seconds.get(Path(file_of[item]).name, 0.3 * tests[file_of[item]]))


@pytest.fixture
def worker_threads():
    """Torch's thread count set to this worker's share of the cores (``WORKER_THREADS``) for a test that decodes
    a real model, one thread again after."""
    torch.set_num_threads(WORKER_THREADS)
    yield WORKER_THREADS
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def never_busy(monkeypatch):
    """A measurement in a test is never called busy (timing.py), however loaded the machine running the suite:
    what a test checks must not depend on it. tests/test_cold_start.py checks the busy path itself."""
    import ears_core.timing

    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 1.0)


@pytest.fixture(scope="module", params=("best", "portable"))
def cpu_form(request):
    """A module's tests that ask for it run once per kernel mode (ears_core/model/kernels/cpu_forms.py): this
    machine's best forms, then the portable ones every CPU has (no oneDNN packing): a machine of one CPU class
    proves the code the others run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EARS_CPU_KERNELS", request.param)
        yield request.param


def tiny_llama(seed: int, *, vocab: int = 96, layers: int = 2, hidden: int = 32, std: float = 0.3,
               eos: int | None = None, max_pos: int = 256) -> LlamaForCausalLM:
    """A seeded random Llama. A large init std makes its distributions peaked, like a real LM's."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos,
        initializer_range=std, bos_token_id=0, eos_token_id=eos, pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = eos
    return model


def perturbed_copy(model: LlamaForCausalLM, noise: float, seed: int) -> LlamaForCausalLM:
    """A draft that agrees with ``model`` often but not always: its weights plus seeded noise."""
    draft = LlamaForCausalLM(model.config).eval()
    draft.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * torch.randn(p.shape, generator=gen))
    draft.generation_config.eos_token_id = model.generation_config.eos_token_id
    return draft


@pytest.fixture(scope="session")
def tiny_pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(target, draft): the draft is the target with noise, so acceptance is neither 0 nor 1."""
    target = tiny_llama(0)
    return target, perturbed_copy(target, 0.03, seed=1)


@pytest.fixture(scope="session")
def small_vocab_pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """A 16-token pair for distribution tests through the decoder (large expected counts); one layer, as the
    emitted law does not depend on depth and each of the thousands of calls costs a quarter less."""
    target = tiny_llama(3, vocab=16, std=0.1, layers=1)
    return target, perturbed_copy(target, 0.05, seed=4)


PROMPTS = [[1, 5, 7, 9], [0, 42], [3, 17, 17, 60, 2, 88, 11, 4, 30], [77]]


def assert_first_two_tokens_follow(target: LlamaForCausalLM, prompt: list[int], first: list[int],
                                   second: list[int], vocab: int = 16) -> None:
    """Chi-squared checks that seeded generations' first tokens follow P_target after ``prompt``
    and their second tokens P_target after ``prompt + [first]`` (pooled over firsts seen >= 60 times)."""
    import numpy as np
    from scipy import stats

    n = len(first)
    with torch.no_grad():
        p0 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1].double(), -1).numpy()
        assert stats.chisquare(np.bincount(first, minlength=vocab), p0 / p0.sum() * n).pvalue > 1e-3
        stat, df = 0.0, 0
        for a in set(first):
            sel = [s for f, s in zip(first, second) if f == a]
            if len(sel) < 60:
                continue
            p1 = torch.softmax(target(torch.tensor([prompt + [a]])).logits[0, -1].double(), -1).numpy()
            exp = p1 * len(sel)
            stat += float(((np.bincount(sel, minlength=vocab) - exp) ** 2 / exp).sum())
            df += vocab - 1
        assert df >= 30 and stats.chi2.sf(stat, df) > 1e-3


@contextlib.contextmanager
def crowded_cores(seconds: float = 5):
    """One other process spinning on every core for the block (at most ``seconds``): two busy processes on two
    cores. More would slow the suite's other worker as much and prove nothing more."""
    cores = len(os.sched_getaffinity(0))
    spin = f"import time\nstop = time.perf_counter() + {seconds}\nwhile time.perf_counter() < stop: pass"
    others = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores)]
    try:
        time.sleep(0.3)  # they are spinning
        yield
    finally:
        for proc in others:
            proc.kill()
            proc.wait()


def stand_in_for(model: torch.nn.Module, measure):
    """A stand-in for ``measure_prices`` that answers ``measure(...)`` for ``model`` only. Another test's server
    may still be measuring its own pair between its requests (serve/between.py) in this worker, and the
    module-level stand-in answers it too: it gets a flat curve, uncounted, so what a test counts is its own."""
    from ears_core.policy.costs import PriceCurve

    def stand_in(target, *args, **kwargs):
        if target is not model:
            return PriceCurve([1.0] * kwargs.get("max_m", 9), 0.1, measured_at="another test's pair")
        return measure(target, *args, **kwargs)

    return stand_in
