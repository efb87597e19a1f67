"""Trees: best-first building, sibling draws, the tree mask, the tree pass and the cache rearrangement."""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import DynamicCache

from conftest import PROMPTS, perturbed_copy, tiny_llama
from ears_core.draft.drafters import ModelDrafter
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.sampling import SamplingConfig, Stream, counter_uniforms, logits_to_probs, sample_with_uniforms
from ears_core.model.passes.kv_cache import drop_last_positions, keep_tail_positions
from ears_core.decode.tree import keep_path, score_tree
from ears_core.draft.trees import (
    DraftTree, TreeDraws, TreeSpec, accept_keys, accept_uniforms, ancestor_matrix, build_tree,
    additive_mask, tree_position_ids, tree_visibility,
)


def markov_logits(v, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(1.5 * torch.randn(v, v, generator=g), -1)  # (V, V): row = previous token


def synthetic_build(spec, seed=0, v=6, greedy=False, start=0, calls=None, logits=None, keep=None):
    """A tree from a Markov draft: the logits after a node depend on its token only (root token 0)."""
    logits = markov_logits(v, 1) if logits is None else logits

    def expand(ids, tree):
        assert all(tree.depths[i] < spec.depth for i in ids)
        if calls is not None:
            calls.append(list(ids))
        return logits[tree.tokens[ids]]

    probs = lambda x: torch.softmax(x, -1)  # noqa: E731  (T = 1)
    return build_tree(logits[0], expand, spec, probs, TreeDraws(seed, start, spec.branching), greedy=greedy, keep=keep)


def test_spec_checks_its_numbers():
    for bad in (dict(budget=0, depth=2), dict(budget=2, depth=-1), dict(budget=2, depth=2, width=0),
                dict(budget=2, depth=2, siblings="random")):
        with pytest.raises(ValueError):
            TreeSpec(**bad)
    assert not TreeSpec(5, 5, width=1).branching and TreeSpec(5, 3).branching
    assert TreeSpec(8, 4, 2).capped(2) == TreeSpec(8, 2, 2)


@pytest.mark.parametrize("siblings", ["sampled", "fixed"])
@pytest.mark.parametrize("budget,depth,width", [(10, 3, None), (12, 4, 2), (5, 2, 3), (20, 3, 4)])
def test_a_built_tree_respects_its_spec(siblings, budget, depth, width):
    calls = []
    tree = synthetic_build(TreeSpec(budget, depth, width, siblings), seed=3, calls=calls)
    assert tree.size == budget and tree.siblings == siblings
    assert max(tree.depths) <= depth and all(p < i for i, p in enumerate(tree.parents))
    logits = markov_logits(6, 1)
    for e in range(-1, tree.size):
        kids = [i for i, p in enumerate(tree.parents) if p == e]
        assert [tree.ranks[i] for i in kids] == list(range(len(kids)))  # created in rank order
        assert len(kids) <= (width or budget)
        toks = tree.tokens[kids].tolist()
        assert len(set(toks)) == len(toks)  # siblings are distinct tokens
        q = torch.softmax(logits[0 if e < 0 else int(tree.tokens[e])], -1)
        for j, i in enumerate(kids):  # what each sibling was drawn from
            if siblings == "fixed":
                assert tree.draft_probs[i].tolist() == torch.nn.functional.one_hot(tree.tokens[i], 6).float().tolist()
                assert toks[j] == int(q.argsort(descending=True)[j])
            else:
                left = q.clone()
                left[toks[:j]] = 0
                assert torch.allclose(tree.draft_probs[i], left / left.sum(), atol=1e-6)
        for i in kids:  # scores: products of draft probabilities along the path
            parent_score = 1.0 if e < 0 else tree.scores[e]
            assert tree.scores[i] == pytest.approx(parent_score * float(q[tree.tokens[i]]), rel=1e-5)
    # the draft runs each node at most once, only nodes above the deepest level, and siblings
    # share passes: a pass per level, or at least two nodes a pass
    run = [i for c in calls for i in c]
    assert len(run) == len(set(run)) and all(tree.depths[i] < depth for i in run)
    assert len(calls) <= max(depth, len(run) // 2)


def top_nodes(q, depth, width):
    """Every rank path of at most `depth` steps and `width` ranks, with its product of draft
    probabilities, best first."""
    order = q.argsort(-1, descending=True)
    scored = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(width), repeat=d):
            tok, s = 0, 1.0
            for r in ranks:
                tok, prev = int(order[tok, r]), tok
                s *= float(q[prev, tok])
            scored.append((s, ranks))
    return sorted(scored, reverse=True)


def test_a_draft_as_sure_everywhere_gives_the_best_nodes_by_path_probability():
    # EAGLE-2: the tree is the `budget` nodes of highest product of draft probabilities, among all
    # paths of at most `depth` tokens and `width` children per node. With the same confidence at
    # every node (each row a permutation of one distribution) the expansion order is exact.
    v, depth, width = 6, 4, 3
    g = torch.Generator().manual_seed(0)
    base = torch.tensor([0.42, 0.27, 0.16, 0.09, 0.04, 0.02])
    q = torch.stack([base[torch.randperm(v, generator=g)] for _ in range(v)])  # (V, V)
    scored = top_nodes(q, depth, width)
    budgets = [b for b in range(4, 20) if scored[b - 1][0] > scored[b][0] * 1.001]  # no tie at the cut
    assert len(budgets) >= 5
    for budget in budgets:
        tree = synthetic_build(TreeSpec(budget, depth, width, "fixed"), logits=q.log())
        assert {tuple(tree.path_ranks(i)) for i in range(tree.size)} == {r for _, r in scored[:budget]}


def test_on_any_draft_the_tree_holds_most_of_the_best_nodes_mass():
    v, depth, width, budget = 8, 4, 3, 12
    logits = markov_logits(v, 5)
    scored = top_nodes(torch.softmax(logits, -1), depth, width)
    tree = synthetic_build(TreeSpec(budget, depth, width, "fixed"), logits=logits, v=v)
    best = sum(s for s, _ in scored[:budget])
    assert sum(tree.scores) >= 0.9 * best


def test_width_one_is_the_chain_draw_for_draw():
    logits, seed, start, depth = markov_logits(6, 1), 9, 17, 5
    tree = synthetic_build(TreeSpec(depth, depth, width=1), seed=seed, start=start, logits=logits)
    assert tree.parents == [-1, 0, 1, 2, 3] and tree.is_chain()
    tok = 0
    for d in range(depth):  # the chain decoder's draw for output position start + d
        q = torch.softmax(logits[tok], -1)
        tok = int(sample_with_uniforms(q, counter_uniforms(seed, torch.tensor(start + d), Stream.DRAFT)))
        assert int(tree.tokens[d]) == tok
        assert torch.equal(tree.draft_probs[d], q)


@pytest.mark.parametrize("siblings", ["sampled", "fixed"])
def test_a_stopping_rule_sees_each_priority_before_the_draw_and_ends_the_tree(siblings):
    asked = []

    def keep(priority, nodes, depth):
        asked.append((priority, nodes, depth))
        return nodes < 7

    full = synthetic_build(TreeSpec(12, 4, 3, siblings), seed=5)
    cut = synthetic_build(TreeSpec(12, 4, 3, siblings), seed=5, keep=keep)
    budget7 = synthetic_build(TreeSpec(7, 4, 3, siblings), seed=5)
    # stopping after 7 nodes is the budget of 7: the same nodes, tokens and draws
    assert cut.parents == budget7.parents == full.parents[:7] and cut.tokens.tolist() == budget7.tokens.tolist()
    assert [a[0] for a in asked[:7]] == cut.priorities and [a[1] for a in asked] == list(range(8))
    assert [a[2] for a in asked[:7]] == cut.depths and asked[7][0] == pytest.approx(full.priorities[7])
    assert all(p > 0 for p in full.priorities)


def test_draft_keys_are_the_chains_without_branching_and_unique_per_round_with_it():
    chain = TreeDraws(0, 10, branching=False)
    assert chain.draft_key(3, [0, 0, 0]) == 12
    branch = TreeDraws(0, 10, branching=True)
    keys = {branch.draft_key(len(r), r) for d in (1, 2, 3) for r in itertools.product(range(4), repeat=d)}
    assert len(keys) == 4 + 16 + 64 and min(keys) >= 1 << 62
    later = TreeDraws(0, 11, branching=True)  # position 12 in a round that starts at 11
    assert later.draft_key(2, [0, 0]) != branch.draft_key(3, [0, 0, 0])
    assert accept_keys([1, 1, 2], [0, 1, 0], 10) == [10, 10 + (1 << 40), 11]
    keys = torch.tensor(accept_keys([1, 1, 2], [0, 1, 0], 10))
    assert accept_uniforms(7, [1, 1, 2], [0, 1, 0], 10, torch.device("cpu")).tolist() == counter_uniforms(7, keys, Stream.ACCEPT).tolist()


@pytest.mark.slow
def test_sampled_siblings_are_drawn_without_replacement():
    v, n = 5, 6000
    logits = markov_logits(v, 2)
    q = torch.softmax(logits[0], -1).double().numpy()
    pairs = np.zeros((v, v))
    for seed in range(n):
        tree = synthetic_build(TreeSpec(2, 1, 2, "sampled"), seed=seed, v=v, logits=logits)
        a, b = tree.tokens.tolist()
        pairs[a, b] += 1
    expected = np.array([[q[a] * q[b] / (1 - q[a]) if a != b else 0.0 for b in range(v)] for a in range(v)])
    off = ~np.eye(v, dtype=bool)
    assert pairs[~off].sum() == 0
    assert stats.chisquare(pairs[off], expected[off] / expected[off].sum() * n).pvalue > 1e-3
    # with replacement would put mass q(a)^2 on the diagonal; independent draws also differ off it
    assert stats.chisquare(pairs[off], np.outer(q, q)[off] / np.outer(q, q)[off].sum() * n).pvalue < 1e-6


# ----------------------------------------------------------------------------- mask and positions


def test_the_mask_shows_each_entry_its_prefix_ancestors_and_itself():
    parents, depths = [-1, -1, 0, 1, 0], [1, 1, 2, 2, 2]
    anc = ancestor_matrix(parents).int().tolist()
    assert anc == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 0, 1, 0, 1, 0],
        [1, 1, 0, 0, 0, 1],
    ]
    mask = additive_mask(tree_visibility(parents, 3, [2, 4], [0, 1, 2, 3, 4, 5]), torch.float32)
    assert mask.shape == (1, 1, 2, 9)
    assert (mask[0, 0] == 0).int().tolist() == [[1, 1, 1, 1, 0, 1, 0, 0, 0], [1, 1, 1, 1, 0, 1, 0, 1, 0]]
    assert float(mask.min()) == torch.finfo(torch.float32).min
    assert tree_position_ids(depths, 7, [0, 1, 3, 5], torch.device("cpu")).tolist() == [[7, 8, 9, 9]]


