"""Tree decoding end to end on tiny random Llama pairs."""

from itertools import islice

import pytest
import torch

import ears_core.decode.tree as td
import ears_core.draft.drafters as drafters_mod
import ears_core.draft.eagle as eagle_mod
import ears_core.draft.trees as trees_mod
from conftest import PROMPTS, assert_first_two_tokens_follow, tiny_llama
from ears_core import EARSRule, GreedyRule, StandardRule, generate
from ears_core.draft.drafters import NGramDrafter
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.decode.api import tree_generate, tree_stream


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def head():
    target = tiny_llama(0)
    torch.manual_seed(5)
    return DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).eval()


def off_first_choice(gen):
    """Accepted nodes that were not their parent's first child: the tree, not the chain, found them."""
    return sum(1 for tr in gen.trees for a in tr.path if tr.ranks[a] > 0)


@pytest.mark.parametrize("budget,depth,width", [(4, 2, 2), (8, 4, None), (12, 5, 3)])
def test_greedy_tree_decoding_is_the_targets_own_greedy_output(tiny_pair, budget, depth, width):
    target, draft = tiny_pair
    found = 0
    for prompt in PROMPTS:
        gen = tree_stream(target, draft, prompt, rule=GreedyRule(), budget=budget, depth=depth, width=width,
                          temperature=0, max_new_tokens=40)
        res = gen.result()
        assert res.token_ids == hf_greedy(target, prompt, 40)
        assert sum(s.emitted for s in res.steps) == 40 and len(gen.trees) == len(res.steps)
        assert all(s.drafted <= budget for s in res.steps) and any(s.drafted > depth for s in res.steps)
        found += off_first_choice(gen)
    assert found > 0


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(0.3)], ids=repr)
def test_any_rule_at_temperature_zero_is_greedy_on_a_tree_with_a_head(tiny_pair, head, rule):
    target, _ = tiny_pair
    found = 0
    for prompt in PROMPTS:  # PROMPTS[3] has one token: its first round has nothing to draft from
        gen = tree_stream(target, EagleDrafter(head, target), prompt, rule=rule, budget=8, depth=4, temperature=0,
                          max_new_tokens=30)
        assert gen.result().token_ids == hf_greedy(target, prompt, 30)
        assert all(e.kind != "pardoned" for e in gen.events)  # max P = 1 at T = 0: no tolerance
        found += off_first_choice(gen)
    assert found > 0


def close_events(a, b):
    assert [(e.step, e.position, e.token_id, e.kind, e.rejected_token) for e in a.events] == \
        [(e.step, e.position, e.token_id, e.kind, e.rejected_token) for e in b.events]
    for x, y in zip(a.events, b.events):
        for f in ("p", "q", "ratio", "u", "tolerance", "max_p", "distortion"):
            vx, vy = getattr(x, f), getattr(y, f)
            assert (vx is None) == (vy is None) and (vx is None or vx == pytest.approx(vy, abs=1e-5)), f
    assert [(s.drafted, s.accepted, s.pardoned, s.emitted) for s in a.steps] == \
        [(s.drafted, s.accepted, s.pardoned, s.emitted) for s in b.steps]
    assert [[(d.position, d.token_id, d.kind) for d in s.drafts] for s in a.steps] == \
        [[(d.position, d.token_id, d.kind) for d in s.drafts] for s in b.steps]


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(0.3)], ids=repr)
def test_one_node_per_depth_is_the_chain_decoder_draw_for_draw(tiny_pair, rule):
    target, draft = tiny_pair
    for seed in range(3):
        for prompt in PROMPTS[:3]:
            kw = dict(rule=rule, temperature=0.9, max_new_tokens=30, seed=seed)
            chain = generate(target, draft, prompt, k=4, **kw)
            tree = tree_generate(target, draft, prompt, budget=4, depth=4, width=1, **kw)
            assert tree.token_ids == chain.token_ids
            close_events(tree, chain)


def test_one_node_per_depth_is_the_chain_decoder_with_a_head(tiny_pair, head):
    target, _ = tiny_pair
    kw = dict(rule=EARSRule(0.2), temperature=1.0, max_new_tokens=30, seed=2)
    chain = generate(target, EagleDrafter(head, target), PROMPTS[2], k=3, **kw)
    tree = tree_generate(target, EagleDrafter(head, target), PROMPTS[2], budget=3, depth=3, width=1, **kw)
    assert tree.token_ids == chain.token_ids
    close_events(tree, chain)


