"""tree_walk.walk_tree, the tree decode loop's verifier on the CPU, against verify_tree: the same
route, tokens, kinds, draws and distortion on random trees, for every kind of rule."""

import pytest
import torch

from ears_core import EARSRule, EntropyEARSRule, GreedyRule, StandardRule, TypicalRule
from ears_core.rules import BudgetEARSRule, FLyRule
from ears_core.decode.tree_walk import walk_tree
from ears_core.decode.verify_tree import verify_tree
from test_tree_verify import markov, sample_trees

SHAPES = [[-1, -1, -1, 0, 0, 3], [-1, 0, 1, 2], [-1, -1, 0, 0, 1, 2, 4], [-1]]
RULES = [StandardRule(), EARSRule(0.3), EntropyEARSRule(0.2), TypicalRule(), GreedyRule(), FLyRule(gate=0.0, window=1)]


def random_trees(parents, siblings, greedy, b=64):
    """b random trees of shape ``parents`` over 30 tokens, a draft near the target on every second token:
    tokens, target and draft probabilities, the acceptance and the sampling uniforms."""
    v_ = 30
    support = torch.arange(0, v_, 2)
    T = markov(v_, 7, 1.0)
    Q = torch.zeros(v_, v_)  # a draft near the target, on every second token only
    Q[:, support] = torch.softmax(torch.log(T[:, support]) + 0.5 * torch.randn(v_, len(support),
                                  generator=torch.Generator().manual_seed(8)), dim=-1)
    tokens, target, draft, g = sample_trees(T, Q, parents, b, seed=3, fixed=siblings == "fixed", random_roots=True)
    if greedy:
        target = torch.zeros_like(target).scatter_(-1, target.argmax(-1, keepdim=True), 1.0)
    d = max(1, len(parents))
    return tokens, target, draft, torch.rand(b, len(parents), generator=g), torch.rand(b, d + 1, generator=g)


@pytest.mark.parametrize("parents", SHAPES, ids=str)
@pytest.mark.parametrize("rule", RULES, ids=repr)
@pytest.mark.parametrize("siblings", ["sampled", "fixed"])
def test_the_walk_on_the_host_is_verify_tree(parents, rule, siblings):
    tokens, target, draft, u, su = random_trees(parents, siblings, isinstance(rule, GreedyRule))
    kw = dict(uniforms=u, sample_uniforms=su, with_distortion=not rule.lossless, siblings=siblings,
              draft_support=torch.arange(0, 30, 2))
    ref = verify_tree(target, draft, tokens, parents, rule, **kw)
    got = walk_tree(target, draft, tokens, parents, rule, **kw)
    for field in ("num_accepted", "path", "next_token", "is_bonus", "last_rejected", "kinds", "p", "q", "u", "max_p"):
        assert torch.equal(getattr(ref, field), getattr(got, field)), field
    for field in ("ratio", "tolerance", "next_p", "next_q"):
        assert torch.allclose(getattr(ref, field), getattr(got, field), atol=1e-6), field
    if not rule.lossless:
        assert torch.allclose(ref.distortion, got.distortion, atol=1e-6)
        assert torch.equal(ref.distortion_exact, got.distortion_exact)
    if len(parents) > 1 and not isinstance(rule, TypicalRule):  # power: routes of several lengths, rejections (typical keeps every top draft)
        assert len(set(ref.num_accepted.tolist())) >= 2 and not bool(ref.is_bonus.all())


def test_the_budget_rule_sees_one_tolerance_call_a_round_in_both():
    parents = [-1, -1, 0]
    tokens, target, draft, g = sample_trees(markov(20, 1), markov(20, 2), parents, 8, seed=4)
    kw = dict(uniforms=torch.rand(8, 3, generator=g), sample_uniforms=torch.rand(8, generator=g))
    a, b = BudgetEARSRule(0.05), BudgetEARSRule(0.05)
    verify_tree(target, draft, tokens, parents, a, **kw)
    walk_tree(target, draft, tokens, parents, b, **kw)
    assert len(a._betas) == len(b._betas) == 1