# ----------------------------------------------------------------------------- target pass and cache

PARENTS = [-1, -1, 0, 0, 1, 2, 2]


def hand_tree(tokens, parents=PARENTS):
    depths = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    ranks = [sum(1 for q in parents[:i] if q == p) for i, p in enumerate(parents)]
    return DraftTree(torch.tensor(tokens), torch.zeros(len(tokens), 96), list(parents), depths, ranks,
                     [1.0] * len(tokens), "sampled")


def node_path(tree, node):
    nodes = []
    while node >= 0:
        nodes.insert(0, node)
        node = tree.parents[node]
    return nodes


def route(tree, node):
    toks = []
    while node >= 0:
        toks.append(int(tree.tokens[node]))
        node = tree.parents[node]
    return toks[::-1]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


def prefilled(model, prompt):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True)
    return cache


def test_one_tree_pass_gives_every_node_the_logits_of_its_own_path(target):
    prompt, tree = PROMPTS[2], hand_tree([5, 9, 5, 70, 3, 3, 41])
    cache = prefilled(target, prompt)
    with torch.no_grad():
        logits, hidden = score_tree(target, cache, torch.tensor([[prompt[-1]]]), tree, need_hidden=True)
        for entry in range(tree.size + 1):
            seq = prompt + (route(tree, entry - 1) if entry else [])
            fresh = target(torch.tensor([seq]), output_hidden_states=True)
            assert torch.allclose(logits[0, entry], fresh.logits[0, -1], atol=1e-4), entry
            assert torch.allclose(hidden[0, entry], fresh.hidden_states[-1][0, -1], atol=1e-4)
    assert cache.get_seq_length() == len(prompt) + tree.size


