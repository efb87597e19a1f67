"""Exact rows (model/kernels/exact_rows.py): float64 attention, the row cap and chunked passes, so that a bfloat16
CPU target gives a token the same logits in a verify pass as in a one-token pass, and greedy speculative
output equals target-only greedy output."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from conftest import tiny_llama
from ears_core import autoregressive, generate, load_pair
from ears_core.model.kernels import exact_rows, packed_linear
from ears_core.model.loading import hub
from ears_core.model.kernels.exact_rows import CHECKED_WIDTHS, EXACT_ATTENTION, exact_attention, make_rows_exact, rows_agree
from ears_core.model.kernels.packed_linear import PackedLinear
from test_models import save_noisy_pair


def _bfloat16_linears_are_row_invariant() -> bool:
    """Whether this CPU's bfloat16 matmul gives a row the same result alone as among 40 rows (the tiny test
    models are not packed: their linears are plain ``F.linear``). Where it does not, a tiny bfloat16 model
    cannot be made exact and ``load_pair`` falls back to float32 (the last test covers that path)."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(64, 32, generator=g).bfloat16(), torch.randn(40, 32, generator=g).bfloat16()
    return torch.equal(F.linear(x, w), torch.cat([F.linear(row[None], w) for row in x]))


needs_invariant_linears = pytest.mark.skipif(not _bfloat16_linears_are_row_invariant(),
                                             reason="this CPU's bfloat16 matmul rounds by row count")
needs_bfloat16_packing = pytest.mark.skipif(not packed_linear.available(torch.bfloat16),
                                            reason="needs oneDNN's bfloat16 packing (tried: model/kernels/cpu_forms.py)")


def test_a_fixed_case_with_a_known_answer() -> None:
    q = torch.tensor([1.0, 0.0]).reshape(1, 1, 1, 2)  # (B, H, m, D)
    k = torch.tensor([[1.0, 0.0], [0.0, 0.0]]).reshape(1, 1, 2, 2)  # (B, Hkv, n, D)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).reshape(1, 1, 2, 2)
    out, weights = exact_attention(None, q, k, v, None, scaling=1.0)  # softmax([1, 0]) over two values
    e = math.e
    assert weights is None and out.shape == (1, 1, 1, 2)  # (B, m, H, D)
    torch.testing.assert_close(out.reshape(2), torch.tensor([e / (e + 1), 1 / (e + 1)]))


@pytest.mark.parametrize("boolean", [False, True])
def test_it_is_scaled_dot_product_attention_with_grouped_queries_and_a_causal_mask(boolean: bool) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 3, 8, generator=g)  # 6 query heads over 2 key/value heads, 3 new rows
    k, v = torch.randn(2, 2, 7, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g)  # 4 cached + 3 new keys
    seen = torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4)  # row i sees keys 0 .. 4 + i
    mask = seen if boolean else torch.zeros(3, 7).masked_fill(~seen, torch.finfo(torch.float32).min)
    out, _ = exact_attention(None, q, k, v, mask[None, None], scaling=0.3)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=0.3, enable_gqa=True)  # (B, H, m, D)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)
    assert out.dtype == q.dtype


@needs_invariant_linears
def test_rows_agree_holds_for_exact_attention_and_catches_width_dependent_rounding() -> None:
    model = tiny_llama(0).to(torch.bfloat16)
    assert make_rows_exact(model) == 32 and model.ears_row_cap == 32
    assert model.config._attn_implementation == EXACT_ATTENTION
    assert rows_agree(model, CHECKED_WIDTHS)

    def sloppy(module, query, *args, **kwargs):  # rounds a wide pass's output one way and a narrow one another
        out, _ = exact_attention(module, query, *args, **kwargs)
        return (out * 1.01 if query.shape[2] > 1 else out), None

    AttentionInterface.register("test_sloppy", sloppy)
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionMaskInterface.register("test_sloppy", eager_mask)
    model.set_attn_implementation("test_sloppy")
    assert not rows_agree(model, (2, 9))


