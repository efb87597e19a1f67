"""tree_policy.TreeBudget: a round's tree size from the cost model.

Synthetic price curves with known answers (a brute-force search over the tree's size), a curve on
which verification never pays (an empty tree: a plain target step), and decoding with the budget
on: greedy stays the target's greedy output, the first sampled tokens follow P_target.
"""
from __future__ import annotations

import random
from itertools import islice
from types import SimpleNamespace

import pytest
import torch

from conftest import PROMPTS, assert_first_two_tokens_follow
from ears_core import EARSRule, GreedyRule, StandardRule
from ears_core.policy.costs import Calibration, DepthCalibration, PriceCurve
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.decode.api import tree_generate, tree_stream
from ears_core.policy.tree_budget import TreeBudget, node_estimate, tree_round_ms


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def brute_force(estimates, depths, prices):
    """The N whose prefix of nodes has the best expected tokens per millisecond (the smallest on ties)."""
    best, arg = -1.0, 0
    for n in range(len(estimates) + 1):
        e = 1 + sum(estimates[:n])
        v = e / (max(depths[:n], default=0) * prices.draft_ms + prices.verify(n + 1) + prices.overhead_ms)
        if v > best + 1e-12:
            best, arg = v, n
    return arg


def random_curve(rng, m, convex=False):
    step = rng.uniform(5, 80)
    verify, slope = [step], 0.0
    for _ in range(m - 1):
        if convex:  # each extra token costs no less than the last
            slope += step * rng.choice([0.0, 0.01, 0.05, 0.2]) * rng.random()
        else:  # flat, then steep, then flat: any non-decreasing curve
            slope = step * rng.choice([0.0, 0.03, 0.1, 0.4, 1.0]) * rng.random()
        verify.append(verify[-1] + slope)
    return PriceCurve(verify, rng.uniform(0, 0.2) * step, rng.uniform(0, 0.1) * step)


def random_nodes(rng, n, max_depth):
    """(priority, depth) in a best-first drawing order: priorities do not grow, depth grows by <= 1."""
    pri = sorted((rng.random() ** rng.choice([0.3, 1, 3]) for _ in range(n)), reverse=True)
    depths, deepest = [], 0
    for _ in range(n):
        d = rng.randint(1, min(deepest + 1, max_depth))
        deepest = max(deepest, d)
        depths.append(d)
    return list(zip(pri, depths))


def run_online(budget, nodes):
    """Ask the hook node by node as build_tree does; -> nodes drafted."""
    n = 0
    while n < len(nodes) and budget(nodes[n][0], n, nodes[n][1]):
        n += 1
    return n


def test_the_online_rule_never_stops_short_of_the_best_size_on_any_curve():
    rng = random.Random(0)
    picked = set()
    for trial in range(600):
        m = rng.randint(2, 12)
        prices = random_curve(rng, m)
        nodes = random_nodes(rng, m - 1, rng.randint(1, 5))
        calib = None if trial % 2 else Calibration(bins=10, prior_scale=0.8)
        budget = TreeBudget(prices, m - 1, calib)
        est = [node_estimate(p, d, calib) for p, d in nodes]
        want = brute_force(est, [d for _, d in nodes], prices)
        online = run_online(budget, nodes)
        assert online >= want  # the online rule never stops while more nodes could pay ...
        assert online == len(budget.estimates) and budget.estimates == pytest.approx(est[:online])
        picked.add(want)
    assert len(picked) >= 5  # small and large trees alike


def test_the_online_rule_is_the_best_size_on_convex_curves():
    # ... and on a convex curve with estimates that do not grow, it stops exactly at the best size
    rng = random.Random(1)
    picked = set()
    for _ in range(600):
        m = rng.randint(2, 12)
        curve = random_curve(rng, m, convex=True)
        # the round's price convex in its size: no draft pass price to amortise (it would make the
        # first node dearer than the next), one level
        prices = PriceCurve(curve.verify_ms, 0.0, curve.overhead_ms)
        nodes = [(p, 1) for p, _ in random_nodes(rng, m - 1, 1)]
        budget = TreeBudget(prices, m - 1)
        want = brute_force([p for p, _ in nodes], [1] * len(nodes), prices)
        assert run_online(budget, nodes) == want
        picked.add(want)
    assert len(picked) >= 5


