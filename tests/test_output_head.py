"""The planned output projection (ears_core/model/kernels/output_head.py): same logits, the measured layout, cached."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ears_core.model.kernels import output_head
from ears_core.model.kernels.output_head import LAYOUTS, HeadPlan, PlannedLinear, choose_layouts, install_planned_head, plan_head


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bias", [False, True])
def test_every_layout_computes_the_same_logits(layout, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 3000, bias=bias)
    planned = PlannedLinear(lin, HeadPlan([layout] * 6, [{}] * 6))
    assert planned.weight is lin.weight  # the same Parameter: tied embeddings stay tied
    assert (planned.weight_t is not None) == (layout == "xw")
    for shape in [(1, 1, 48), (1, 3, 48), (2, 3, 48), (1, 9, 48), (5, 48)]:  # 9 rows > the plan: linear
        x = torch.randn(*shape)
        want = F.linear(x, lin.weight, lin.bias)
        got = planned(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_layout_follows_the_rows():
    plan = HeadPlan(["xw", "wx", "linear"], [{}] * 3)
    assert [plan.layout(r) for r in (1, 2, 3, 4, 0)] == ["xw", "wx", "linear", "linear", "linear"]


def test_choose_layouts_takes_the_fastest_and_linear_on_a_tie():
    ms = [{"linear": 9.9, "wx": 10.0, "xw": 5.7}, {"linear": 20.9, "wx": 7.0, "xw": 10.4},
          {"linear": 3.0, "wx": 3.0, "xw": 3.0}, {"linear": 1.0, "wx": 2.0}]
    assert choose_layouts(ms) == ["xw", "wx", "linear", "linear"]


def test_plan_head_keeps_the_fastest_median_on_a_fake_clock(monkeypatch):
    """Each layout 'takes' a known time per row count; one call in seven is slow (another job; at most one of any five samples): the
    median ignores it and the plan is the brute-force argmin."""
    cost = {"linear": [10, 21, 32, 20], "wx": [11, 7, 11, 22], "xw": [6, 10, 16, 31]}
    now, calls = [0.0], itertools.count()

    def fake_run(layout, h, w, w_t):
        spike = 50.0 if next(calls) % 7 == 0 else 0.0
        now[0] += (cost[layout][h.shape[0] - 1] + spike) / 1000

    monkeypatch.setattr(output_head, "run_layout", fake_run)
    plan = plan_head(torch.zeros(8, 4), max_rows=4, repeats=5, clock=lambda: now[0])
    want = [min(LAYOUTS, key=lambda n: cost[n][r]) for r in range(4)]
    assert plan.layouts == want == ["xw", "wx", "wx", "linear"]
    assert plan.ms[1]["wx"] == pytest.approx(7.0)


def _lm(vocab: int, hidden: int = 64) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_a_small_head_is_left_alone(tmp_path):
    model = _lm(500)
    assert install_planned_head(model, cache_dir=tmp_path) is None
    assert type(model.get_output_embeddings()) is torch.nn.Linear


def test_install_keeps_the_logits_and_the_tying_and_caches_the_plan(tmp_path, monkeypatch):
    vocab = output_head.MIN_ELEMENTS // 64 + 1  # just large enough to be planned
    model = _lm(vocab)
    ids = torch.randint(0, vocab, (1, 7))
    with torch.no_grad():
        before = [model(ids, logits_to_keep=k).logits for k in (1, 2, 3, 5)]
    plan = install_planned_head(model, max_rows=6, cache_dir=tmp_path)
    assert plan is not None and len(plan.layouts) == 6 and set(plan.layouts) <= set(LAYOUTS)
    head = model.get_output_embeddings()
    assert isinstance(head, PlannedLinear)
    assert head.weight is model.get_input_embeddings().weight  # still tied
    with torch.no_grad():
        after = [model(ids, logits_to_keep=k).logits for k in (1, 2, 3, 5)]
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert install_planned_head(model, cache_dir=tmp_path) is plan  # installed once
    files = list((tmp_path / "kernels").glob("head-*.json"))
    assert len(files) == 1

    def no_measuring(*a, **k):
        raise AssertionError("the cached plan should have been read")

    monkeypatch.setattr(output_head, "plan_head", no_measuring)
    again = _lm(vocab)
    assert install_planned_head(again, max_rows=6, cache_dir=tmp_path).layouts == plan.layouts
