"""verify_tree(): hand-made cases, a plain reference loop on scripted draws, and distributions.

The distributions are many seeded rounds over synthetic trees built here, independently of the
library's tree builder: a Markov target T[prev] and a disagreeing Markov draft Q[prev] over a small
vocabulary, siblings drawn without replacement (torch.multinomial) or fixed (the draft's top m).
The expected EARS distribution is enumerated here from its definition, over every order of the
sibling draws.
"""

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from ears_core import DraftKind, EARSRule, GreedyRule, StandardRule, verify
from ears_core.decode.verify_tree import verify_tree
from ears_core.rules.tree_distortion import node_emitted_distribution

ACC, PAR, REJ, NOT = (int(k) for k in (DraftKind.ACCEPTED, DraftKind.PARDONED, DraftKind.REJECTED, DraftKind.NOT_EVALUATED))
# Widths 3 (root), 2, 1, 4 and 2; depth 3.
PARENTS = [-1, -1, -1, 0, 0, 1, 3, 3, 3, 3, 5, 5]


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


# ----------------------------------------------------------------------------- hand-made cases


def test_a_rejected_sibling_makes_the_next_one_face_the_residual():
    p = _t([0.5, 0.3, 0.2])
    q0 = _t([0.1, 0.8, 0.1])  # rank 0 drew token 1: ratio 0.3 / 0.8 = 0.375 < U = 0.5
    q1 = _t([0.5, 0.0, 0.5])  # rank 1 drawn without token 1; the residual is [0.8, 0, 0.2]
    tp = torch.stack([p, p, p])[None]  # (1, 3, V): root, then after each node
    dp = torch.stack([q0, q1])[None]
    v = verify_tree(tp, dp, torch.tensor([[1, 0]]), [-1, -1], StandardRule(),
                    uniforms=_t([[0.5, 0.99]]), sample_uniforms=_t([0.3]))
    assert v.kinds[0].tolist() == [REJ, ACC]  # 0.8 / 0.5 = 1.6 >= any U
    assert v.ratio[0].tolist() == pytest.approx([0.375, 1.6])
    assert v.p[0].tolist() == pytest.approx([0.3, 0.5])  # P_target itself, for the records
    assert v.path[0].tolist() == [1] and int(v.num_accepted[0]) == 1 and bool(v.is_bonus[0])


@pytest.mark.parametrize("beta,kinds", [(0.0, [REJ, REJ]), (0.2, [REJ, PAR])])
def test_the_tolerance_comes_from_p_target_and_applies_to_every_sibling(beta, kinds):
    p = _t([0.5, 0.3, 0.2])
    tp = torch.stack([p, p, p])[None]
    dp = torch.stack([_t([0.1, 0.8, 0.1]), _t([0.5, 0.0, 0.5])])[None]
    # rank 1 is token 2: residual 0.2 / q 0.5 = 0.4 < U = 0.45; tol = beta * (1 - 0.5) = 0.1 pardons it
    v = verify_tree(tp, dp, torch.tensor([[1, 2]]), [-1, -1], EARSRule(beta),
                    uniforms=_t([[0.5, 0.45]]), sample_uniforms=_t([0.99]))
    assert v.kinds[0].tolist() == kinds
    assert v.tolerance[0].tolist() == pytest.approx([beta * 0.5] * 2)
    if beta == 0:  # both rejected: the last residual norm(max(0, [.8, 0, .2] - [.5, 0, .5])) is token 0
        assert int(v.next_token[0]) == 0 and int(v.last_rejected[0]) == 1 and not bool(v.is_bonus[0])
    else:
        assert v.path[0].tolist() == [1] and int(v.last_rejected[0]) == -1


