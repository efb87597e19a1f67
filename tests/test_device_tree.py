"""The device tree round (decode/device_tree.py, device_walk.py, draft/fixed_trees.py): today's tree decisions,
draw for draw, with one host read a round."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import PROMPTS, perturbed_copy, tiny_llama
from ears_core import EARSRule, EntropyEARSRule, GreedyRule, StandardRule, TypicalRule
from ears_core.decode.api import tree_generate, tree_stream
from ears_core.decode.device_walk import device_walk
from ears_core.decode.tree_walk import walk_tree
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.draft.fixed_trees import FixedTreeSpec, build_fixed_tree, widths_for
from ears_core.draft.trees import TreeDraws, TreeSpec, build_tree
from ears_core.rules import RULES, BudgetEARSRule, FLyRule, make_rule
from ears_core.sampling import SamplingConfig, logits_to_probs
from test_device_round import RULE_PARAMS, head_pair, hf_greedy, reads_per_round  # noqa: F401 (a fixture)
from test_tree_verify import markov, sample_trees
from test_tree_walk import SHAPES, random_trees

WALK_RULES = [StandardRule(), EARSRule(0.3), EntropyEARSRule(0.2), TypicalRule(), GreedyRule(), FLyRule(gate=0.0, window=1),
              BudgetEARSRule(0.05)]
FULL = [(6, 2, 2), (14, 3, 2), (3, 1, 3), (4, 4, 1)]  # budget, depth, width: full trees, so today's tree is the same


def fields_equal(a, b, fields):
    for field in fields:
        assert torch.equal(getattr(a, field), getattr(b, field)), field


VERDICT = ("num_accepted", "path", "next_token", "is_bonus", "last_rejected", "kinds", "p", "q", "ratio", "u", "tolerance",
           "max_p", "next_p", "next_q")


@pytest.mark.parametrize("parents", SHAPES, ids=str)
@pytest.mark.parametrize("rule", WALK_RULES, ids=repr)
@pytest.mark.parametrize("siblings", ["sampled", "fixed"])
def test_the_device_walk_is_todays_walk_field_by_field(parents, rule, siblings):
    tokens, target, draft, u, su = random_trees(parents, siblings, isinstance(rule, GreedyRule))
    ref = walk_tree(target, draft, tokens, parents, rule.fresh() if hasattr(rule, "fresh") else rule, uniforms=u,
                    sample_uniforms=su, siblings=siblings)
    got = device_walk(target, draft, tokens, parents, rule.fresh() if hasattr(rule, "fresh") else rule, uniforms=u,
                      sample_uniforms=su, siblings=siblings)
    fields_equal(ref, got, VERDICT)
    if len(parents) > 1 and not isinstance(rule, TypicalRule):  # power: routes of several lengths, rejections
        assert len(set(got.num_accepted.tolist())) >= 2 and not bool(got.is_bonus.all())


def test_the_device_walk_computes_todays_distortion_when_asked():
    parents = SHAPES[0]
    tokens, target, draft, u, su = random_trees(parents, "sampled", False)
    kw = dict(uniforms=u, sample_uniforms=su, with_distortion=True, siblings="sampled")
    ref, got = walk_tree(target, draft, tokens, parents, EARSRule(0.3), **kw), \
        device_walk(target, draft, tokens, parents, EARSRule(0.3), **kw)
    fields_equal(ref, got, VERDICT + ("distortion", "distortion_exact"))


@pytest.mark.parametrize("rule", WALK_RULES[:5], ids=repr)
def test_a_node_that_is_not_alive_is_as_if_it_were_not_in_the_tree(rule):
    """Nodes 2 (a root's third child) and 5 (a second grandchild) dead, and node 6 under the dead 2: the walk is
    today's on the tree without them (renumbered)."""
    parents, dead = [-1, -1, -1, 0, 0, 1, 2], [2, 5, 6]
    kept = [i for i in range(len(parents)) if i not in dead]
    new = {old: j for j, old in enumerate(kept)}
    small = [new.get(parents[i], -1) for i in kept]  # [-1, -1, 0, 0]
    tokens, target, draft, u, su = random_trees(parents, "sampled", isinstance(rule, GreedyRule))
    alive = torch.tensor([i not in dead for i in range(len(parents))])
    lossy = dict(with_distortion=not rule.lossless)
    got = device_walk(target, draft, tokens, parents, rule, uniforms=u, sample_uniforms=su, alive=alive, **lossy)
    entries = [0] + [i + 1 for i in kept]
    ref = walk_tree(target[:, entries], draft[:, kept], tokens[:, kept], small, rule, uniforms=u[:, kept],
                    sample_uniforms=su, **lossy)
    if not rule.lossless:  # the distortion over the children today's tree drew
        assert torch.equal(ref.distortion, got.distortion[:, :3]) and torch.equal(ref.distortion_exact, got.distortion_exact[:, :3])
    back = torch.tensor(kept + [-1])  # the small tree's node -> the full tree's (-1 stays -1)
    assert torch.equal(back[ref.path], got.path[:, : ref.path.shape[1]]) and bool((got.path[:, 2:] == -1).all())
    assert torch.equal(back[ref.last_rejected], got.last_rejected)
    fields_equal(ref, got, ("num_accepted", "next_token", "is_bonus", "next_p", "next_q"))
    assert torch.equal(got.kinds[:, kept], ref.kinds) and bool((got.kinds[:, dead] == 3).all())
    assert torch.equal(got.ratio[:, kept], ref.ratio)


def test_the_widths_of_a_spec():
    assert widths_for(TreeSpec(6, 2, 2)) == (2, 2) and widths_for(TreeSpec(14, 3, 2)) == (2, 2, 2)
    assert widths_for(TreeSpec(8, 4, 2)) == (2, 1, 1, 1) and widths_for(TreeSpec(8, 4, None)) == (2, 1, 1, 1)
    assert widths_for(TreeSpec(4, 4, 1)) == (1, 1, 1, 1) and widths_for(TreeSpec(3, 8, None)) == (1, 1, 1)
    assert widths_for(TreeSpec(5, 1, None)) == (5,) and widths_for(TreeSpec(8, 0)) == ()
    spec = FixedTreeSpec.of(TreeSpec(14, 3, 2))
    parents, depths, ranks = spec.structure()
    assert spec.size == len(parents) == 14 and parents[:6] == [-1, -1, 0, 0, 1, 1] and parents[6:8] == [2, 2]
    assert depths == [1] * 2 + [2] * 4 + [3] * 8 and ranks == [0, 1] * 7


def by_ranks(tree, i):
    return tuple(tree.path_ranks(i))


@pytest.mark.parametrize("budget,depth,width", FULL[:3])
@pytest.mark.parametrize("greedy,top_k", [(False, None), (False, 1), (False, 3), (True, None)])
def test_the_fixed_builder_draws_the_nodes_build_tree_draws(budget, depth, width, greedy, top_k):
    """With a draft whose logits after a node depend on its token only (no batch effects), the fixed tree holds
    today's best-first tree's nodes: the same tokens, distributions, scores and priorities per path of ranks; with
    top-k 1 a sampled node of rank 1 is not alive (its parent has no token left), as today's is not drawn."""
    v = 12
    g = torch.Generator().manual_seed(budget + depth)
    table = 2.0 * torch.randn(v, v, generator=g)  # (V, V): the logits after a token
    cfg = SamplingConfig(0.0 if greedy else 0.9, top_k=top_k)
    probs_fn = lambda x: logits_to_probs(x, cfg)  # noqa: E731
    rank_fn = lambda x: torch.softmax(x.float(), -1)  # noqa: E731  (T = 1)
    expand = lambda ids, tree: table[tree.tokens[ids]]  # noqa: E731
    spec = TreeSpec(budget, depth, width)
    seen = Counter()
    for seed in range(6):
        draws = TreeDraws(seed, 7, spec.branching)
        root = table[seed % v]
        today = build_tree(root, expand, spec, probs_fn, draws, greedy=greedy, rank_fn=rank_fn)
        fixed = build_fixed_tree(root, expand, FixedTreeSpec.of(spec), probs_fn, draws, greedy=greedy, rank_fn=rank_fn)
        alive = [i for i in range(fixed.size) if bool(fixed.alive[i])]
        assert sorted(by_ranks(today, i) for i in range(today.size)) == sorted(by_ranks(fixed, i) for i in alive)
        at = {by_ranks(fixed, i): i for i in alive}
        for i in range(today.size):
            j = at[by_ranks(today, i)]
            assert int(today.tokens[i]) == int(fixed.tokens[j])
            assert torch.equal(today.draft_probs[i], fixed.draft_probs[j])
            assert today.scores[i] == float(fixed.score_t[j]) and today.priorities[i] == float(fixed.priority_t[j])
        seen.update(["dead"] * (fixed.size - len(alive)))
    assert seen["dead"] > 0 or top_k != 1  # nodes that are not alive were met


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0)
    return target, perturbed_copy(target, 0.03, seed=1)