def test_values_and_estimates_on_known_numbers():
    prices = PriceCurve([30.0, 31.8, 33.6, 40.0], draft_ms=1.5, overhead_ms=0.5)
    assert tree_round_ms(prices, 0, 0) == pytest.approx(30.5)
    assert tree_round_ms(prices, 3, 2) == pytest.approx(2 * 1.5 + 40.0 + 0.5)
    # a chain of k nodes costs what costs.PriceCurve.round_ms(k) says
    assert all(tree_round_ms(prices, k, k) == pytest.approx(prices.round_ms(k)) for k in range(4))
    cal = Calibration(bins=4, prior_weight=1.0)
    for _ in range(9):
        cal.observe(0.8, False)  # the bin [0.75, 1): acceptance (0 + 0.875) / 10
    assert node_estimate(0.64, 2, None) == pytest.approx(0.64)
    assert node_estimate(0.64, 2, cal) == pytest.approx(0.0875 ** 2)  # sqrt(0.64) = 0.8 per level
    assert node_estimate(1.7, 1, None) == 1.0 and node_estimate(-0.1, 1, None) == 0.0
    deep = Calibration(bins=4, prior_weight=1.0)
    for _ in range(9):
        deep.observe(0.8, True)  # depth 2 at 0.8: (9 + 0.875) / 10
    by_depth = DepthCalibration([cal, deep])
    assert node_estimate(0.64, 2, by_depth) == pytest.approx(0.0875 * 0.9875)  # level 1 reads table 1, level 2 table 2
    assert node_estimate(0.512, 3, by_depth) == pytest.approx(0.0875 * 0.9875 ** 2)  # deeper: the last table


def test_a_curve_where_verifying_never_pays_gives_an_empty_tree():
    # V(m) = m V(1) and a draft pass that costs something: no tree beats a plain target step
    prices = PriceCurve([30.0 * m for m in range(1, 17)], draft_ms=2.0, overhead_ms=0.0)
    budget = TreeBudget(prices, 16)
    assert not budget(1.0, 0, 1) and budget.estimates == []
    assert run_online(budget, [(1.0, 1)] * 16) == 0 and run_online(budget, [(0.99, d) for d in range(1, 17)]) == 0
    with pytest.raises(ValueError, match="whole number >= 1"):
        TreeBudget(prices, 0)
    with pytest.raises(ValueError, match="PriceCurve"):
        TreeBudget([30.0], 4)


def test_the_calibration_learns_from_a_round():
    # root -> 0 (rank 0, stood) -> 2 (rank 0, stood) ; root -> 1 (rank 1) ; 0 -> 3 (rank 1) ; 2 -> 4 (rank 0, fell)
    # 1 -> 5: its parent never stood, so it teaches nothing
    record = SimpleNamespace(parents=[-1, -1, 0, 0, 2, 1], scores=[0.6, 0.3, 0.42, 0.12, 0.21, 0.15],
                             priorities=[0.6, 0.3, 0.42, 0.12, 0.21, 0.15], path=[0, 2], depths=[1, 1, 2, 2, 3, 2])
    cal = Calibration(bins=10)
    TreeBudget(PriceCurve([10.0], 1.0), 8, cal).observe_round(record)
    # level confidences: 0.6 (stood), 0.3, 0.7 (stood), 0.2, 0.5 (fell)
    assert cal.seen == [0, 0, 1, 1, 0, 1, 1, 1, 0, 0]
    assert cal.stood == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    TreeBudget(PriceCurve([10.0], 1.0), 8).observe_round(record)  # no calibration: nothing to learn
    by_depth = DepthCalibration([Calibration(bins=10), Calibration(bins=10)])
    TreeBudget(PriceCurve([10.0], 1.0), 8, by_depth).observe_round(record)
    assert by_depth.tables[0].seen == [0, 0, 0, 1, 0, 0, 1, 0, 0, 0]  # depth 1: 0.6 (stood), 0.3
    assert by_depth.tables[1].seen == [0, 0, 1, 0, 0, 1, 0, 1, 0, 0]  # depths 2 and 3: 0.7 (stood), 0.2, 0.5
    assert by_depth.tables[1].stood == [0, 0, 0, 0, 0, 0, 0, 1, 0, 0]