def test_a_sibling_outside_the_residual_is_never_pardoned():
    p = _t([0.5, 0.5, 0.0])
    tp = torch.stack([p, p, p])[None]
    dp = torch.stack([_t([0.2, 0.8, 0.0]), _t([0.0, 0.0, 1.0])])[None]
    # rank 0 (token 1, ratio 0.625) fails U = 0.9 even with tol 0.25; the residual is all on token 0
    v = verify_tree(tp, dp, torch.tensor([[1, 2]]), [-1, -1], EARSRule(0.5),
                    uniforms=_t([[0.9, 0.0]]), sample_uniforms=_t([0.99]))
    assert v.kinds[0].tolist() == [REJ, REJ] and int(v.next_token[0]) == 0


def test_greedy_takes_the_deepest_path_of_target_argmaxes():
    v_ = 5
    tp = torch.full((1, 6, v_), 0.1)
    for entry, top in enumerate([2, 3, 1, 4, 0, 0]):
        tp[0, entry, top] = 0.6
    # root -> {0: tok 4, 1: tok 2}; node 1 -> {2: tok 1, 3: tok 3}; node 3 -> {4: tok 4}
    parents, toks = [-1, -1, 1, 1, 3], torch.tensor([[4, 2, 3, 1, 0]])
    dp = torch.full((1, 5, v_), 0.2)
    v = verify_tree(tp, dp, toks, parents, GreedyRule())
    assert v.path[0].tolist() == [1, 3, 4] and v.kinds[0].tolist() == [REJ, ACC, REJ, ACC, ACC]
    assert int(v.next_token[0]) == 0 and bool(v.is_bonus[0])  # the argmax after node 4


def test_an_empty_tree_is_one_target_draw():
    tp = _t([[[0.2, 0.8]]])
    v = verify_tree(tp, torch.empty(1, 0, 2), torch.empty(1, 0, dtype=torch.long), [], StandardRule(),
                    sample_uniforms=_t([0.5]), with_distortion=True)
    assert int(v.num_accepted[0]) == 0 and int(v.next_token[0]) == 1 and bool(v.is_bonus[0])
    assert float(v.next_q[0]) == 0.0


def test_bad_shapes_are_explained():
    with pytest.raises(ValueError, match="parents"):
        verify_tree(torch.rand(1, 3, 4), torch.rand(1, 2, 4), torch.zeros(1, 2, dtype=torch.long), [-1, 1], StandardRule())
    with pytest.raises(ValueError, match="N\\+1"):
        verify_tree(torch.rand(1, 2, 4), torch.rand(1, 2, 4), torch.zeros(1, 2, dtype=torch.long), [-1, 0], StandardRule())


# ----------------------------------------------------------------------------- synthetic trees


def markov(v, seed, sharp=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(v, v, generator=g), -1)  # (V, V): row = previous token