@pytest.mark.parametrize("path", [[], [0], [1, 4], [0, 2, 5], [0, 3]])
def test_after_rearrangement_the_cache_is_the_chains(target, path):
    prompt, tree = PROMPTS[0], hand_tree([5, 9, 5, 70, 3, 3, 41])
    cache = prefilled(target, prompt)
    with torch.no_grad():
        score_tree(target, cache, torch.tensor([[prompt[-1]]]), tree)
        keep_path(cache, len(prompt), tree.size, path)
        nxt = 11
        cached = target(torch.tensor([[nxt]]), past_key_values=cache, use_cache=True).logits[0, -1]
        seq = prompt + [int(tree.tokens[a]) for a in path] + [nxt]
        fresh_cache = DynamicCache(config=target.config)
        fresh = target(torch.tensor([seq]), past_key_values=fresh_cache, use_cache=True).logits[0, -1]
    assert torch.allclose(cached, fresh, atol=1e-4)
    assert cache.get_seq_length() == len(seq)
    for mine, ref in zip(cache.layers, fresh_cache.layers):
        assert torch.allclose(mine.keys, ref.keys, atol=1e-4) and torch.allclose(mine.values, ref.values, atol=1e-4)


@pytest.mark.parametrize("start, keep", [(5, [6, 9]), (3, [3, 4, 5]), (4, [8]), (6, [])])
def test_keeping_the_tail_in_place_equals_gathering_every_position(target, start, keep):
    prompt = PROMPTS[2] + PROMPTS[0]  # 13 tokens: 12 cached positions
    a, b = prefilled(target, prompt), prefilled(target, prompt)
    idx = torch.tensor(keep, dtype=torch.long)
    every = torch.cat([torch.arange(start), idx])  # the reference: gather every kept position
    for layer in a.layers:
        layer.keys, layer.values = layer.keys.index_select(-2, every), layer.values.index_select(-2, every)
    keep_tail_positions(b, start, idx)
    assert b.get_seq_length() == start + len(keep) == a.get_seq_length()
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