def cheap_prices():
    # V(1..) nearly flat, then dearer: trees of a few nodes pay, big ones do not
    return PriceCurve([10.0, 10.4, 10.8, 11.4, 12.2, 13.4, 15.0, 17.0, 19.5, 22.5, 26.0, 30.0, 34.0], 0.4, 0.3)


@pytest.fixture(scope="module")
def head():
    from conftest import tiny_llama
    target = tiny_llama(0)
    torch.manual_seed(5)
    return DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).eval()


@pytest.mark.parametrize("use_head", [False, True], ids=["model", "head"])
def test_greedy_with_the_cost_budget_is_the_targets_greedy_output(tiny_pair, head, use_head):
    target, draft = tiny_pair
    sizes = []
    for prompt in PROMPTS:
        drafter = EagleDrafter(head, target) if use_head else draft
        budget = TreeBudget(cheap_prices(), 12, Calibration())
        gen = tree_stream(target, drafter, prompt, rule=GreedyRule(), budget=12, depth=5, temperature=0,
                          max_new_tokens=40, keep=budget, backoff=True)
        assert gen.result().token_ids == hf_greedy(target, prompt, 40)
        sizes += [len(tr.tokens) for tr in gen.trees]
        for st, tr in zip(gen.steps, gen.trees):  # the policy's estimates are recorded per drafted node
            assert len(st.estimates) == len(tr.tokens)
            if tr.tokens:
                assert st.expected == pytest.approx(1 + sum(st.estimates))
        assert budget.calibration.seen != [0.0] * 10  # it learnt from the rounds
    assert len(set(sizes)) >= 3 and max(sizes) < 12  # the prices really size the trees


@pytest.mark.parametrize("use_head", [False, True], ids=["model", "head"])
def test_a_budget_that_never_pays_is_target_only_draw_for_draw(tiny_pair, head, use_head):
    from ears_core import autoregressive
    target, draft = tiny_pair
    dear = PriceCurve([10.0 * m for m in range(1, 17)], 1.0, 0.0)
    for prompt, temperature in ((PROMPTS[0], 0.9), (PROMPTS[2], 0)):
        ref = autoregressive(target, prompt, temperature=temperature, max_new_tokens=20, seed=7)
        budget = TreeBudget(dear, 8)
        gen = tree_stream(target, EagleDrafter(head, target) if use_head else draft, prompt, rule=EARSRule(0.3),
                          budget=8, depth=4, temperature=temperature, max_new_tokens=20, seed=7, keep=budget,
                          backoff=True)
        out = gen.result()
        assert out.token_ids == ref.token_ids and {e.kind for e in out.events} == {"target"}
        assert all(not tr.tokens for tr in gen.trees)
        # the probes back off: rounds 2-3, 5-8, 10-17 do not even ask the drafter
        assert budget.rounds < len(gen.trees) / 2