def same_decisions(a, b, exact: bool):
    """Tokens, kinds and rounds equal; every event field too where ``exact``, else close (a branching tree's draft
    passes group other nodes than today's best-first expansion, which moves the draft's floats in the last bits)."""
    assert a.token_ids == b.token_ids
    assert [e.kind for e in a.events] == [e.kind for e in b.events]
    assert [(s.drafted, s.accepted, s.pardoned, s.emitted) for s in a.steps] == \
        [(s.drafted, s.accepted, s.pardoned, s.emitted) for s in b.steps]
    assert [[(d.position, d.token_id, d.kind) for d in s.drafts] for s in a.steps] == \
        [[(d.position, d.token_id, d.kind) for d in s.drafts] for s in b.steps]
    if exact:
        assert [e.to_dict() for e in a.events] == [e.to_dict() for e in b.events]
        return
    for x, y in zip(a.events, b.events):
        for f in ("p", "q", "ratio", "u", "tolerance", "max_p", "distortion"):
            fx, fy = getattr(x, f), getattr(y, f)
            assert (fx is None) == (fy is None) and (fx is None or fx == pytest.approx(fy, rel=1e-4, abs=1e-6)), f


@pytest.mark.parametrize("temperature", [0.9, 0])
@pytest.mark.parametrize("name", list(RULES))
def test_the_device_tree_decides_as_todays_tree_round_for_every_rule(pair, name, temperature):
    target, draft = pair
    kinds: Counter = Counter()
    for budget, depth, width in FULL:
        # each prompt its own seed; at T = 0 every rule decides on one-hot laws, the same decisions for any seed:
        # one prompt there checks each rule's device code on them (log 0, 0 / 0) through every tree shape
        for seed, prompt in enumerate(PROMPTS[:2] if temperature else PROMPTS[:1]):
            kw = dict(budget=budget, depth=depth, width=width, temperature=temperature, max_new_tokens=24, seed=seed)
            today = tree_generate(target, draft, prompt, rule=make_rule(name, **RULE_PARAMS), **kw)
            device = tree_generate(target, draft, prompt, rule=make_rule(name, **RULE_PARAMS), device_round=True, **kw)
            same_decisions(today, device, exact=temperature == 0 or depth == 1 or width == 1)
            kinds.update(e.kind for e in device.events)
    assert kinds["accepted"] > 0 and kinds["resampled"] > 0 and kinds["bonus"] > 0
    # FLy pardons by looking ahead along a chain: a tree tests one node at a time, so it never pardons there
    if temperature and name not in ("standard", "greedy", "fly"):
        assert kinds["pardoned"] > 0, kinds  # the rule's own decisions were exercised


