"""oneDNN-packed linear layers (ears_core/model/kernels/packed_linear.py): same outputs, the measured choice, cached."""

import copy

import pytest
import torch

from conftest import PROMPTS, tiny_llama
from ears_core import GreedyRule, autoregressive, generate
from ears_core.model.kernels import packed_linear as pl
from ears_core.policy.profile import profile_key
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.model.kernels.output_head import HeadPlan, PlannedLinear
from ears_core.model.kernels.packed_linear import PackedLinear, choose_kernels, pack_like, pack_linears, set_packed

pytestmark = pytest.mark.skipif(not pl.available(), reason="this torch has no oneDNN (mkldnn) build")


def _linear(bias: bool, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(48, 80, bias=bias)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_packed_linear_computes_the_linear_layer(bias, rows):
    lin = _linear(bias)
    packed = PackedLinear(lin)
    x = torch.randn(2, rows, 48)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)  # (2, rows, 80)
        wide = torch.randn(2, rows + 3, 48)[:, 1 : rows + 1]  # a non-contiguous slice, as decoding passes
        torch.testing.assert_close(packed(wide), lin(wide), rtol=1e-5, atol=1e-5)


def test_gradients_inactive_layers_and_other_dtypes_run_the_original_layer():
    lin = _linear(True)
    packed = PackedLinear(lin)
    x = torch.randn(3, 48, requires_grad=True)
    packed(x).sum().backward()  # would raise through the packed op, which has no backward
    torch.testing.assert_close(x.grad, lin.weight.sum(0).expand(3, -1))

    calls = []
    original = lin.forward
    lin.forward = lambda t: calls.append(t.shape) or original(t)
    with torch.inference_mode():
        packed(torch.randn(2, 48))
        assert calls == []  # the packed path
        packed.active = False
        packed(torch.randn(2, 48))
        packed.active = True
        with pytest.raises(RuntimeError, match="dtype"):  # another dtype: the layer's own error, not oneDNN's
            packed(torch.randn(2, 48, dtype=torch.float64))
    assert len(calls) == 2


def test_a_weight_changed_in_place_is_packed_again():
    lin = _linear(False)
    packed = PackedLinear(lin)
    x = torch.randn(4, 48)
    with torch.no_grad():
        lin.weight.mul_(-2.0)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), x @ lin.weight.T, rtol=1e-5, atol=1e-5)


def test_packing_a_model_keeps_logits_tying_state_dict_and_greedy_output():
    model = tiny_llama(0, vocab=96)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.get_input_embeddings().weight
    keys = sorted(model.state_dict())
    ids = torch.tensor([PROMPTS[0]])
    with torch.inference_mode():
        before = model(ids).logits  # (1, T, V)
        greedy = autoregressive(model, PROMPTS[0], temperature=0, max_new_tokens=20).token_ids
    n = pack_linears(model)
    assert n == 2 * 7 + 1  # 7 linear layers in each of 2 decoder layers, and the output head
    assert isinstance(model.lm_head, PackedLinear) and model.lm_head.weight is model.get_input_embeddings().weight
    assert sorted(model.state_dict()) == keys
    assert "packed" in profile_key(model)  # a packed model's prices are cached apart
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-4, atol=1e-4)
    assert autoregressive(model, PROMPTS[0], temperature=0, max_new_tokens=20).token_ids == greedy
    set_packed(model, False)
    assert "packed" not in profile_key(model)


def test_a_planned_output_head_is_packed_and_falls_back_to_its_plan():
    lin = _linear(False)
    planned = PlannedLinear(lin, HeadPlan(["wx"] * 8, [{}] * 8))
    parent = torch.nn.Sequential(planned)
    assert pack_linears(parent) == 1
    packed = parent[0]
    assert isinstance(packed, PackedLinear) and packed._inner[0] is planned
    x = torch.randn(3, 48)
    with torch.inference_mode():
        on = packed(x)
        set_packed(parent, False)
        torch.testing.assert_close(on, packed(x), rtol=1e-5, atol=1e-5)


def test_greedy_speculative_output_with_a_packed_pair_is_the_targets():
    target = tiny_llama(0, vocab=96)
    torch.manual_seed(5)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).eval()
    reference = [autoregressive(target, p, temperature=0, max_new_tokens=24).token_ids for p in PROMPTS[:3]]
    pack_linears(target)
    drafter = EagleDrafter(head, target)
    assert pack_like(target, drafter) > 1 and isinstance(drafter.sub_head, PackedLinear)  # the head's output rows too
    feats = torch.randn(3, target.config.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(drafter._sub(feats), feats @ drafter.w_sub.T, rtol=1e-5, atol=1e-5)
    for prompt, want in zip(PROMPTS[:3], reference):
        for k in (1, 4):
            out = generate(target, drafter.fresh(), prompt, rule=GreedyRule(), k=k, temperature=0,
                           max_new_tokens=24)
            assert out.token_ids == want


def test_choose_kernels_keeps_packed_only_when_it_measures_faster_and_caches_the_choice(tmp_path, monkeypatch):
    base = tiny_llama(0, vocab=96)
    assert choose_kernels(copy.deepcopy(base), cache_dir=tmp_path) is None  # too small to be worth it
    monkeypatch.setattr(pl, "MIN_ELEMENTS", 0)
    timings = {"packed": {"1": 9.0, "3": 9.5, "5": 10.0}, "loaded": {"1": 10.0, "3": 18.0, "5": 14.0}}
    calls = []
    monkeypatch.setattr(pl, "measure_modes", lambda model, **k: calls.append(1) or timings)
    faster = copy.deepcopy(base)
    choice = choose_kernels(faster, cache_dir=tmp_path)
    assert choice.packed and calls == [1] and pl.is_packed(faster)
    again = copy.deepcopy(base)
    assert choose_kernels(again, cache_dir=tmp_path).packed and calls == [1]  # read from the cache
    assert choose_kernels(again, cache_dir=tmp_path) is None  # already decided for this model

    timings = {"packed": {"1": 10.0, "3": 10.0, "5": 10.0}, "loaded": {"1": 10.2, "3": 10.2, "5": 10.2}}
    level = copy.deepcopy(base)
    choice = choose_kernels(level, cache_dir=tmp_path, refresh=True)  # < 3 % better: not worth a second copy
    assert not choice.packed and calls == [1, 1] and not pl.is_packed(level)
    assert not any(isinstance(m, PackedLinear) for m in level.modules())  # its own layers are back
    assert [type(m) for m in level.modules()] == [type(m) for m in base.modules()]
    later = copy.deepcopy(base)
    assert not choose_kernels(later, cache_dir=tmp_path).packed and calls == [1, 1]  # cached: nothing packed
    assert not any(isinstance(m, PackedLinear) for m in later.modules())


def test_measure_modes_times_both_modes_and_leaves_the_model_packed():
    model = tiny_llama(0, vocab=96)
    pack_linears(model)
    ms = pl.measure_modes(model, rounds=2, cache_len=8)
    assert set(ms) == {"packed", "loaded"}
    assert all(set(v) == {str(m) for m in pl.MEASURED_M} and min(v.values()) > 0 for v in ms.values())
    assert pl.is_packed(model)