def test_seeds_and_beta_zero(tiny_pair):
    target, draft = tiny_pair
    kw = dict(budget=8, depth=3, temperature=0.9, max_new_tokens=40)
    a = tree_generate(target, draft, PROMPTS[0], rule=EARSRule(0.2), seed=5, **kw)
    b = tree_generate(target, draft, PROMPTS[0], rule=EARSRule(0.2), seed=5, **kw)
    c = tree_generate(target, draft, PROMPTS[0], rule=EARSRule(0.2), seed=6, **kw)
    assert a.token_ids == b.token_ids and [e.kind for e in a.events] == [e.kind for e in b.events]
    assert a.token_ids != c.token_ids
    for seed in range(3):
        zero = tree_generate(target, draft, PROMPTS[1], rule=EARSRule(0.0), seed=seed, **kw)
        std = tree_generate(target, draft, PROMPTS[1], rule=StandardRule(), seed=seed, **kw)
        assert zero.token_ids == std.token_ids and [e.kind for e in zero.events] == [e.kind for e in std.events]
        assert std.stats.total_distortion == 0.0 and std.stats.pardoned == 0


def test_a_draft_identical_to_the_target_always_stands(tiny_pair):
    target, _ = tiny_pair
    gen = tree_stream(target, target, PROMPTS[2], rule=StandardRule(), budget=6, depth=3, temperature=0.9,
                      max_new_tokens=41, seed=3)
    res = gen.result()
    assert {e.kind for e in res.events} <= {"accepted", "bonus", "target"}
    assert all(tr.kinds[a] == "accepted" for tr in gen.trees for a in tr.path)
    assert all(tr.ranks[a] == 0 for tr in gen.trees for a in tr.path)  # q = p: the first child stands
    for tr in gen.trees:  # ... down to a leaf, where the bonus token is drawn
        end = tr.path[-1] if tr.path else -1
        assert tr.next_kind in ("bonus", "target") and end not in tr.parents
    assert res.stats.mean_accept_length > 2


def test_eos_and_max_new_tokens_are_exact(tiny_pair):
    target, draft = tiny_pair
    ref = hf_greedy(target, PROMPTS[0], 40)
    eos = ref[17]
    out = tree_generate(target, draft, PROMPTS[0], rule=GreedyRule(), budget=8, depth=4, temperature=0,
                        max_new_tokens=40, eos_token_id=eos)
    assert out.token_ids == ref[: ref.index(eos) + 1] and out.stop == "eos"
    for n in (1, 2, 7):
        out = tree_generate(target, draft, PROMPTS[0], budget=8, depth=4, max_new_tokens=n)
        assert len(out.token_ids) == n and out.stop == "length"


def test_a_size_policy_asked_before_each_draw_keeps_greedy_exact(tiny_pair):
    target, draft = tiny_pair
    gen = tree_stream(target, draft, PROMPTS[2], rule=GreedyRule(), budget=12, depth=5, temperature=0,
                      max_new_tokens=40, keep=lambda priority, nodes, depth: priority >= 0.05)
    assert gen.result().token_ids == hf_greedy(target, PROMPTS[2], 40)
    sizes = [len(tr.tokens) for tr in gen.trees]
    assert all(p >= 0.05 for tr in gen.trees for p in tr.priorities) and min(sizes) < 12 and max(sizes) > 1


def test_unusable_arguments_are_explained(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="propose_tree"):
        tree_stream(target, NGramDrafter(96), PROMPTS[0])
    with pytest.raises(ValueError, match="AcceptanceRule"):
        tree_stream(target, draft, PROMPTS[0], rule="ears")
    with pytest.raises(ValueError, match="budget"):
        tree_stream(target, draft, PROMPTS[0], budget=0)


# ----------------------------------------------------------------------------- caches across rounds


def run_recording(monkeypatch, target, drafter, prompt, **kw):
    """Generate while recording every tree pass and every draft root."""
    passes, roots = [], []
    real_score, real_build = td.score_tree, trees_mod.build_tree

    def score(target_, cache, last, tree, need_hidden=False, layers=(-1,)):
        logits, hidden = real_score(target_, cache, last, tree, need_hidden, layers)
        passes.append((tree, logits[0].clone()))
        return logits, hidden

    def build(root_logits, *args, **kwargs):
        roots.append(root_logits.clone())
        return real_build(root_logits, *args, **kwargs)

    monkeypatch.setattr(td, "score_tree", score)
    for module in (drafters_mod, eagle_mod):  # the drafters' own name for it
        monkeypatch.setattr(module, "build_tree", build)
    gen = tree_stream(target, drafter, prompt, **kw)
    return gen, gen.result(), passes, roots


def path_tokens(tree, node):
    toks = []
    while node >= 0:
        toks.append(int(tree.tokens[node]))
        node = tree.parents[node]
    return toks[::-1]