def near(T, noise, seed):
    """A draft that agrees with T often: its log-probabilities plus seeded noise."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(T.log() + noise * torch.randn(T.shape, generator=g), -1)


def sample_trees(T, Q, parents, b, seed, fixed=False, random_roots=False):
    """B trees of one shape: tokens (B, N), target (B, N+1, V), draft (B, N, V). The root's
    token is 0, or drawn per row."""
    g = torch.Generator().manual_seed(seed)
    v, n = T.shape[0], len(parents)
    kids = [[i for i, p in enumerate(parents) if p == e - 1] for e in range(n + 1)]
    tokens = torch.zeros(b, n, dtype=torch.long)
    draft = torch.zeros(b, n, v)
    root = torch.randint(0, T.shape[0], (b,), generator=g) if random_roots else torch.zeros(b, dtype=torch.long)
    entry_tok = [root]
    for e in range(n + 1):
        if e > 0:
            entry_tok.append(tokens[:, e - 1])
        if not kids[e]:
            continue
        q = Q[entry_tok[e]]  # (B, V)
        m = len(kids[e])
        if fixed:
            drawn = torch.sort(q, dim=-1, descending=True, stable=True).indices[:, :m]
        else:
            drawn = torch.multinomial(q, m, replacement=False, generator=g)  # ordered, without replacement
        left = q.clone()
        for j, node in enumerate(kids[e]):
            tokens[:, node] = drawn[:, j]
            if fixed:
                draft[:, node] = torch.nn.functional.one_hot(drawn[:, j], v).float()
            else:
                draft[:, node] = left / left.sum(-1, keepdim=True)
                left = left.scatter(-1, drawn[:, j : j + 1], 0.0)
    target = T[torch.stack(entry_tok, 1)]  # (B, N+1, V)
    return tokens, target, draft, g


def emitted(v_, tokens, b):
    """Token emitted at positions 0, 1, 2 per row (-1 where the round ended before)."""
    n = v_.num_accepted
    out = []
    for pos in range(3):
        acc = tokens.gather(1, v_.path[:, min(pos, v_.path.shape[1] - 1)].clamp(min=0)[:, None])[:, 0]
        tok = torch.where(n > pos, acc, v_.next_token)
        out.append(torch.where(n >= pos, tok, -1))
    return out


def chisq(counts, probs):
    """p-value of counts against probs (renormalised in float64)."""
    probs = np.asarray(probs, dtype=np.float64)
    return stats.chisquare(counts, probs / probs.sum() * counts.sum()).pvalue


def pooled_chisquare(prev, cur, T):
    """Chi-squared of cur | prev against T[prev], pooled over prev; -> p-value."""
    stat, df = 0.0, 0
    for a in range(T.shape[0]):
        sel = cur[prev == a]
        if len(sel) < 50:
            continue
        obs = np.bincount(sel, minlength=T.shape[0])
        exp = T[a].double().numpy() / float(T[a].double().sum()) * len(sel)
        stat += float(((obs - exp) ** 2 / exp).sum())
        df += T.shape[0] - 1
    return stats.chi2.sf(stat, df)


# ----------------------------------------------------------------------------- scripted draws


def reference_row(tp, dp, toks, parents, u, su, rule):
    """One tree, one test at a time, in float64 Python."""
    kids = [[i for i, p in enumerate(parents) if p == e - 1] for e in range(len(parents) + 1)]
    kinds, path, entry = [NOT] * len(parents), [], 0
    while True:
        at = tp[entry].double().numpy()
        res, tol, moved = at.copy(), (rule.beta * (1 - at.max()) if isinstance(rule, EARSRule) else 0.0), False
        for c in kids[entry]:
            x, q = int(toks[c]), float(dp[c, int(toks[c])])
            r = res[x] / max(q, 1e-10)
            if isinstance(rule, GreedyRule):
                ok_std = ok_all = x == int(np.argmax(res))
            else:
                ok_std, ok_all = res[x] > 0 and r >= u[c], res[x] > 0 and r >= max(u[c] - tol, 0.0)
            if ok_std or ok_all:
                kinds[c], moved = (ACC if ok_std else PAR), True
                path.append(c)
                entry = c + 1
                break
            kinds[c] = REJ
            if isinstance(rule, GreedyRule):
                continue
            rr = np.maximum(res - dp[c].double().numpy(), 0)
            res = rr / rr.sum() if rr.sum() > 1e-6 else res
        if not moved:
            dist = res if kids[entry] else at
            break
    if isinstance(rule, GreedyRule):
        nxt = int(np.argmax(dist))
    else:
        cdf = np.cumsum(dist)
        nxt = int((cdf <= su[len(path)] * cdf[-1]).sum())
    return path, kinds, nxt


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(0.4), GreedyRule()], ids=repr)
@pytest.mark.parametrize("fixed", [False, True], ids=["sampled", "fixed"])
def test_decisions_match_a_plain_loop_on_scripted_draws(rule, fixed):
    b = 400
    T = markov(7, 1, 2.0)
    tokens, target, draft, g = sample_trees(T, near(T, 1.8, 2), PARENTS, b, seed=3, fixed=fixed, random_roots=True)
    u, su = torch.rand(b, len(PARENTS), generator=g), torch.rand(b, 4, generator=g)
    v = verify_tree(target, draft, tokens, PARENTS, rule, uniforms=u, sample_uniforms=su)
    lengths = set()
    for row in range(b):
        path, kinds, nxt = reference_row(target[row], draft[row], tokens[row], PARENTS, u[row].tolist(),
                                         su[row].tolist(), rule)
        assert v.path[row, : len(path)].tolist() == path and int(v.num_accepted[row]) == len(path), row
        assert v.kinds[row].tolist() == kinds, row
        assert int(v.next_token[row]) == nxt, row
        lengths.add(len(path))
    # rows stop at several depths (a fixed greedy tree has one outcome per root token)
    assert len(lengths) >= (2 if fixed and isinstance(rule, GreedyRule) else 3)
    assert (v.kinds == PAR).any() == (isinstance(rule, EARSRule))


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(0.3), GreedyRule()], ids=repr)
def test_a_chain_shaped_tree_decides_as_verify(rule):
    b, k, v_ = 300, 4, 9
    g = torch.Generator().manual_seed(7)
    t = torch.softmax(2 * torch.randn(b, k + 1, v_, generator=g), -1)
    d = torch.softmax(t[:, :k].log() + torch.randn(b, k, v_, generator=g), -1)
    toks = torch.multinomial(d.reshape(-1, v_), 1, generator=g).reshape(b, k)
    u, su = torch.rand(b, k, generator=g), torch.rand(b, k + 1, generator=g)
    chain = verify(t, d, toks, rule, uniforms=u, sample_uniforms=su, with_distortion=True)
    tree = verify_tree(t, d, toks, [-1, 0, 1, 2], rule, uniforms=u, sample_uniforms=su, with_distortion=True)
    assert torch.equal(tree.num_accepted, chain.num_accepted) and torch.equal(tree.kinds, chain.kinds)
    assert torch.equal(tree.next_token, chain.next_token) and torch.equal(tree.is_bonus, chain.is_bonus)
    assert torch.allclose(tree.next_q, chain.next_q) and torch.allclose(tree.next_p, chain.next_p)
    # per emitted position the tree's distortion is the chain's (exact: one child per entry)
    n = chain.num_accepted
    pos = torch.arange(k + 1)[None]
    drafted = (pos < k) & ((pos < n[:, None]) | ((pos == n[:, None]) & ~chain.is_bonus[:, None]))
    expected = torch.where(drafted, torch.nn.functional.pad(chain.distortion, (0, 1)), 0.0).double()
    assert bool(tree.distortion_exact.all())
    assert torch.allclose(torch.where(pos <= n[:, None], tree.distortion, 0.0), expected, atol=1e-5)


# ----------------------------------------------------------------------------- distributions

N_DRAWS = 40_000


@pytest.mark.parametrize("fixed", [False, True], ids=["sampled", "fixed"])
def test_the_ordinary_rule_on_a_tree_emits_p_target_at_every_depth(fixed):
    T = markov(8, 11)
    tokens, target, draft, g = sample_trees(T, near(T, 1.5, 12), PARENTS, N_DRAWS, seed=13, fixed=fixed)
    v = verify_tree(target, draft, tokens, PARENTS, StandardRule(), generator=g)
    y0, y1, y2 = emitted(v, tokens, N_DRAWS)
    c = np.bincount(y0.numpy(), minlength=8)
    assert chisq(c, T[0]) > 1e-3
    assert 0.5 * np.abs(c / N_DRAWS - T[0].numpy()).sum() < 0.01
    reach1, reach2 = y1 >= 0, y2 >= 0
    assert reach1.sum() > 10_000 and reach2.sum() > 5_000, (reach1.sum(), reach2.sum())
    assert pooled_chisquare(y0[reach1].numpy(), y1[reach1].numpy(), T) > 1e-3
    assert pooled_chisquare(y1[reach2].numpy(), y2[reach2].numpy(), T) > 1e-3
    # siblings were used: some rounds stood on a rank > 0 child
    ranks = torch.tensor([0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 1])
    assert (ranks[v.path[v.path >= 0]] > 0).float().mean() > 0.2


def test_the_test_has_power_against_ignoring_the_removed_siblings():
    # Testing every sibling against the full draft distribution (as if drawn with replacement)
    # while they were drawn without replacement is not lossless; the chi-squared test sees it.
    T, Q = markov(8, 11), markov(8, 12, 1.5)
    tokens, target, draft, g = sample_trees(T, Q, PARENTS, N_DRAWS, seed=13)
    wrong = draft.clone()
    for kids in ([0, 1, 2], [3, 4], [6, 7, 8, 9], [10, 11]):
        wrong[:, kids] = draft[:, kids[:1]]  # (B, 1, V) broadcast to every sibling
    v = verify_tree(target, wrong, tokens, PARENTS, StandardRule(), generator=g)
    y0 = emitted(v, tokens, N_DRAWS)[0]
    assert chisq(np.bincount(y0.numpy(), minlength=8), T[0]) < 1e-6


P = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
Q = np.array([0.10, 0.35, 0.05, 0.30, 0.15, 0.05])


def exact_ears_tree(p, q, beta, m, fixed):
    """The first token's distribution when the root has m children, from the definition: every
    ordered draw of distinct siblings (or the draft's top m), each tested against the residual."""
    tol = beta * (1 - p.max())
    orders = [tuple(np.argsort(-q, kind="stable")[:m])] if fixed else itertools.permutations(range(len(p)), m)
    out = np.zeros_like(p)
    for xs in orders:
        w, left = 1.0, q.copy()
        for x in xs:  # the probability of this order of draws
            w *= 1.0 if fixed else left[x] / left.sum()
            left[x] = 0
        res, reach, left = p.copy(), 1.0, q.copy()
        for x in xs:
            qi = np.eye(len(p))[x] if fixed else left / left.sum()
            a = min(1.0, res[x] / max(qi[x], 1e-10) + tol) if res[x] > 0 else 0.0
            out[x] += w * reach * a
            reach *= 1 - a
            rr = np.maximum(res - qi, 0)
            res = rr / rr.sum() if rr.sum() > 1e-6 else res
            left[x] = 0
        out += w * reach * res
    return out


@pytest.mark.parametrize("fixed", [False, True], ids=["sampled", "fixed"])
def test_ears_on_a_tree_emits_its_exact_enumerated_distribution(fixed):
    beta, m, v_ = 0.5, 3, len(P)
    expected = exact_ears_tree(P, Q, beta, m, fixed)
    assert abs(expected.sum() - 1) < 1e-9
    T = torch.tensor(np.tile(P, (v_, 1)), dtype=torch.float32)  # P at every entry
    Qm = torch.tensor(np.tile(Q, (v_, 1)), dtype=torch.float32)
    parents = [-1, -1, -1, 0, 0]  # the root's three children are what decides position 0
    tokens, target, draft, g = sample_trees(T, Qm, parents, N_DRAWS, seed=21, fixed=fixed)
    v = verify_tree(target, draft, tokens, parents, EARSRule(beta), generator=g)
    c = np.bincount(emitted(v, tokens, N_DRAWS)[0].numpy(), minlength=v_)
    assert chisq(c, expected) > 1e-3
    assert chisq(c, P) < 1e-10  # power: far from P_target
    tv = 0.5 * np.abs(expected - P).sum()
    assert tv > 0.02
    # the library's own enumeration, and the distortion it reports per emitted position
    lib = node_emitted_distribution(EARSRule(beta), target[0, 0], tokens[0, :3], draft[0, :3],
                                    torch.tensor(beta * (1 - P.max())), "fixed" if fixed else "sampled")
    assert np.allclose(lib.numpy(), expected, atol=1e-6)
    few = verify_tree(target[:20], draft[:20], tokens[:20], parents, EARSRule(beta), uniforms=torch.rand(20, 5),
                      with_distortion=True, siblings="fixed" if fixed else "sampled")
    assert bool(few.distortion_exact.all())
    assert np.allclose(few.distortion[:, 0].numpy(), tv, atol=1e-5)


def test_distortion_is_zero_for_the_ordinary_rule_and_bounded_when_too_many_orders():
    v_ = 50
    T = markov(v_, 31, 1.0)
    tokens, target, draft, g = sample_trees(T, markov(v_, 32), [-1] * 3, 4, seed=5)
    std = verify_tree(target, draft, tokens, [-1] * 3, StandardRule(), generator=g, with_distortion=True)
    assert float(std.distortion.abs().max()) == 0.0 and bool(std.distortion_exact.all())
    rule, tol = EARSRule(0.3), torch.tensor(0.3 * (1 - float(T[0].max())))
    exact = node_emitted_distribution(rule, target[0, 0], tokens[0], draft[0], tol, "sampled")
    assert exact is not None  # 50 x 49 orders of the first two x 50 tokens is enumerable
    assert node_emitted_distribution(rule, target[0, 0], tokens[0], draft[0], tol, "sampled", max_states=10_000) is None
    # past the limit: the coupling bound, which is at least the exact value
    import ears_core.rules.tree_distortion as vt

    tv = float(0.5 * (exact - target[0, 0].double()).abs().sum())
    old = vt.MAX_STATES
    try:
        vt.MAX_STATES = 10_000
        bound = verify_tree(target, draft, tokens, [-1] * 3, rule, generator=g, with_distortion=True)
    finally:
        vt.MAX_STATES = old
    assert not bool(bound.distortion_exact[0, 0]) and tv - 1e-9 <= float(bound.distortion[0, 0]) <= 1.0


@pytest.mark.parametrize("siblings", ["sampled", "fixed"])
def test_distortion_over_the_drafts_support_equals_the_full_enumeration(siblings):
    """verify_tree(draft_support=...) enumerates a ratio rule's emission over the draft's N tokens and
    one bucket for the rest: the same distortion as over all V, to float rounding."""
    v_ = 60
    support = torch.arange(0, v_, 4)  # the draft proposes every fourth token only
    T = markov(v_, 41, 1.0)
    Q = torch.zeros(v_, v_)
    Q[:, support] = torch.softmax(torch.randn(v_, len(support), generator=torch.Generator().manual_seed(42)), dim=-1)
    parents = [-1, -1, -1, 0, 0, 3]
    tokens, target, draft, g = sample_trees(T, Q, parents, 40, seed=9, fixed=siblings == "fixed")
    kw = dict(uniforms=torch.rand(40, len(parents), generator=g), sample_uniforms=torch.rand(40, generator=g),
              with_distortion=True, siblings=siblings)
    full = verify_tree(target, draft, tokens, parents, EARSRule(0.4), **kw)
    lean = verify_tree(target, draft, tokens, parents, EARSRule(0.4), draft_support=support, **kw)
    assert bool(full.distortion_exact.all()) and bool(lean.distortion_exact.all())
    assert torch.allclose(full.distortion, lean.distortion, atol=1e-6)
    assert float(full.distortion[:, 0].max()) > 0.01  # position 0 has three children: enumerated
    assert torch.equal(full.next_token, lean.next_token) and torch.equal(full.kinds, lean.kinds)


def test_the_bound_over_the_drafts_support_equals_the_bound_over_the_vocabulary(monkeypatch):
    """Past the enumeration limit a ratio rule's distortion is the coupling bound; with the draft's
    support given it is counted and computed over those tokens only, to the same value."""
    import ears_core.rules.tree_distortion as vt

    monkeypatch.setattr(vt, "MAX_STATES", 200)  # 3 sampled siblings over 60 tokens: past it either way
    v_ = 60
    support = torch.arange(0, v_, 4)
    Q = torch.zeros(v_, v_)
    Q[:, support] = torch.softmax(torch.randn(v_, len(support), generator=torch.Generator().manual_seed(6)), dim=-1)
    parents = [-1, -1, -1]
    tokens, target, draft, g = sample_trees(markov(v_, 5, 1.0), Q, parents, 30, seed=2)
    kw = dict(uniforms=torch.rand(30, 3, generator=g), sample_uniforms=torch.rand(30, generator=g), with_distortion=True)
    full = verify_tree(target, draft, tokens, parents, EARSRule(0.4), **kw)
    lean = verify_tree(target, draft, tokens, parents, EARSRule(0.4), draft_support=support, **kw)
    emitted = ~full.is_bonus  # position 0 emits a resampled token or an accepted child's
    assert not bool(full.distortion_exact[:, 0].any()) and not bool(lean.distortion_exact[:, 0].any())
    assert torch.allclose(full.distortion[:, 0], lean.distortion[:, 0], atol=1e-6)
    assert float(full.distortion[:, 0].max()) > 0.05 and bool(emitted.any())


# ----------------------------------------------------------------------------- input checks


def _two_children(first_token):
    """A root with two children; token 0 is P_target's favourite (an unchecked -1 read as token 0 would stand)."""
    p = _t([0.9, 0.05, 0.05])
    tp = torch.stack([p, p, p])[None]  # (1, 3, V)
    dp = torch.stack([_t([0.9, 0.05, 0.05]), _t([0.0, 0.5, 0.5])])[None]  # (1, 2, V)
    return tp, dp, torch.tensor([[first_token, 1]])


@pytest.mark.parametrize("walk", [False, True], ids=["verify_tree", "walk_tree"])
@pytest.mark.parametrize("bad", [-1, 3])
def test_a_draft_id_outside_the_vocabulary_is_a_value_error_naming_it(walk, bad):
    from ears_core.decode.tree_walk import walk_tree
    tp, dp, toks = _two_children(bad)
    fn = walk_tree if walk else verify_tree
    with pytest.raises(ValueError, match=rf"draft token id {bad} .* outside the vocabulary \[0, 3\)"):
        fn(tp, dp, toks, [-1, -1], StandardRule(), uniforms=_t([[0.5, 0.5]]), sample_uniforms=_t([0.5]))


@pytest.mark.parametrize("walk", [False, True], ids=["verify_tree", "walk_tree"])
def test_a_drafted_token_with_draft_probability_0_is_a_value_error(walk):
    from ears_core.decode.tree_walk import walk_tree
    tp, dp, _ = _two_children(0)
    toks = torch.tensor([[0, 0]])  # rank 1 drew token 0, where its distribution has q = 0
    fn = walk_tree if walk else verify_tree
    with pytest.raises(ValueError, match="draft token 0 at row 0, position 1 has draft probability 0"):
        fn(tp, dp, toks, [-1, -1], EARSRule(0.2), uniforms=_t([[0.5, 0.5]]), sample_uniforms=_t([0.5]))


@pytest.mark.parametrize("walk", [False, True], ids=["verify_tree", "walk_tree"])
@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(1.0), GreedyRule()], ids=["standard", "ears", "greedy"])
def test_unchecked_an_out_of_range_id_is_rejected_never_read_as_token_0(walk, rule):
    from ears_core.decode.tree_walk import walk_tree
    tp, dp, toks = _two_children(-1)
    fn = walk_tree if walk else verify_tree
    v = fn(tp, dp, toks, [-1, -1], rule, uniforms=_t([[0.01, 0.999]]), sample_uniforms=_t([0.5]), check=False)
    assert v.kinds[0, 0].item() == REJ and float(v.p[0, 0]) == 0.0  # token 0 (p = 0.9, U = 0.01) would stand
    assert 0 not in v.path[0].tolist()


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(1.0), GreedyRule()], ids=["standard", "ears", "greedy"])
def test_verify_unchecked_rejects_an_out_of_range_id_too(rule):
    p = _t([0.9, 0.05, 0.05])
    v = verify(torch.stack([p, p])[None], _t([[0.9, 0.05, 0.05]])[None], torch.tensor([[-1]]), rule,
               uniforms=_t([[0.01]]), sample_uniforms=_t([0.5]), check=False)
    assert int(v.num_accepted[0]) == 0 and v.kinds[0, 0].item() == REJ and float(v.p[0, 0]) == 0.0