@pytest.mark.parametrize("n", [0, 1, 4])
def test_dropping_the_last_positions_equals_transformers_crop(target, n):
    prompt = PROMPTS[2] + PROMPTS[0]
    a, b = prefilled(target, prompt), prefilled(target, prompt)
    a.crop(-n) if n else None
    drop_last_positions(b, n)
    kept = len(prompt) - 1 - n  # prefilled() caches all but the last token
    assert b.get_seq_length() == kept == a.get_seq_length()
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)
    with torch.no_grad():  # the cropped cache decodes the next token as a fresh pass over the kept prefix does
        cached = target(torch.tensor([[prompt[kept]]]), past_key_values=b, use_cache=True).logits[0, -1]
        fresh = target(torch.tensor([prompt[: kept + 1]])).logits[0, -1]
    assert torch.allclose(cached, fresh, atol=1e-4) and b.get_seq_length() == kept + 1


# ----------------------------------------------------------------------------- drafters


def probs_at(temperature):
    return lambda logits: logits_to_probs(logits[..., :96], SamplingConfig(temperature))


def test_a_model_drafter_tree_drafts_every_node_from_its_own_path(target):
    draft = perturbed_copy(target, 0.05, seed=2)
    drafter = ModelDrafter(draft)
    prompt = PROMPTS[2]
    drafter.prefill(torch.tensor([prompt]), None)
    tree = drafter.propose_tree(TreeSpec(10, 3, 3), probs_at(1.0), TreeDraws(4, 0, True))
    assert tree.size == 10 and not tree.is_chain() and max(tree.depths) == 3
    with torch.no_grad():
        for e in range(-1, tree.size):
            kids = [i for i, p in enumerate(tree.parents) if p == e]
            if kids:  # rank 0 was drawn from the draft's distribution after e's path
                seq = prompt + (route(tree, e) if e >= 0 else [])
                fresh = torch.softmax(draft(torch.tensor([seq])).logits[0, -1], -1)
                assert torch.allclose(tree.draft_probs[kids[0]], fresh, atol=1e-5), e
    # committing a path that is not the first nodes leaves the draft's cache as a chain would
    path = next(node_path(tree, i) for i in range(tree.size)
                if tree.depths[i] >= 2 and node_path(tree, i) != list(range(tree.depths[i])))
    drafter.commit_tree(path, torch.tensor([7]))
    nxt = drafter.propose_tree(TreeSpec(1, 1), probs_at(1.0), TreeDraws(4, len(path) + 1, False))
    with torch.no_grad():
        fresh = torch.softmax(draft(torch.tensor([prompt + [int(tree.tokens[a]) for a in path] + [7]])).logits[0, -1], -1)
    assert torch.allclose(nxt.draft_probs[0], fresh, atol=1e-5)


def test_an_eagle_tree_drafts_every_node_as_the_chain_would(target):
    torch.manual_seed(5)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).eval()
    prompt = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        hidden = target(prompt[:, :-1], output_hidden_states=True).hidden_states[-1]
    drafter = EagleDrafter(head, target)
    drafter.prefill(prompt, hidden)
    tree = drafter.propose_tree(TreeSpec(9, 3, 3), probs_at(1.0), TreeDraws(2, 0, True))
    assert not tree.is_chain() and all(int(t) % 2 == 0 for t in tree.tokens)
    for e in range(tree.size):
        kids = [i for i, p in enumerate(tree.parents) if p == e]
        if not kids:
            continue
        chain = EagleDrafter(head, target)  # the chain's way: feed the path one token at a time
        chain.prefill(prompt, hidden)
        feat = chain._s.next_feat
        for tok in route(tree, e):
            feat = chain._head(feat.unsqueeze(1), torch.tensor([[tok]]))[:, -1]
        fresh = torch.softmax(chain._widen(chain._sub(feat)), -1)[0]
        assert torch.allclose(tree.draft_probs[kids[0]], fresh, atol=1e-5), e
    assert math.isclose(float(tree.draft_probs[0].sum()), 1.0, rel_tol=1e-5)


