"""Float linear layers on the int4 kernel (model/kernels/int4_linear.py) and the draft head's int4 variant."""

import pytest
import torch
from torch import nn

from conftest import tiny_llama
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.draft.head_kernels import INT4_MIN_GAIN, MIN_GAIN, Variant, _pick, candidates
from ears_core.model.kernels import cpu_forms
from ears_core.model.kernels.gguf_q4 import dequantize_q4_1
from ears_core.model.kernels.int4_linear import Int4Linear, q4_1_blocks, quantize_linears, round_trip, side_by_side, takes

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
F32, F32P, BF, BFP = Variant("float32", False), Variant("float32", True), Variant("bfloat16", False), Variant("bfloat16", True)
I4 = Variant("bfloat16", False, True)
needs_kernel = pytest.mark.skipif(not cpu_forms.int4_runs(), reason="needs PyTorch's CPU int4 kernel running with bfloat16 activations")


def _layer_and_rows(n_in: int, n_out: int, rows: int, seed: int, bias: bool) -> tuple[nn.Linear, torch.Tensor]:
    """A linear layer with seeded standard-normal weights (and bias), and ``rows`` bfloat16 inputs (rows, n_in)."""
    gen = torch.Generator().manual_seed(seed)
    layer = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n_out, n_in, generator=gen))
        if bias:
            layer.bias.copy_(torch.randn(n_out, generator=gen))
    return layer, torch.randn(rows, n_in, generator=gen).to(torch.bfloat16)


@needs_kernel
def test_an_int4_linear_computes_its_blocks_within_bfloat16_rounding():
    layer, x = _layer_and_rows(96, 48, rows=5, seed=11, bias=True)
    four = Int4Linear(layer)
    ref = x.float() @ dequantize_q4_1(*q4_1_blocks(layer.weight)).T + layer.bias  # (5, 48) float32 of the same blocks
    got = four(x)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 48)
    assert torch.allclose(got.float(), ref, rtol=2e-2, atol=5e-2 * ref.abs().mean().item())
    assert (got.float() - x.float() @ layer.weight.T - layer.bias).abs().max() > 1e-3  # 4-bit: not the float layer
    rows = torch.cat([four(x[i:i + 1]) for i in range(5)])
    assert torch.equal(rows, got)  # a row's result does not depend on the rows beside it


@needs_kernel
def test_the_round_trip_is_the_weight_the_kernel_computes_with():
    layer, x = _layer_and_rows(128, 32, rows=3, seed=5, bias=False)
    w4 = round_trip(layer.weight)
    got, ref = Int4Linear(layer)(x).float(), x.float() @ w4.T
    assert torch.allclose(got, ref, rtol=1e-2, atol=1e-2 * ref.abs().mean().item())  # the kernel's own weights
    far = (x.float() @ layer.weight.detach().T - ref).abs().mean()
    assert (got - ref).abs().mean() < far / 10  # much closer than the float weight is


def test_only_shapes_the_kernel_takes_are_swapped():
    net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 16), nn.Linear(64, 24)))
    assert [takes(m) for m in (net[0], net[2][0], net[2][1])] == [True, False, False]  # 16 inputs; 24 outputs
    with pytest.raises(ValueError, match="multiple of 32 and outputs of 16, not 16 -> 16"):
        Int4Linear(net[2][0])
    if cpu_forms.int4_runs():
        assert quantize_linears(net) == 1 and isinstance(net[0], Int4Linear) and isinstance(net[2][0], nn.Linear)


def test_the_int4_variant_is_offered_beside_the_lean_target_where_its_kernel_runs():
    assert candidates(CPU, torch.bfloat16, env={}, bf16=True, packing=True, int4_runs=True) == [BF, BFP]
    assert candidates(CPU, torch.bfloat16, env={}, bf16=True, packing=True, int4=True, int4_runs=True) == [BF, BFP, I4]
    # no native bfloat16 and no oneDNN bfloat16 (an AVX2 CPU): the int4 kernel still runs there, and is offered
    assert candidates(CPU, torch.bfloat16, env={}, bf16=False, packing=False, int4=True, int4_runs=True) == [BF, I4]
    assert candidates(CPU, torch.bfloat16, env={}, bf16=True, packing=False, int4=True, int4_runs=False) == [BF]
    assert candidates(CPU, torch.bfloat16, env={"EARS_DRAFT_DTYPE": "float32"}, bf16=True, int4=True,
                      packing=False, int4_runs=True) == [F32]
    assert candidates(CPU, torch.float32, env={"EARS_DRAFT_DTYPE": "INT4"}, bf16=False, int4_runs=True) == [I4]
    with pytest.raises(ValueError, match="EARS_DRAFT_DTYPE=int4 needs PyTorch's CPU int4 kernel, which does not run here"):
        candidates(CPU, torch.float32, env={"EARS_DRAFT_DTYPE": "int4"}, int4_runs=False)
    with pytest.raises(ValueError, match="does not run here"):  # a GPU: the CPU kernel is not its
        candidates(CUDA, torch.bfloat16, env={"EARS_DRAFT_DTYPE": "int4"}, int4_runs=True)
    want = [BF, I4] if cpu_forms.int4_runs() else [BF]  # asked of this machine: the kernel is tried
    assert candidates(CPU, torch.bfloat16, env={}, packing=False, int4=True) == want
    assert I4.label == "int4" and I4.torch_dtype == torch.bfloat16