@pytest.mark.parametrize("use_head", [False, True], ids=["model", "head"])
def test_every_round_scores_what_a_fresh_forward_over_the_committed_sequence_scores(
        tiny_pair, head, monkeypatch, use_head):
    target, draft = tiny_pair
    prompt = PROMPTS[2]
    drafter = EagleDrafter(head, target) if use_head else draft
    gen, res, passes, roots = run_recording(monkeypatch, target, drafter, prompt, rule=EARSRule(0.3), budget=10,
                                            depth=4, temperature=1.0, max_new_tokens=40, seed=1)
    assert len(passes) == len(gen.trees) > 5
    # some rounds kept a path that was not the tree's first nodes: the cache was rearranged
    assert any(tr.path != list(range(len(tr.path))) for tr in gen.trees)
    with torch.no_grad():
        for record, (tree, logits) in zip(gen.trees, passes):
            committed = prompt + res.token_ids[: record.start]
            for entry in range(tree.size + 1):
                seq = committed + (path_tokens(tree, entry - 1) if entry else [])
                fresh = target(torch.tensor([seq])).logits[0, -1]
                assert torch.allclose(logits[entry], fresh, atol=1e-4), (record.step, entry)
        if not use_head:  # the draft model's own cache: its root logits are a fresh forward's
            built = [tr for tr in gen.trees if tr.tokens]  # the last round may have no room to draft
            assert len(roots) == len(built) >= len(gen.trees) - 1
            for record, root in zip(built, roots):
                seq = prompt + res.token_ids[: record.start]
                assert torch.allclose(root, draft(torch.tensor([seq])).logits[0, -1], atol=1e-4)
        else:  # the head's state equals the head run once over the committed sequence
            seq = torch.tensor([prompt + res.token_ids])
            feats = target(seq[:, :-1], output_hidden_states=True).hidden_states[-1]
            full = head(feats, target.get_input_embeddings()(seq[:, 1:]))
            drafter.sync()  # the last round's entries wait for the next draft
            assert drafter._s.cache_len == seq.shape[1] - 1
            assert torch.allclose(drafter._s.next_feat, full[:, -1], atol=1e-4)


def test_distortion_is_reported_exact_or_bounded_per_position(tiny_pair):
    target, draft = tiny_pair
    gen = tree_stream(target, draft, PROMPTS[0], rule=EARSRule(0.3), budget=6, depth=3, width=2, temperature=1.0,
                      max_new_tokens=40, seed=4)
    res = gen.result()
    assert res.stats.pardoned > 0 and res.stats.total_distortion > 0
    assert sum(len(tr.distortion_exact) for tr in gen.trees) == len(res.events)  # one per emitted position
    assert all(all(tr.distortion_exact) for tr in gen.trees)  # width 2 over 96 tokens: enumerable
    assert all(0.0 <= e.distortion <= 1.0 for e in res.events)


# ----------------------------------------------------------------------------- the emitted distribution


@pytest.mark.slow
def test_the_first_tokens_of_tree_decoding_follow_the_target(small_vocab_pair):
    # End to end through the builder, the tree pass and the counter-based draws: the first two
    # tokens of many seeded generations follow P_target (the second given the first).
    target, draft = small_vocab_pair
    # 1,000 generations: resampling from P_target instead of the residual after rejected children reads p 5e-6 here
    prompt, n = [3, 7, 1], 1000
    first, second = [], []
    for seed in range(n):
        gen = tree_stream(target, draft, prompt, rule=StandardRule(), budget=6, depth=2, width=3,
                          temperature=1.0, max_new_tokens=3, seed=seed, with_distortion=False)
        a, b = islice(gen, 2)  # the rounds after the second token cannot change it: they are not run
        first.append(a.token_id)
        second.append(b.token_id)
    assert_first_two_tokens_follow(target, prompt, first, second)


@pytest.mark.parametrize("rule, computed", [(StandardRule(), False), (GreedyRule(), False), (EARSRule(0.0), False),
                                            (EARSRule(0.3), True)])
def test_the_exact_distortion_is_computed_for_lossy_rules_only(tiny_pair, monkeypatch, rule, computed):
    """As in a chain: a lossless rule's distortion is 0 and its (costly) enumeration is skipped."""
    target, draft = tiny_pair
    asked = []

    def spy(real):
        def call(*a, **kw):
            asked.append(kw["with_distortion"])
            return real(*a, **kw)
        return call

    monkeypatch.setattr(td, "verify_tree", spy(td.verify_tree))  # greedy (and off the CPU)
    monkeypatch.setattr(td, "walk_tree", spy(td.walk_tree))  # the other rules on the CPU
    temperature = 0 if isinstance(rule, GreedyRule) else 1.0
    res = tree_stream(target, draft, PROMPTS[0], rule=rule, budget=6, depth=3, temperature=temperature,
                      max_new_tokens=24, seed=2).result()
    assert asked and set(asked) == {computed}
    if not computed:
        assert all(e.distortion == 0.0 for e in res.events)
    else:
        assert any(e.distortion > 0 for e in res.events)