@pytest.mark.slow
def test_the_first_tokens_with_the_cost_budget_follow_the_target(small_vocab_pair):
    # As tests/test_tree_decoding.py's end-to-end check, with the cost model sizing every tree.
    target, draft = small_vocab_pair
    prompt, n = [3, 7, 1], 1000  # as there: resampling from P_target instead of the residual reads p 5e-6
    first, second, sizes = [], [], set()
    # the depth-1 nodes always pay; a depth-2 node pays or not depending on its priority, which
    # depends on the draw of its parent
    prices = PriceCurve([10.0, 10.2, 10.4, 10.6, 10.7, 10.8, 10.9], 0.02, 0.0)
    for seed in range(n):
        budget = TreeBudget(prices, 6)
        gen = tree_stream(target, draft, prompt, rule=StandardRule(), budget=6, depth=2, width=3, temperature=1.0,
                          max_new_tokens=3, seed=seed, with_distortion=False, keep=budget)
        a, b = islice(gen, 2)  # the rounds after the second token cannot change it: they are not run
        sizes.add(len(gen.trees[0].tokens))
        first.append(a.token_id)
        second.append(b.token_id)
    assert len(sizes) >= 3  # the budget varies with the draws before it, so a bias would show
    assert_first_two_tokens_follow(target, prompt, first, second)


def test_width_one_with_the_budget_is_a_chain_of_the_budgets_length(tiny_pair):
    # one node per depth: the budget decides a chain's length, and greedy stays greedy
    target, draft = tiny_pair
    out = tree_generate(target, draft, PROMPTS[2], rule=GreedyRule(), budget=6, depth=6, width=1, temperature=0,
                        max_new_tokens=30, keep=TreeBudget(cheap_prices(), 6))
    assert out.token_ids == hf_greedy(target, PROMPTS[2], 30)


def test_a_tree_calibration_reads_and_teaches_siblings_apart_from_first_children():
    from ears_core.policy.tree_budget import TreeCalibration

    first = DepthCalibration([Calibration(bins=10, prior_weight=0.0), Calibration(bins=10, prior_weight=0.0)])
    sib = DepthCalibration([Calibration(bins=10, prior_weight=0.0), Calibration(bins=10, prior_weight=0.0)])
    first.tables[0].stood[2], first.tables[0].seen[2] = 6, 10  # a first child at 0.2-0.3 stands 0.6
    sib.tables[0].stood[2], sib.tables[0].seen[2] = 1, 10  # a later sibling at the same probability: 0.1
    cal = TreeCalibration(first, sib)
    assert cal.level(0.25, 1, 0) == pytest.approx(0.6) and cal.level(0.25, 1, 2) == pytest.approx(0.1)
    budget = TreeBudget(PriceCurve([10.0, 10.0, 10.0], 0.0), 4, cal)
    assert budget.level == cal.level and budget.estimate(0.37, 3) == pytest.approx(0.37)  # asked with estimates
    # the record of the learning test above: ranks route each node to its table
    record = SimpleNamespace(parents=[-1, -1, 0, 0, 2, 1], scores=[0.6, 0.3, 0.42, 0.12, 0.21, 0.15],
                             priorities=[0.6, 0.3, 0.42, 0.12, 0.21, 0.15], path=[0, 2], depths=[1, 1, 2, 2, 3, 2],
                             ranks=[0, 1, 0, 1, 0, 0])
    budget.observe_round(record)
    assert sib.tables[0].seen[3] == 1 and sib.tables[0].stood[3] == 0  # node 1: rank 1 at depth 1, 0.3, fell
    assert sib.tables[1].seen[2] == 1  # node 3: rank 1 at depth 2, 0.2
    assert first.tables[0].seen[6] == 1 and first.tables[0].stood[6] == 1  # node 0: 0.6, stood
    assert first.tables[1].seen[7] == 1 and first.tables[1].seen[5] == 1  # nodes 2 (0.7) and 4 (0.5)
    copy = cal.copy()
    copy.observe(0.25, True, depth=1, rank=1)
    assert sib.tables[0].seen[2] == 10  # a copy learns apart