@pytest.mark.parametrize("budget,depth,width", [(6, 2, 2), (8, 4, None), (12, 5, 3)])
def test_greedy_on_the_device_tree_is_the_targets_own_greedy_decoding(pair, head_pair, budget, depth, width):
    target, draft = pair
    kw = dict(budget=budget, depth=depth, width=width, temperature=0, max_new_tokens=30, device_round=True)
    for prompt in PROMPTS:
        out = tree_generate(target, draft, prompt, rule=GreedyRule(), **kw)
        assert out.token_ids == hf_greedy(target, prompt, 30)
        assert 0 < out.stats.accepted < out.stats.drafted
    target, head = head_pair
    out = tree_generate(target, EagleDrafter(head, target), PROMPTS[2], rule=GreedyRule(), **kw)
    assert out.token_ids == hf_greedy(target, PROMPTS[2], 30)


def test_an_eagle_head_decides_as_today(head_pair):
    target, head = head_pair
    for rule, temperature in (("ears", 0.9), ("greedy", 0)):
        kw = dict(budget=6, depth=2, width=2, temperature=temperature, max_new_tokens=30, seed=2)
        same_decisions(tree_generate(target, EagleDrafter(head, target), PROMPTS[2], rule=make_rule(rule, beta=0.3), **kw),
                       tree_generate(target, EagleDrafter(head, target), PROMPTS[2], rule=make_rule(rule, beta=0.3),
                                     device_round=True, **kw), exact=temperature == 0)


@pytest.mark.parametrize("rule,temperature,extra", [("standard", 0.9, {}), ("greedy", 0, {}),
                                                    ("ears", 0.9, {"with_distortion": False})])
