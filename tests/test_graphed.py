"""The static pass and the graphed models (model/passes/static_decoder.py, cuda_graphs.py, graphed.py) on the CPU:
everything but the capture itself, which gpu_check runs on CUDA."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from conftest import PROMPTS, perturbed_copy, tiny_llama
from ears_core import GreedyRule, StandardRule, autoregressive, generate, tree_generate
from ears_core.draft.drafters import ModelDrafter
from ears_core.draft.eagle import EagleDrafter
from ears_core.draft.head_layers import HeadLayers
from ears_core.draft.trees import additive_mask, tree_position_ids, tree_visibility
from ears_core.model.cuda.cuda_graphs import GraphBank, bucket, graphs_wanted
from ears_core.draft.head_layers import head_layers
from ears_core.model.cuda.graphed import GraphedHead, GraphedLM, graphed_or_eager
from ears_core.model.passes.kv_cache import keep_tail_positions
from ears_core.model.passes.static_decoder import supports
from ears_core.serve.session import Session
from test_head_layers import random_head


def graphed_pair(seed: int = 0) -> tuple[LlamaForCausalLM, GraphedLM]:
    ref = tiny_llama(seed, vocab=96, layers=3, hidden=32)
    return ref, GraphedLM(copy.deepcopy(ref), capture=False)


@torch.inference_mode()
def test_the_static_pass_equals_transformers_forward_through_prefill_steps_and_hidden_states() -> None:
    ref, lm = graphed_pair()
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(1))
    full = ref(ids, output_hidden_states=True)
    cache = lm.new_cache()
    pieces = [lm(ids[:, a:b], past_key_values=cache, output_hidden_states=True) for a, b in ((0, 11), (11, 12), (12, 16), (16, 20))]
    logits = torch.cat([p.logits for p in pieces], dim=1)
    assert torch.allclose(logits, full.logits, atol=1e-4)
    for layer in range(len(full.hidden_states)):
        got = torch.cat([p.hidden_states[layer] for p in pieces], dim=1)
        assert torch.allclose(got, full.hidden_states[layer], atol=1e-4), layer
    assert cache.get_seq_length() == 20
    kept = lm(ids[:, :3], past_key_values=lm.new_cache(), logits_to_keep=1).logits
    assert kept.shape == (1, 1, 96) and torch.allclose(kept[0, 0], full.logits[0, 2], atol=1e-4)
    alone = lm(ids[:, 16:], past_key_values=lm.new_cache()).logits  # without the cache: other logits
    assert not torch.allclose(alone, full.logits[:, 16:], atol=1e-2)


@torch.inference_mode()
def test_a_tree_pass_takes_the_tree_s_mask_and_positions_as_transformers_does() -> None:
    ref, lm = graphed_pair(2)
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    nodes = torch.tensor([[5, 9, 11, 40, 7]])
    parents, depths, entries = [-1, -1, 0, 0, 2], [1, 1, 2, 2, 3], [1, 2, 3, 4, 5]
    mask = additive_mask(tree_visibility(parents, 6, entries, entries), torch.float32)
    pos = tree_position_ids(depths, 5, entries, torch.device("cpu"))
    hf = DynamicCache(config=ref.config)
    ref(ids, past_key_values=hf, use_cache=True)
    want = ref(nodes, past_key_values=hf, use_cache=True, attention_mask=mask, position_ids=pos).logits
    cache = lm.new_cache()
    lm(ids, past_key_values=cache)
    got = lm(nodes, past_key_values=cache, attention_mask=mask, position_ids=pos).logits
    assert torch.allclose(got, want, atol=1e-4)
    keep = torch.tensor([6, 8, 10])  # a path: node 0, its child 2, grandchild 4
    keep_tail_positions(hf, 6, keep)
    keep_tail_positions(cache, 6, keep)
    nxt = torch.tensor([[3]])
    assert torch.allclose(lm(nxt, past_key_values=cache).logits, ref(nxt, past_key_values=hf, use_cache=True).logits,
                          atol=1e-4)


@torch.inference_mode()
def test_two_caches_share_the_static_buffer_and_each_keeps_its_own_slots() -> None:
    ref, lm = graphed_pair(4)
    a_ids, b_ids = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[60, 61, 62]])
    a, b = lm.new_cache(), lm.new_cache()
    lm(a_ids, past_key_values=a)
    lm(b_ids, past_key_values=b)  # b takes the buffer: a's slots are set aside
    a_copy = copy.deepcopy(a)
    got_a = lm(torch.tensor([[7]]), past_key_values=a).logits
    got_b = lm(torch.tensor([[7]]), past_key_values=b).logits
    want_a = ref(torch.tensor([[1, 2, 3, 4, 5, 7]])).logits[:, -1:]
    want_b = ref(torch.tensor([[60, 61, 62, 7]])).logits[:, -1:]
    assert torch.allclose(got_a, want_a, atol=1e-4) and torch.allclose(got_b, want_b, atol=1e-4)
    assert torch.allclose(lm(torch.tensor([[7]]), past_key_values=a_copy).logits, want_a, atol=1e-4)
    a.crop(-2)
    assert a.get_seq_length() == 4
    with pytest.raises(ValueError, match="cannot crop"):
        a.crop(-9)
    with pytest.raises(TypeError, match="new_cache"):
        lm(a_ids, past_key_values=DynamicCache(config=ref.config))


@torch.inference_mode()
def test_the_static_buffer_grows_past_its_capacity_and_drops_its_graphs(monkeypatch) -> None:
    import ears_core.model.cuda.graphed as graphed

    monkeypatch.setattr(graphed, "CAPACITY", 8)
    ref = tiny_llama(5, vocab=96, layers=2, hidden=32)
    lm = GraphedLM(copy.deepcopy(ref), capture=False)
    lm.runner.bank.graphs["stale"] = (None, None)
    ids = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(2))
    cache = lm.new_cache()
    out = torch.cat([lm(ids[:, i: i + 3], past_key_values=cache).logits for i in range(0, 30, 3)], dim=1)
    assert lm.runner.kv.capacity == 32 and not lm.runner.bank.graphs
    assert torch.allclose(out, ref(ids).logits, atol=1e-4)
    with pytest.raises(ValueError, match="past the model's 256 positions"):
        lm(torch.zeros(1, 240, dtype=torch.long), past_key_values=cache)


def test_buckets_are_powers_of_two_from_256_up_to_the_capacity() -> None:
    assert [bucket(n, 4096) for n in (1, 256, 257, 1000, 5000)] == [256, 256, 512, 1024, 4096]


def test_graphs_are_wanted_on_cuda_only_and_the_switch_names_its_values(monkeypatch) -> None:
    assert not graphs_wanted(torch.device("cpu"))
    assert graphs_wanted(torch.device("cuda"))
    monkeypatch.setenv("EARS_CUDA_GRAPHS", "0")
    assert not graphs_wanted(torch.device("cuda"))
    monkeypatch.setenv("EARS_CUDA_GRAPHS", "maybe")
    with pytest.raises(ValueError, match="EARS_CUDA_GRAPHS"):
        graphs_wanted(torch.device("cuda"))


def test_a_bank_off_cuda_calls_through_and_captures_nothing() -> None:
    bank = GraphBank(torch.device("cpu"), capture=True)
    calls = []
    assert bank.run((1, 256), lambda: calls.append(1) or 5) == 5
    assert calls == [1] and not bank.graphs and not bank.capture


def test_under_the_sync_debug_mode_a_new_key_runs_eagerly_and_is_captured_after(monkeypatch) -> None:
    bank = GraphBank(torch.device("cpu"), capture=True)
    bank.capture = True  # as on CUDA; here a capture itself fails (no CUDA)
    mode = [1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode[0])
    assert bank.run((1, 256), lambda: 5) == 5  # gpu_check's waits: no capture, which would synchronize
    assert bank.capture and bank.failed is None and not bank.graphs
    mode[0] = 0
    assert bank.run((1, 256), lambda: 6) == 6  # outside it the capture is tried (and fails here: eager after)
    assert not bank.capture and bank.failed.startswith("capture failed: ")


def test_models_the_static_pass_cannot_run_are_named_with_the_reason() -> None:
    assert supports(tiny_llama(0)) is None
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, hidden_act="gelu")
    assert "activation" in supports(LlamaForCausalLM(cfg))
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                                     "rope_theta": 10000.0})
    assert "rotary" in supports(LlamaForCausalLM(cfg))
    from transformers import GPT2Config, GPT2LMHeadModel
    assert "not a transformers causal LM" in supports(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2)))
    model = tiny_llama(0)
    assert graphed_or_eager(model) is model  # the CPU keeps transformers' forward


@torch.inference_mode()
def test_fused_weights_are_views_so_the_wrapped_model_computes_the_same() -> None:
    ref, lm = graphed_pair(6)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    lm(ids)  # the first pass builds the static pass, fusing the weights
    assert torch.allclose(lm.model(ids).logits, ref(ids).logits, atol=1e-6)
    attn = lm.model.model.layers[0].self_attn
    assert attn.k_proj.weight.untyped_storage().data_ptr() == attn.q_proj.weight.untyped_storage().data_ptr()


def test_greedy_speculative_output_on_graphed_models_is_the_target_s_own() -> None:
    ref = tiny_llama(0, vocab=96, layers=2, hidden=32)
    draft = perturbed_copy(ref, 0.03, 1)
    target = GraphedLM(copy.deepcopy(ref), capture=False)
    graphed_draft = GraphedLM(draft, capture=False)
    for prompt in ([1, 5, 7, 9], [3, 17, 17, 60, 2, 88, 11, 4, 30, 3, 5, 8, 13, 21, 34, 55, 89, 1, 2, 3]):
        ids = torch.tensor([prompt])
        base = autoregressive(target, ids, temperature=0.0, max_new_tokens=24)
        assert base.token_ids == autoregressive(ref, ids, temperature=0.0, max_new_tokens=24).token_ids
        for k in (1, 4, 8):
            spec = generate(target, ModelDrafter(graphed_draft, 96), ids, rule=GreedyRule(), temperature=0.0,
                            max_new_tokens=24, k=k)
            assert spec.token_ids == base.token_ids, (prompt, k)
            assert spec.stats.accepted > 0
        tree = tree_generate(target, ModelDrafter(graphed_draft, 96), ids, rule=GreedyRule(), temperature=0.0,
                             max_new_tokens=24, budget=6, depth=3)
        assert tree.token_ids == base.token_ids


@torch.inference_mode()
def test_a_graphed_head_equals_the_head_layers_in_a_chain_and_in_a_tree() -> None:
    head = random_head()
    by_hand = HeadLayers(copy.deepcopy(head).body)
    graphed = GraphedHead(head.body, capture=False)
    z = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(2))
    c1, c2 = by_hand.new_cache(1), graphed.new_cache(1)
    for a, b in ((0, 6), (6, 7), (7, 9)):
        assert torch.allclose(graphed(z[:, a:b], c2), by_hand(z[:, a:b], c1), atol=1e-5)
    parents, depths, entries = [-1, -1, 0], [1, 1, 2], [1, 2, 3]
    mask, pos = tree_visibility(parents, 9, entries, entries), tree_position_ids(depths, 8, entries, torch.device("cpu"))[0]
    assert torch.allclose(graphed(z[:, 9:], c2, pos, mask), by_hand(z[:, 9:], c1, pos, mask), atol=1e-5)
    c1.crop(7)
    c2.crop(7)
    assert torch.allclose(graphed(z[:, 9:10], c2), by_hand(z[:, 9:10], c1), atol=1e-5)
    with pytest.raises(ValueError, match="cannot crop"):
        c2.crop(99)


def test_an_eagle_drafter_on_a_graphed_target_and_head_drafts_as_by_hand(monkeypatch) -> None:
    import ears_core.model.cuda.cuda_graphs as cuda_graphs
    from ears_core.draft.eagle import DraftHead, head_config_from_target

    head = random_head()
    assert isinstance(head_layers(head, True), HeadLayers)  # off CUDA: by hand
    monkeypatch.setattr(cuda_graphs, "graphs_wanted", lambda device: True)  # as on CUDA (the bank still calls through)
    assert isinstance(head_layers(head, True), GraphedHead) and head_layers(head, True) is head_layers(head, True)
    assert isinstance(head_layers(head, False), HeadLayers)
    ref = tiny_llama(0, vocab=96)
    torch.manual_seed(5)
    head = DraftHead(head_config_from_target(ref.config), torch.arange(0, 96, 2)).eval()
    target = GraphedLM(copy.deepcopy(ref), capture=False)
    for rule, temperature in ((GreedyRule(), 0.0), (StandardRule(), 0.9)):
        runs = []
        for tgt, graphs in ((ref, False), (target, True)):
            drafter = EagleDrafter(copy.deepcopy(head), tgt)
            drafter.cuda_graphs = graphs
            runs.append(generate(tgt, drafter, PROMPTS[2], rule=rule, k=3, temperature=temperature,
                                 max_new_tokens=20, seed=4))
            assert isinstance(drafter._layers, GraphedHead if graphs else HeadLayers)
            assert (drafter._steps is not None) == graphs  # the chain's draft steps through step_graphs.py
        assert runs[0].token_ids == runs[1].token_ids
        assert [s.accepted for s in runs[0].steps] == [s.accepted for s in runs[1].steps]
        drafted = [[(d.token_id, round(d.q, 4)) for s in run.steps for d in s.drafts] for run in runs]
        assert drafted[0] and drafted[0] == drafted[1]  # the same drafts with the same draft probabilities


def test_auto_never_picks_a_tree_on_cuda() -> None:
    flat = SimpleNamespace(steps=lambda m: 1.0)  # a flat price curve: a tree would be picked on the CPU
    on = lambda dev: Session.wide_passes_are_cheap(SimpleNamespace(pair=SimpleNamespace(device=torch.device(dev)),  # noqa: E731
                                                                  prices=flat))
    assert on("cpu") and not on("cuda")


def test_the_gpu_check_s_eager_twin_shares_weights_and_decodes_the_same_tokens(monkeypatch) -> None:
    from ears_core.gpu_check import captured
    from ears_core.pair import ModelPair

    ref = tiny_llama(0, vocab=96, layers=2, hidden=32)
    draft = perturbed_copy(ref, 0.03, 1)
    pair = ModelPair(GraphedLM(ref, capture=False), GraphedLM(draft, capture=False), None, torch.device("cpu"),
                     torch.float32, "tiny", 96, "tiny")
    twin = captured.eager_twin(pair)
    assert twin.target is ref and twin.draft is draft and twin.name == "tiny (eager)"
    assert captured.graphed_parts(pair) == [pair.target, pair.draft] and not captured.graphed_parts(twin)
    assert captured.prepare(pair, torch.tensor([[1, 2, 3]])) == 0.0  # nothing is captured off CUDA
    prompts = [torch.tensor([[1, 5, 7, 9]]), torch.tensor([[3, 17, 60]])]
    check = captured.same_tokens(pair, twin, prompts, 16)
    assert check.status == "pass" and check.figures["same"] == 2
    monkeypatch.setattr(captured, "autoregressive", lambda model, ids, **kw: SimpleNamespace(
        token_ids=[1, 2, 3] if model is ref else [1, 2, 4]))  # a parting where the target's top two are far apart
    monkeypatch.setattr(captured, "parting", lambda *a: (2, 5.0, 0.01))
    assert captured.same_tokens(pair, twin, prompts[:1], 3).status == "fail"


def test_a_graphed_model_runs_under_no_grad_after_inference_mode_made_its_buffers() -> None:
    ref, lm = graphed_pair(8)
    ids = torch.tensor([[2, 4, 6]])
    with torch.inference_mode():
        lm(ids, past_key_values=lm.new_cache())
    with torch.no_grad():
        out = lm(ids).logits
    assert torch.allclose(out, ref(ids).logits, atol=1e-4)


@torch.inference_mode()
def test_a_capture_that_fails_runs_the_pass_eagerly_and_says_why() -> None:
    ref, lm = graphed_pair(9)
    assert lm._runner is None  # nothing is built until the first pass (model/cuda/graphed.py: lazy)
    lm.runner.bank.capture = True  # as on CUDA; here the capture itself fails (no CUDA)
    ids = torch.tensor([[5, 6, 7, 8]])
    cache = lm.new_cache()
    out = torch.cat([lm(ids[:, :2], past_key_values=cache).logits, lm(ids[:, 2:], past_key_values=cache).logits], 1)
    assert torch.allclose(out, ref(ids).logits, atol=1e-4)
    assert lm.capture_failed.startswith("capture failed: ") and not lm.runner.bank.capture
    lm.ears_kernels = "cuda-graphs"
    from ears_core.model.loading.hub import describe_device
    assert "eager: capture failed" in describe_device(lm)


@pytest.mark.parametrize("rule,temperature", [(GreedyRule(), 0.0), (StandardRule(), 0.9)])
def test_a_graphed_draft_model_s_captured_step_drafts_as_transformers_forward(rule, temperature) -> None:
    ref = tiny_llama(0, vocab=96, layers=2, hidden=32)
    draft = perturbed_copy(ref, 0.05, 2)
    graphed = GraphedLM(copy.deepcopy(draft), capture=False)
    runs = []
    for d in (draft, graphed):
        drafter = ModelDrafter(d, 96)
        runs.append(generate(ref, drafter, torch.tensor([[3, 17, 60, 2]]), rule=rule, k=4, temperature=temperature,
                             max_new_tokens=24, seed=3))
        assert (drafter._steps is not None) == (d is graphed)
    drafted = [[(x.token_id, round(x.q, 4)) for s in run.steps for x in s.drafts] for run in runs]
    assert drafted[0] and drafted[0] == drafted[1] and runs[0].token_ids == runs[1].token_ids


def test_decodes_in_two_threads_take_turns_on_the_shared_buffer() -> None:
    import threading

    ref, lm = graphed_pair(10)
    prompts = [torch.tensor([[1, 2, 3, 4, 5, 6]]), torch.tensor([[90, 80, 70]])]
    alone = [autoregressive(lm, ids, temperature=0.0, max_new_tokens=40).token_ids for ids in prompts]
    assert alone == [autoregressive(ref, ids, temperature=0.0, max_new_tokens=40).token_ids for ids in prompts]
    got: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(
        i, autoregressive(lm, prompts[i], temperature=0.0, max_new_tokens=40).token_ids)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[0], got[1]] == alone


def test_the_bench_runs_transformers_assisted_generation_on_the_models_under_graphed_ones() -> None:
    from ears_core.bench import Bench, _transformers_model
    from ears_core.pair import ModelPair

    ref = tiny_llama(0, vocab=96, layers=2, hidden=32)
    draft = perturbed_copy(ref, 0.03, 1)
    target = GraphedLM(ref, capture=False)
    assert _transformers_model(target) is ref and _transformers_model(draft) is draft
    pair = ModelPair(target, GraphedLM(draft, capture=False), None, torch.device("cpu"), torch.float32, "t", 96, "d")
    bench = Bench(target, None, 96, pair, "d")
    assert bench.assisted_label.startswith("transformers assisted generation")