@needs_bfloat16_packing
def test_make_rows_exact_leaves_a_model_it_cannot_make_exact_as_it_was(monkeypatch) -> None:
    model = tiny_llama(0).to(torch.bfloat16)
    model.lm_head = PackedLinear(model.lm_head)
    before = model.config._attn_implementation
    caps = []
    monkeypatch.setattr(exact_rows, "rows_agree", lambda *a, **k: caps.append(model.lm_head.max_rows) or False)
    assert make_rows_exact(model) is None
    assert caps == [32, 16, 8]  # every cap tried, widest first
    assert model.config._attn_implementation == before and model.lm_head.max_rows is None
    assert not hasattr(model, "ears_row_cap")


@needs_bfloat16_packing
def test_a_packed_layer_with_a_row_cap_multiplies_chunk_by_chunk() -> None:
    g = torch.Generator().manual_seed(2)
    layer = PackedLinear(torch.nn.Linear(16, 8, dtype=torch.bfloat16))
    x = torch.randn(2, 11, 16, generator=g).to(torch.bfloat16)  # 22 rows
    whole = layer(x)
    layer.max_rows = 4
    chunked = layer(x)
    assert chunked.shape == (2, 11, 8)
    rows = x.reshape(22, 16)
    by_hand = torch.cat([layer(rows[i:i + 4]) for i in range(0, 22, 4)])  # each chunk alone, under the cap
    assert torch.equal(chunked.reshape(22, 8), by_hand)
    torch.testing.assert_close(chunked, whole, atol=2e-2, rtol=2e-2)


@needs_invariant_linears
def test_a_bfloat16_cpu_pair_gets_exact_rows_and_its_greedy_output_is_the_target_s(tmp_path: Path) -> None:
    target_dir, draft_dir = save_noisy_pair(tmp_path, 0.02)
    pair = load_pair(str(target_dir), str(draft_dir), device="cpu", dtype="bfloat16")
    assert pair.dtype == torch.bfloat16 and pair.rows_exact is True and pair.target.ears_row_cap == 32
    gen = torch.Generator().manual_seed(3)
    for length in (5, 20, 38):  # 38: a prompt longer than the row cap
        ids = torch.randint(3, 100, (1, length), generator=gen)
        base = autoregressive(pair.target, ids, temperature=0.0, max_new_tokens=24, vocab_size=pair.vocab_size)
        for k in (1, 4, 8):
            spec = generate(pair.target, pair.new_drafter(), ids, temperature=0.0, max_new_tokens=24, k=k,
                            vocab_size=pair.vocab_size)
            assert spec.token_ids == base.token_ids, (length, k)


def test_the_default_falls_back_to_float32_where_rows_do_not_agree(monkeypatch, tmp_path: Path) -> None:
    target_dir, _ = save_noisy_pair(tmp_path, 0.02)
    monkeypatch.delenv("EARS_DTYPE", raising=False)
    monkeypatch.setattr(hub, "native_bf16", lambda: True)
    if _bfloat16_linears_are_row_invariant():
        pair = load_pair(str(target_dir), None, device="cpu")
        assert pair.dtype == torch.bfloat16 and pair.rows_exact is True  # the default on a CPU with native bfloat16
    monkeypatch.setattr(exact_rows, "rows_agree", lambda *a, **k: False)
    pair = load_pair(str(target_dir), None, device="cpu")
    assert pair.dtype == torch.float32 and pair.rows_exact is None  # not exact: not the default
    with pytest.warns(UserWarning, match="does not give bit for bit"):
        pair = load_pair(str(target_dir), None, device="cpu", dtype="bfloat16")  # asked for: kept, with a warning
    assert pair.dtype == torch.bfloat16 and pair.rows_exact is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_pair(str(target_dir), None, device="cpu", dtype="float32").rows_exact is None