def test_sampled_siblings_are_drawn_from_the_sampling_distribution_and_scored_by_the_raw_one():
    """rank_fn (the raw T = 1 softmax) scores slots and paths; tokens come from probs_fn (here T = 0.5
    and top-k 2). Scores are products of raw probabilities along each path, priorities are raw
    top-j values, and a node never gets more children than its top-k leaves tokens to draw."""
    v, logits = 6, markov_logits(6, 1)
    spec = TreeSpec(12, 3, 3, "sampled")
    cfg = SamplingConfig(temperature=0.5, top_k=2)
    raw = lambda x: torch.softmax(x, -1)  # noqa: E731
    expand = lambda ids, tree: logits[tree.tokens[ids]]  # noqa: E731
    tree = build_tree(logits[0], expand, spec, lambda x: logits_to_probs(x, cfg), TreeDraws(5, 0, True), rank_fn=raw)
    assert tree.size > 0 and torch.isfinite(tree.draft_probs).all()
    p = raw(logits)  # (V, V): raw draft probability of token b after token a
    for i, parent in enumerate(tree.parents):
        prev = 0 if parent < 0 else int(tree.tokens[parent])
        base = 1.0 if parent < 0 else tree.scores[parent]
        assert tree.scores[i] == pytest.approx(base * float(p[prev, tree.tokens[i]]), rel=1e-5)
        nth = torch.sort(p[prev], descending=True).values[tree.ranks[i]]
        assert tree.priorities[i] == pytest.approx(base * float(nth), rel=1e-5)
        assert tree.ranks[i] < 2  # top-k 2: at most two children, even where the budget allows three
        q = logits_to_probs(logits[prev], cfg)
        assert bool((tree.draft_probs[i] > 0).sum() <= 2) and float(q[tree.tokens[i]]) > 0


def test_top_slots_come_in_the_order_of_a_stable_sort_ties_to_the_lower_token():
    from ears_core.draft.trees import ranked

    s = torch.tensor([[0.1, 0.3, 0.2, 0.3, 0.05, 0.05],   # a tie for first place: token 1 before 3
                      [0.0, 0.0, 0.5, 0.0, 0.25, 0.25],   # a tie at the last slot kept (k = 3): token 4
                      [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]])
    vals, ids = (t[:, :3].tolist() for t in ranked(s, 3))  # the k largest, as the host tree reads them
    for row, (v, i) in enumerate(zip(vals, ids)):
        ref_v, ref_i = torch.sort(s[row], descending=True, stable=True)
        assert i == ref_i[:3].tolist() and v == pytest.approx(ref_v[:3].tolist())
    assert ids[0][0] == int(s[0].argmax())  # rank 0 is the chain's greedy draft


def test_with_a_level_function_the_stopping_rule_is_asked_with_the_path_estimate():
    asked = []

    def level(p, depth, rank):  # a first child stands with p, a later sibling with p / 2, one level deeper 0.8x
        return (p if rank == 0 else p / 2) * 0.8 ** (depth - 1)

    def keep(estimate, nodes, depth):
        asked.append(estimate)
        return True

    spec = TreeSpec(9, 3, 3, "fixed")
    plain = synthetic_build(spec, seed=1)
    logits = markov_logits(6, 1)
    probs = lambda x: torch.softmax(x, -1)  # noqa: E731

    def expand(ids, tree):
        return logits[tree.tokens[ids]]

    tree = build_tree(logits[0], expand, spec, probs, TreeDraws(1, 0, True), keep=keep, level=level)
    assert tree.parents == plain.parents and tree.tokens.tolist() == plain.tokens.tolist()  # the order is kept
    est = []
    for i, (parent, rank) in enumerate(zip(tree.parents, tree.ranks)):
        base = 1.0 if parent < 0 else tree.scores[parent]
        conf = tree.priorities[i] / base  # the slot's probability at its parent
        est.append((1.0 if parent < 0 else est[parent]) * level(conf, tree.depths[i], rank))
    assert asked[: tree.size] == pytest.approx(est)
    assert asked[: tree.size] != pytest.approx(tree.priorities)  # not the raw priorities