def test_a_budget_with_tree_calibration_drafts_fewer_weak_siblings(tiny_pair, head):
    """On the tiny pair at T = 0.9, a budget whose sibling table says later siblings rarely stand
    drafts fewer nodes than one that prices them like first children; the output stays exact
    (greedy: the target's own)."""
    from ears_core.policy.tree_budget import TreeCalibration

    target, draft = tiny_pair
    prices = PriceCurve([10.0, 10.2, 10.4, 10.6, 10.8, 11.0, 11.2, 11.4, 11.6], 0.5, 0.2)
    generous = DepthCalibration([Calibration(prior_scale=1.0, prior_weight=1e6)])  # acceptance = probability
    wary = DepthCalibration([Calibration(prior_scale=0.05, prior_weight=1e6)])  # a sibling: 1/20 of it
    sizes = {}
    for name, sib in (("generous", generous), ("wary", wary)):
        budget = TreeBudget(prices, 8, TreeCalibration(generous.copy(), sib))
        gen = tree_stream(target, draft, torch.tensor([PROMPTS[1]]), rule=StandardRule(), budget=8, depth=3,
                          temperature=0.9, max_new_tokens=30, seed=2, keep=budget)
        gen.result()
        sizes[name] = sum(s.drafted for s in gen.steps) / len(gen.steps)
        assert all(tr.ranks.count(0) >= 1 for tr in gen.trees if tr.tokens)
    assert sizes["wary"] < sizes["generous"]
    greedy_budget = TreeBudget(prices, 8, TreeCalibration(generous.copy(), wary.copy()))
    out = tree_generate(target, draft, torch.tensor([PROMPTS[1]]), rule=GreedyRule(), budget=8, depth=3,
                        temperature=0, max_new_tokens=30, keep=greedy_budget)
    assert out.token_ids == hf_greedy(target, PROMPTS[1], 30)


def test_node_price_is_learnt_from_the_rounds_and_one_slow_round_cannot_price_trees_out():
    prices = PriceCurve([10.0, 11.0, 12.0, 13.0, 14.0], draft_ms=1.0, overhead_ms=0.5)
    budget = TreeBudget(prices, 4, node_ms=0.2)
    for _ in range(40):  # rounds that cost the chain's prices plus 0.6 ms a node
        budget.observe_cost(4, 2, tree_round_ms(prices, 4, 2) + 4 * 0.6)
    assert budget.node_ms == pytest.approx(0.6, rel=1e-3) and budget.costed == 40
    budget.observe_cost(4, 2, 5000.0)  # a tree shape's first kernels: 5 s for one round
    assert 0.6 < budget.node_ms <= 0.6 + 0.1 * (3 * 0.6 - 0.6) + 1e-9  # one tenth of the way to 3x, not to 1,250 ms
    fresh = TreeBudget(prices, 4, node_ms=0.0)
    fresh.observe_cost(4, 2, 5000.0)  # from 0: capped at 3x the floor of 0.02 steps (10 ms a step)
    assert fresh.node_ms == pytest.approx(3 * 0.02 * 10.0)


def test_a_machine_slower_than_its_profile_is_not_read_as_a_dear_node():
    prices = PriceCurve([10.0, 11.0, 12.0, 13.0, 14.0], draft_ms=1.0, overhead_ms=0.5)
    budget = TreeBudget(prices, 4, node_ms=0.2)
    for _ in range(30):  # every pass 40 % slower than the profile (another job), nodes 0.3 ms each beyond it
        verify = 1.4 * prices.verify(5)
        budget.observe_cost(4, 2, 2 * 1.0 + verify + 0.5 + 4 * 0.3, verify_ms=verify)
    assert budget.node_ms == pytest.approx(0.3, rel=1e-3)
    blind = TreeBudget(prices, 4, node_ms=0.2)  # without the measured pass the slowdown lands on the nodes
    for _ in range(30):
        blind.observe_cost(4, 2, 2 * 1.0 + 1.4 * prices.verify(5) + 0.5 + 4 * 0.3)
    assert blind.node_ms > 1.5
