"""A cold ZeroGPU worker inside its time (issue 55, point 3), and what ``gpu_check`` measures for the allowance:

- a request's decoding budget counts the start-up its GPU call spent (``StartupPair.decode_budget_s``);
- no tree warm-up where shape "auto" never picks a tree (CUDA);
- captured draft-step graphs are bounded per bank, the least recently used sampling evicted;
- an eager prompt pass computes logits for the kept rows only, and hidden states only when asked;
- ``gpu_check``'s cold start reports load, first token, capture and memory.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import spaces
import torch

from ears_core.draft import step_graphs
from ears_core.serve.pair_slot import PairSlot
from ears_core.serve.session import Session
from ears_core.serve.settings import Settings
from ears_core.studio import zerogpu

from conftest import tiny_llama
from test_app import tiny_backend
from test_zerogpu_space import zerogpu_like


def test_the_budget_counts_the_calls_start_up(monkeypatch):
    log: list = []
    budgets: list = []
    monkeypatch.setattr(spaces, "GPU", zerogpu_like(log))
    slot = zerogpu.StartupPair(Settings(target="embedded", timeout_s=20.0), tiny_backend())
    wrap = zerogpu.gpu_call(slot.settings)

    def handler(max_new: int = 8):
        time.sleep(0.3)  # the worker's start-up: its Session, warm-up and captures
        budgets.append(slot.decode_budget_s())
        yield "done"

    assert list(wrap(handler, "generate")(max_new=8)) == ["done"]
    name, asked = log[-1]  # 20 s of start-up allowance + 8 tokens x 0.05 s, at most timeout_s: 21 s
    assert (name, asked) == ("generate", 21)
    assert asked - 0.3 - zerogpu.END_MARGIN_S - 0.2 < budgets[0] <= min(20.0, asked - 0.3 - zerogpu.END_MARGIN_S)
    assert zerogpu.call_ends() is None  # the call ended: outside one, the settings' budget
    assert slot.decode_budget_s() == 20.0 and PairSlot(Settings(timeout_s=7.0)).decode_budget_s() == 7.0


def test_a_start_up_past_the_allowance_leaves_no_decoding(monkeypatch):
    monkeypatch.setattr(zerogpu, "START_S", 0.5)
    monkeypatch.setattr(spaces, "GPU", zerogpu_like([]))
    slot = zerogpu.StartupPair(Settings(target="embedded", timeout_s=20.0), tiny_backend())
    seen: list = []

    def handler(max_new: int = 1):
        seen.append(slot.decode_budget_s())
        yield None

    list(zerogpu.gpu_call(slot.settings)(handler, "generate")(max_new=1))
    assert seen == [0.0]  # ceil(0.5 + 0.05) = 1 s asked, less the margin: nothing left to decode


def test_no_tree_warm_up_where_auto_never_picks_a_tree(monkeypatch):
    trees: list = []
    for device in ("cpu", "cuda"):
        fake = SimpleNamespace(pair=SimpleNamespace(device=torch.device(device)), can_branch=True,
                               encode=lambda prompt: None, speculative=lambda ids, cfg: iter(()),
                               _tree_run=lambda *a: trees.append(device) or SimpleNamespace(gen=iter(())))
        Session._warm_up_decodes(fake, 4)
    assert trees == ["cpu"]


def test_draft_step_graphs_keep_a_few_samplings_and_evict_the_least_recently_used():
    steps = step_graphs.LMStepGraphs.__new__(step_graphs.LMStepGraphs)
    steps.samplings = step_graphs.OrderedDict()
    steps.bank = SimpleNamespace(graphs={})
    n = step_graphs.MAX_SAMPLINGS
    for t in range(n + 3):
        key = steps.use_sampling(("T", t))
        for bucket in (64, 128):  # graphs for two KV buckets under this sampling
            steps.bank.graphs[(bucket, key)] = object()
        steps.use_sampling(("T", 0))  # the first sampling stays in use
    kept = {k[-1] for k in steps.bank.graphs}
    assert len(kept) == n and ("T", 0) in kept and ("T", n + 2) in kept and ("T", 1) not in kept
    assert len(steps.bank.graphs) == 2 * n


def test_an_eager_prompt_pass_keeps_only_the_rows_the_loop_reads():
    from ears_core.model.cuda.graphed import GraphedLM

    ref = tiny_llama(0, vocab=96)
    model = GraphedLM(ref, capture=False)
    ids = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(0))  # past MAX_WIDTH: eager
    runner = model.runner
    calls: list = []
    real = runner.static.logits
    runner.static.logits = lambda states: calls.append(states.shape[0]) or real(states)
    out = model(ids, past_key_values=model.new_cache(), logits_to_keep=1)
    assert calls == [1] and out.logits.shape == (1, 1, 96) and out.hidden_states is None
    full = ref(ids).logits[:, -1:]
    torch.testing.assert_close(out.logits, full, atol=1e-4, rtol=1e-4)
    out = model(ids, past_key_values=model.new_cache(), logits_to_keep=0, output_hidden_states=True)
    assert calls[-1] == 40 and len(out.hidden_states) == ref.config.num_hidden_layers + 1


@pytest.mark.slow
def test_gpu_checks_cold_start_reports_what_the_allowance_needs(tmp_path):
    from ears_core.gpu_check import real_pairs
    from test_padded_heads import DRAFT_ROWS, TARGET_ROWS, TOKENS, _save_padded_qwen2

    _save_padded_qwen2(tmp_path / "t", TARGET_ROWS, 0)
    _save_padded_qwen2(tmp_path / "d", DRAFT_ROWS, 1)
    pair, start = real_pairs.cold_start(str(tmp_path / "t"), str(tmp_path / "d"), torch.device("cpu"))
    assert pair.vocab_size == TOKENS
    assert 0 < start["load_s"] <= start["first_token_s"]
    assert start["capture_s"] == 0.0 and start["gpu_allocated_gib"] == 0.0 == start["gpu_peak_gib"]  # CPU