def test_the_device_tree_reads_the_host_once_a_round(pair, head_pair, rule, temperature, extra):
    target, draft = pair
    kw = dict(rule=make_rule(rule, beta=0.2), budget=8, depth=4, width=2, temperature=temperature, max_new_tokens=40,
              seed=1, **extra)
    device, rounds = reads_per_round(lambda: tree_generate(target, draft, PROMPTS[0], device_round=True, **kw))
    assert device == rounds  # exactly the packed read, every round
    today, rounds_today = reads_per_round(lambda: tree_generate(target, draft, PROMPTS[0], **kw))
    assert today > 5 * rounds_today  # today's tree: the drafter's best-first choices, the walk, the records
    target, head = head_pair
    drafter = EagleDrafter(head, target)  # built outside the count: its construction reads its vocabulary once
    device, rounds = reads_per_round(lambda: tree_generate(target, drafter, PROMPTS[2], device_round=True, **kw))
    assert device == rounds


def test_a_lossy_rules_distortion_is_todays(pair):
    target, draft = pair
    kw = dict(rule=make_rule("ears", beta=0.4), budget=6, depth=2, width=2, temperature=0.9, max_new_tokens=30, seed=3)
    today, device = tree_stream(target, draft, PROMPTS[1], **kw), tree_stream(target, draft, PROMPTS[1], device_round=True, **kw)
    same_decisions(today.result(), device.result(), exact=False)
    assert [t.distortion_exact for t in today.trees] == [t.distortion_exact for t in device.trees]
    assert any(e.distortion > 0 for e in device.result().events)


def test_the_rounds_trees_are_todays_nodes(pair):
    """The TreeRecords hold today's nodes (by path of ranks: token, kind, score, priority) and path."""
    target, draft = pair
    kw = dict(rule=StandardRule(), budget=14, depth=3, width=2, temperature=0, max_new_tokens=30, seed=0)
    today, device = tree_stream(target, draft, PROMPTS[2], **kw), tree_stream(target, draft, PROMPTS[2], device_round=True, **kw)
    today.result(), device.result()

    def nodes(t):
        ranks = lambda i: () if i < 0 else ranks(t.parents[i]) + (t.ranks[i],)  # noqa: E731
        return sorted((ranks(i), t.tokens[i], t.kinds[i], t.scores[i], t.priorities[i]) for i in range(len(t.tokens))), \
            [ranks(a) for a in t.path], t.next_token, t.next_kind
    assert len(today.trees) == len(device.trees) > 3
    for a, b in zip(today.trees, device.trees):
        assert nodes(a)[1:] == nodes(b)[1:]
        for x, y in zip(nodes(a)[0], nodes(b)[0]):
            assert x[:3] == y[:3] and x[3:] == pytest.approx(y[3:], rel=1e-5)


@pytest.mark.parametrize("n", [1, 2, 6, 13])
def test_max_new_tokens_is_exact_on_the_device_tree(pair, n):
    target, draft = pair
    out = tree_generate(target, draft, PROMPTS[0], rule=make_rule("ears", beta=0.2), budget=8, depth=4, temperature=0.9,
                        max_new_tokens=n, seed=n, device_round=True)
    assert len(out.token_ids) == n


def test_the_budget_rule_on_a_branching_tree_and_a_size_policy_run_todays_tree_round():
    from ears_core.decode.device_tree import DeviceTreeShape
    budget = BudgetEARSRule(0.05)
    assert DeviceTreeShape.takes(budget, TreeSpec(4, 4, 1)) and DeviceTreeShape.takes(budget, TreeSpec(3, 1, 3))
    assert not DeviceTreeShape.takes(budget, TreeSpec(6, 2, 2)) and DeviceTreeShape.takes(EARSRule(), TreeSpec(6, 2, 2))
    assert not DeviceTreeShape.takes(EARSRule(), TreeSpec(6, 2, 2), keep=lambda *a: True)


def test_with_a_size_policy_the_tree_round_is_todays(pair):
    target, draft = pair
    keep = lambda priority, nodes, depth: nodes < 3  # noqa: E731
    kw = dict(rule=GreedyRule(), budget=8, depth=4, temperature=0, max_new_tokens=20, keep=keep)
    a, b = tree_generate(target, draft, PROMPTS[0], **kw), tree_generate(target, draft, PROMPTS[0], device_round=True, **kw)
    assert a.token_ids == b.token_ids and [s.drafted for s in a.steps] == [s.drafted for s in b.steps]
    assert {s.drafted for s in b.steps} <= {0, 3}  # the policy's trees, not the fixed shape's 8 nodes
