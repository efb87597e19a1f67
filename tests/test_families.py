"""Every preset family's structure, checked on the CPU against transformers (model/passes/static_decoder.py).

Terms
-----
family case   a tiny random target with the structure of a preset's: llama3 rope scaling with a tied or an
              untied head and groups of 4 (Llama-3.1/3.2), linear and yarn scaling (yarn's attention factor
              scales cos and sin), Qwen2 with random non-zero q/k/v biases, a tied head, groups of 6 and 7
              and its sliding window switched off (Qwen2.5), Qwen3 with q/k norms and a head width other
              than hidden / heads, Mistral without a sliding window. Every RMSNorm weight is random too
              (their init is all ones).
padded rows   the tokenizer has ``VOCAB`` tokens; the target's head has ``TARGET_ROWS`` rows and the draft's
              ``DRAFT_ROWS``, as Qwen2.5's heads are padded past its tokenizer. Decoding passes
              ``vocab_size=VOCAB``.
draft         the same family and shape as the target, its weights the target's (rows cut to its head) plus
              seeded noise: it agrees with the target often but not always.
one copy      after the static pass is built, the unique tensor storages reachable from the model, from the
              static pass and from an outside holder of the original Parameter objects (as ZeroGPU's
              ``spaces`` packing holds them) add up to one copy of the weights.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch
from torch import nn
from transformers import (GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from ears_core import GreedyRule, autoregressive, generate
from ears_core.draft.drafters import ModelDrafter
from ears_core.model.cuda.graphed import GraphedLM
from ears_core.model.passes.static_decoder import supports

VOCAB, TARGET_ROWS, DRAFT_ROWS = 200, 256, 232
ROPE_THETA = 500000.0
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_theta": ROPE_THETA}
LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": ROPE_THETA}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": ROPE_THETA}
COMMON = dict(num_hidden_layers=2, max_position_embeddings=256, initializer_range=0.1, bos_token_id=0,
              eos_token_id=None, pad_token_id=None)

# name -> (config class, model class, the preset's structure)
FAMILIES: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "llama3-tied": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2,
        rope_parameters=LLAMA3, tie_word_embeddings=True)),
    "llama3-untied": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2,
        rope_parameters=LLAMA3, tie_word_embeddings=False)),
    "llama-yarn": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=1,
        rope_parameters=YARN, tie_word_embeddings=False)),
    "llama-linear": (LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters=LINEAR, tie_word_embeddings=True)),
    "qwen2-group6": (Qwen2Config, Qwen2ForCausalLM, dict(
        hidden_size=96, intermediate_size=128, num_attention_heads=12, num_key_value_heads=2,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=16, max_window_layers=1)),
    "qwen2-group7": (Qwen2Config, Qwen2ForCausalLM, dict(
        hidden_size=112, intermediate_size=128, num_attention_heads=14, num_key_value_heads=2,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=16, max_window_layers=1)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        tie_word_embeddings=True, use_sliding_window=False)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(
        hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
        sliding_window=None, tie_word_embeddings=False)),
}


def randomize_norms_and_biases(model: nn.Module, gen: torch.Generator) -> None:
    """RMSNorm weights (all ones at init) and biases (Qwen2's are zero at init) made random, so using them is checked."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))


def family_target(name: str, seed: int = 0) -> nn.Module:
    config_cls, model_cls, shape = FAMILIES[name]
    torch.manual_seed(seed)
    model = model_cls(config_cls(vocab_size=TARGET_ROWS, **COMMON, **shape)).eval()
    randomize_norms_and_biases(model, torch.Generator().manual_seed(seed + 100))
    model.generation_config.eos_token_id = None
    return model


def family_draft(target: nn.Module, noise: float = 0.005, seed: int = 1) -> nn.Module:
    """The target's family and shape with ``DRAFT_ROWS`` head rows: its weights plus noise (module terms: draft)."""
    cfg = copy.deepcopy(target.config)
    cfg.vocab_size = DRAFT_ROWS
    draft = type(target)(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    own = target.state_dict()
    with torch.no_grad():
        for key, p in draft.state_dict().items():
            src = own[key][: p.shape[0]] if own[key].shape != p.shape else own[key]  # the head's rows cut
            p.copy_(src + noise * torch.randn(p.shape, generator=gen))
    draft.generation_config.eos_token_id = None
    return draft


def test_each_case_has_its_preset_s_structure() -> None:
    groups = {}
    for name in FAMILIES:
        model = family_target(name)
        cfg, attn = model.config, model.model.layers[0].self_attn
        groups[name] = cfg.num_attention_heads // cfg.num_key_value_heads
        assert (model.lm_head.weight is model.model.embed_tokens.weight) == cfg.tie_word_embeddings, name
        assert model.lm_head.weight.shape[0] == TARGET_ROWS > VOCAB
        if name.startswith("qwen2"):
            assert attn.q_proj.bias.abs().min() > 0 and cfg.use_sliding_window is False
        if name == "qwen3":
            assert attn.head_dim != cfg.hidden_size // cfg.num_attention_heads
            assert not torch.equal(attn.q_norm.weight, torch.ones_like(attn.q_norm.weight))
        if name == "mistral":
            assert cfg.sliding_window is None
        assert supports(model) is None, name
    assert groups["llama3-tied"] == 4 and groups["qwen2-group6"] == 6 and groups["qwen2-group7"] == 7
    default = LlamaForCausalLM(LlamaConfig(**{**COMMON, **FAMILIES["llama3-tied"][2], "rope_parameters": {
        "rope_type": "default", "rope_theta": ROPE_THETA}}, vocab_size=TARGET_ROWS)).model.rotary_emb
    llama3, yarn = family_target("llama3-tied").model.rotary_emb, family_target("llama-yarn").model.rotary_emb
    assert not torch.allclose(llama3.inv_freq, default.inv_freq)  # the scaling changes the frequencies
    assert yarn.attention_scaling > 1.1  # yarn scales cos and sin: the tables must carry it


@pytest.mark.parametrize("name", list(FAMILIES))
@torch.inference_mode()
def test_the_static_pass_equals_transformers_logits_and_hidden_states(name: str) -> None:
    ref = family_target(name)
    lm = GraphedLM(copy.deepcopy(ref), capture=False)
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    full = ref(ids, output_hidden_states=True)
    cache = lm.new_cache()
    pieces = [lm(ids[:, a:b], past_key_values=cache, output_hidden_states=True)
              for a, b in ((0, 11), (11, 12), (12, 16), (16, 20))]
    logits = torch.cat([p.logits for p in pieces], dim=1)  # (1, 20, TARGET_ROWS)
    assert logits.shape == full.logits.shape
    torch.testing.assert_close(logits, full.logits, atol=1e-4, rtol=1e-4)
    for layer in range(len(full.hidden_states)):
        got = torch.cat([p.hidden_states[layer] for p in pieces], dim=1)  # (1, 20, d)
        torch.testing.assert_close(got, full.hidden_states[layer], atol=1e-4, rtol=1e-4, msg=f"layer {layer}")
    assert (lm.runner.static.layers[0].qkv_bias is not None) == name.startswith("qwen2")
    assert (lm.runner.static.layers[0].q_norm is not None) == (name == "qwen3")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_speculative_output_is_the_target_s_own_within_the_tokenizer(name: str) -> None:
    ref = family_target(name)
    draft = family_draft(ref)
    target, graphed_draft = GraphedLM(copy.deepcopy(ref), capture=False), GraphedLM(draft, capture=False)
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    base = autoregressive(target, ids, temperature=0.0, max_new_tokens=16, vocab_size=VOCAB)
    assert base.token_ids == autoregressive(ref, ids, temperature=0.0, max_new_tokens=16, vocab_size=VOCAB).token_ids
    assert max(base.token_ids) < VOCAB
    accepted = drafted = 0
    for k in (1, 4):
        spec = generate(target, ModelDrafter(graphed_draft, VOCAB), ids, rule=GreedyRule(), temperature=0.0,
                        max_new_tokens=16, k=k, vocab_size=VOCAB)
        assert spec.token_ids == base.token_ids, k
        accepted, drafted = accepted + spec.stats.accepted, drafted + spec.stats.drafted
    assert 0 < accepted < drafted  # drafts both accepted and rejected


def refusal(config: Any, model_cls: Callable[[Any], nn.Module], path: str = "") -> str:
    model = model_cls(config)
    model.config._name_or_path = path
    reason = supports(model)
    assert reason is not None
    return reason


def llama_config(**over: Any) -> LlamaConfig:
    return LlamaConfig(**{**COMMON, **FAMILIES["llama3-untied"][2], "vocab_size": 64, **over})


def test_supports_refuses_ropes_whose_tables_depend_on_the_context_length_naming_the_model() -> None:
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [4.0] * 4,
                "original_max_position_embeddings": 64, "rope_theta": ROPE_THETA}
    reason = refusal(llama_config(rope_parameters=longrope), LlamaForCausalLM, "org/long-llama")
    assert reason.startswith("org/long-llama (llama): ") and "longrope" in reason and "short contexts" in reason
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": ROPE_THETA}
    reason = refusal(llama_config(rope_parameters=dynamic), LlamaForCausalLM)
    assert reason.startswith("LlamaForCausalLM (llama): ") and "change with the context length" in reason
    partial = {"rope_type": "linear", "factor": 2.0, "rope_theta": ROPE_THETA, "partial_rotary_factor": 0.5}
    assert "partial rotary" in refusal(llama_config(rope_parameters=partial), LlamaForCausalLM)


def test_supports_refuses_unknown_families_and_sliding_windows_with_the_reason() -> None:
    gemma = GemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    reason = refusal(gemma, GemmaForCausalLM, "org/gemma-tiny")
    assert reason.startswith("org/gemma-tiny (gemma): ") and "not a family the static pass knows" in reason
    mistral = MistralConfig(**{**COMMON, **FAMILIES["mistral"][2], "vocab_size": 64, "sliding_window": 16})
    assert "sliding-window" in refusal(mistral, MistralForCausalLM)
    qwen2 = Qwen2Config(**{**COMMON, **FAMILIES["qwen2-group6"][2], "vocab_size": 64, "use_sliding_window": True})
    assert "sliding-window" in refusal(qwen2, Qwen2ForCausalLM)


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the unique storages behind ``tensors`` (module terms: one copy)."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


@pytest.mark.parametrize("name", ["qwen2-group6", "llama3-untied"])
def test_building_the_static_pass_leaves_one_copy_of_the_weights_even_with_outside_holders(name: str) -> None:
    model = family_target(name)
    held = list(model.parameters())  # what ZeroGPU's packing keeps: the Parameter objects themselves
    one_copy = sum(p.numel() * p.element_size() for p in held)
    assert storage_bytes(held) == one_copy
    original_q = {id(p): p.untyped_storage().data_ptr() for p in held}
    lm = GraphedLM(model, capture=False)
    with torch.inference_mode():
        lm(torch.tensor([[1, 2, 3]]))  # the first pass builds the static pass
    static = lm.runner.static
    built = [t for layer in static.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    reachable = held + list(model.parameters()) + list(model.buffers()) + built
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert storage_bytes(reachable) == one_copy + buffers
    assert [id(p) for p in model.parameters()] == [id(p) for p in held]  # the same Parameter objects, re-pointed
    attn = model.model.layers[0].self_attn
    fused = static.layers[0].qkv.untyped_storage().data_ptr()
    assert attn.k_proj.weight.untyped_storage().data_ptr() == fused != original_q[id(attn.k_proj.weight)]
    if attn.q_proj.bias is not None:
        assert attn.v_proj.bias.untyped_storage().data_ptr() == static.layers[0].qkv_bias.untyped_storage().data_ptr()
