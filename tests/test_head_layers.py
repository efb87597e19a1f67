"""The draft head's layers run by hand (draft/head_layers.py) against the general forward they stand in for."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from conftest import PROMPTS, tiny_llama
from ears_core import GreedyRule, generate
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.draft.head_layers import HeadLayers, supports
from ears_core.model.passes.kv_cache import KVBuffer
from ears_core.draft.trees import additive_mask, tree_position_ids, tree_visibility


def random_head(layers: int = 2, rope: dict | None = None) -> DraftHead:
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=1, vocab_size=50, rope_parameters=rope)
    torch.manual_seed(3)
    head = DraftHead(head_config_from_target(cfg, layers=layers), torch.arange(50)).eval()
    for p in head.parameters():  # away from the initial near-identity, so every layer matters
        p.data.add_(0.05 * torch.randn_like(p))
    return head


@torch.inference_mode()
def test_pieces_fed_in_turn_equal_the_general_forward_over_the_whole_sequence():
    head = random_head()
    z = torch.randn(1, 19, 64)  # (B, T, d)
    ref = head.body(inputs_embeds=z).last_hidden_state
    layers = HeadLayers(head.body)
    cache = layers.new_cache(1, capacity=4)  # grows twice on the way
    out = torch.cat([layers(z[:, a:b], cache) for a, b in ((0, 7), (7, 8), (8, 19))], dim=1)
    assert cache.length == 19 and cache.capacity == 32
    assert torch.allclose(out, ref, atol=1e-5)
    assert not torch.allclose(out[:, 8:], head.body(inputs_embeds=z[:, 8:]).last_hidden_state, atol=1e-3)  # the cache matters


@torch.inference_mode()
def test_a_tree_pass_equals_the_general_forward_with_its_mask_and_positions():
    head = random_head()
    layers = HeadLayers(head.body)
    prefix = torch.randn(1, 6, 64)
    parents = [-1, -1, 0, 0, 2]  # two roots' children, two grandchildren, one great-grandchild
    depths = [1, 1, 2, 2, 3]
    nodes = torch.randn(1, 5, 64)
    entries = [1, 2, 3, 4, 5]  # tree entries (0 is the root, in the prefix here)
    hf_cache = DynamicCache(config=head.config)
    head.body(inputs_embeds=prefix, past_key_values=hf_cache, use_cache=True)
    mask = additive_mask(tree_visibility(parents, 6, entries, entries), torch.float32)
    pos = tree_position_ids(depths, 5, entries, torch.device("cpu"))
    ref = head.body(inputs_embeds=nodes, past_key_values=hf_cache, use_cache=True, attention_mask=mask,
                    position_ids=pos).last_hidden_state
    cache = layers.new_cache(1)
    layers(prefix, cache)
    out = layers(nodes, cache, pos[0], tree_visibility(parents, 6, entries, entries))
    assert torch.allclose(out, ref, atol=1e-5)
    assert pos[0].tolist() == [6, 6, 7, 7, 8]


def test_the_plain_rope_gives_transformers_own_tables_and_stands_aside_for_a_scaled_one():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from ears_core.model.passes.decoder import plain_rotary, rotation_tables

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 5e4})
    mine, theirs = rotation_tables(plain_rotary(cfg), 16, 300), rotation_tables(LlamaRotaryEmbedding(cfg), 16, 300)
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))  # (P, D) each, the same bits
    assert not torch.equal(mine[0], rotation_tables(plain_rotary(LlamaConfig(hidden_size=64, num_attention_heads=4)),
                                                    16, 300)[0])  # the theta is read
    scaled = LlamaConfig(hidden_size=64, num_attention_heads=4,
                         rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    assert plain_rotary(scaled) is None


@torch.inference_mode()
def test_a_head_loaded_plain_runs_the_bits_of_one_loaded_with_llama_model(tmp_path):
    from ears_core.draft.plain_body import PlainBody

    random_head().save(tmp_path / "head")
    plain, full = DraftHead.load(tmp_path / "head", plain=True), DraftHead.load(tmp_path / "head")
    assert isinstance(plain.body, PlainBody) and type(full.body).__name__ == "LlamaModel"
    assert set(plain.state_dict()) == {k for k in full.state_dict() if not k.startswith("body.embed_tokens")}
    z = torch.randn(1, 9, 64)  # (B, T, d)
    mine, theirs = HeadLayers(plain.body), HeadLayers(full.body)
    assert torch.equal(mine(z, mine.new_cache()), theirs(z, theirs.new_cache()))
    assert EagleDrafter(plain, tiny_llama(0)).by_hand
    with pytest.raises(RuntimeError, match="plain=False"):
        plain.body(inputs_embeds=z)
    random_head(rope={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}).save(tmp_path / "scaled")
    assert type(DraftHead.load(tmp_path / "scaled", plain=True).body).__name__ == "LlamaModel"


@torch.inference_mode()
def test_crop_drops_the_tail_and_new_entries_take_its_place():
    head = random_head(layers=1)
    layers = HeadLayers(head.body)
    z, other = torch.randn(1, 9, 64), torch.randn(1, 3, 64)
    cache = layers.new_cache(1)
    layers(z[:, :6], cache)
    layers(other, cache)  # entries made from predicted features, then dropped
    cache.crop(6)
    again = layers(z[:, 6:], cache)
    assert torch.allclose(again, head.body(inputs_embeds=z).last_hidden_state[:, 6:], atol=1e-5)
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(10)


def test_a_dynamic_rotary_head_keeps_the_general_forward_and_drafts_the_same():
    dynamic = random_head(layers=1, rope={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert not supports(dynamic.body) and supports(random_head(layers=1).body)
    with pytest.raises(ValueError, match="dynamic"):
        HeadLayers(dynamic.body)
    target = tiny_llama(0, vocab=96)
    torch.manual_seed(5)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).eval()
    lean = EagleDrafter(head, target)
    general = EagleDrafter(head, target)
    general.by_hand = False  # the general forward, as for a dynamic rotary head
    runs = [generate(target, d, PROMPTS[2], rule=GreedyRule(), k=3, temperature=0, max_new_tokens=20) for d in (lean, general)]
    assert isinstance(lean._s.cache, KVBuffer) and isinstance(general._s.cache, DynamicCache)
    assert [s.accepted for s in runs[0].steps] == [s.accepted for s in runs[1].steps]
    assert runs[0].token_ids == runs[1].token_ids


def test_a_tree_drafted_through_the_general_forward_equals_the_one_drafted_by_hand():
    from ears_core.draft.trees import TreeDraws, TreeSpec
    from ears_core.sampling import SamplingConfig, logits_to_probs

    target = tiny_llama(0, vocab=96)
    torch.manual_seed(5)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).eval()
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        hidden = target(prompt[:, :-1], output_hidden_states=True).hidden_states[-1]
    trees = []
    for by_hand in (True, False):
        drafter = EagleDrafter(head, target)
        drafter.by_hand = by_hand
        drafter.prefill(prompt, hidden)
        trees.append(drafter.propose_tree(TreeSpec(9, 3, 3), lambda x: logits_to_probs(x[..., :96], SamplingConfig(1.0)),
                                          TreeDraws(2, 0, True)))
    lean, general = trees
    assert not lean.is_chain() and max(lean.depths) == 3
    assert lean.parents == general.parents and torch.equal(lean.tokens, general.tokens)
    assert torch.allclose(lean.draft_probs, general.draft_probs, atol=1e-5)