def test_the_int4_variant_must_beat_the_best_float_one_by_its_margin():
    base = 2.0
    assert _pick([BF, BFP, I4], {BF: base, BFP: 1.5, I4: 1.5 * (1 - INT4_MIN_GAIN) - 0.01}) == I4
    assert _pick([BF, BFP, I4], {BF: base, BFP: 1.5, I4: 1.5 * (1 - INT4_MIN_GAIN / 2)}) == BFP
    assert _pick([BF, BFP], {BF: base, BFP: base * (1 - MIN_GAIN / 2)}) == BF


@needs_kernel
def test_a_quantized_head_drafts_and_greedy_output_stays_the_targets():
    from ears_core import GreedyRule, autoregressive, generate

    torch.manual_seed(3)
    target = tiny_llama(0)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).to(torch.bfloat16).eval()
    drafter = EagleDrafter(head, target)
    assert drafter.quantize_kernels() == 9  # fc, q, k, v, o, gate, up, down, and the output rows
    assert isinstance(drafter.sub_head, Int4Linear) and isinstance(head.fc, Int4Linear)
    prompt = [1, 5, 9, 14, 3]
    base = autoregressive(target, prompt, temperature=0.0, max_new_tokens=16)
    spec = generate(target, drafter, prompt, rule=GreedyRule(), k=3, temperature=0, max_new_tokens=16)
    assert spec.token_ids == base.token_ids and spec.stats.drafted > 0
    with pytest.raises(ValueError, match="bfloat16"):
        EagleDrafter(DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)), target).quantize_kernels()


def test_the_int4_layers_variant_keeps_the_output_rows_in_bfloat16(monkeypatch):
    from ears_core import GreedyRule, autoregressive, generate
    from ears_core.draft.head_kernels import INT4_LAYERS_VARIANT, candidates

    env = {"EARS_DRAFT_DTYPE": "int4-layers"}
    assert candidates(torch.device("cpu"), torch.bfloat16, env=env, bf16=True) == [INT4_LAYERS_VARIANT]
    assert INT4_LAYERS_VARIANT.label == "int4-layers" and INT4_LAYERS_VARIANT.int4
    torch.manual_seed(3)
    target = tiny_llama(0)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).to(torch.bfloat16).eval()
    drafter = EagleDrafter(head, target)
    rows = drafter.sub_head.weight.detach().clone()  # (N, d)
    assert drafter.quantize_kernels(rows=False) == 8  # the layers only
    assert not isinstance(drafter.sub_head, Int4Linear) and isinstance(head.fc, Int4Linear)
    feats = torch.randn(3, rows.shape[1]).to(torch.bfloat16)
    torch.testing.assert_close(drafter._sub(feats), (feats.float() @ rows.float().T), atol=0.05, rtol=0.02)
    prompt = [1, 5, 9, 14, 3]
    base = autoregressive(target, prompt, temperature=0.0, max_new_tokens=16)
    spec = generate(target, drafter, prompt, rule=GreedyRule(), k=3, temperature=0, max_new_tokens=16)
    assert spec.token_ids == base.token_ids and spec.stats.drafted > 0


@needs_kernel
def test_int4_layers_side_by_side_give_their_parts_bits_in_one_call():
    parts = [Int4Linear(_layer_and_rows(128, n, 1, seed, False)[0]) for seed, n in enumerate((128, 64, 192))]
    one = side_by_side(tuple(parts))
    assert one is not None and (one.in_features, one.out_features) == (128, 384)
    for rows in (1, 2, 3, 5):
        x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
        assert torch.equal(one(x), torch.cat([p(x) for p in parts], -1))
    # not such parts: outputs not a multiple of 64 (the kernel packs those otherwise), a bias, other inputs, float
    assert side_by_side((parts[0], Int4Linear(_layer_and_rows(128, 48, 1, 7, False)[0]))) is None
    assert side_by_side((parts[0], Int4Linear(_layer_and_rows(128, 64, 1, 7, True)[0]))) is None
    assert side_by_side((parts[0], Int4Linear(_layer_and_rows(64, 64, 1, 7, False)[0]))) is None
    assert side_by_side((parts[0], _layer_and_rows(128, 64, 1, 7, False)[0])) is None


@needs_kernel
def test_an_int4_heads_layers_run_q_k_v_and_gate_up_each_in_one_call_with_the_same_bits(monkeypatch):
    import ears_core.draft.head_layers as head_layers

    target = tiny_llama(0, hidden=256)  # head_dim 64: q 256, k and v 128, gate and up 512 outputs
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).to(torch.bfloat16).eval()
    quantize_linears(head.body)
    z = torch.randn(1, 5, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    layers = head_layers.HeadLayers(head.body)
    assert head_layers.HeadLayers(head.body).layers[0].qkv is layers.layers[0].qkv  # made once, not every request
    assert all(isinstance(l.qkv, Int4Linear) and isinstance(l.gate_up, Int4Linear) for l in layers.layers)
    calls = []
    monkeypatch.setattr(Int4Linear, "forward", lambda self, x, f=Int4Linear.forward: calls.append(1) or f(self, x))
    with torch.inference_mode():
        fused = layers(z, layers.new_cache())
    assert len(calls) == 4 * len(layers.layers)  # q/k/v, o, gate/up, down
    monkeypatch.setattr(head_layers, "side_by_side", lambda parts: None)
    for layer in head.body.layers:  # made once for the modules a layer holds: made again, apart
        layer.__dict__.pop("_ears_side_by_side")
    apart = head_layers.HeadLayers(head.body)
    assert isinstance(apart.layers[0].qkv, tuple)
    with torch.inference_mode():
        assert torch.equal(fused, apart(z, apart.new_cache()))
        assert len(calls) == 4 * len(layers.layers) + 7 * len(layers.layers)
