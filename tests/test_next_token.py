"""decode/next_token.py: the token after the drafts is one inverse-CDF draw on every path. Known answers by hand, the
empty residual's fallback really drawn, and the host chain (verify), the device chain (device_verify), the host trees
(verify_tree, walk_tree) and the device tree (device_walk) giving the same token for the same draw, for every rule, on
float32 probabilities with awkward sums and draws that sit on a bucket's edge."""

from __future__ import annotations

import pytest
import torch

from ears_core.decode.device_round import device_verify
from ears_core.decode.device_walk import device_walk
from ears_core.decode.next_token import draw_after
from ears_core.decode.tree_walk import walk_tree
from ears_core.decode.verify import decide_drafts, verify
from ears_core.decode.verify_tree import children, depths, verify_tree
from ears_core.rules import RULES, AcceptanceRule, EARSRule, GreedyRule, StandardRule, TypicalRule, make_rule

RULE_PARAMS = dict(beta=0.4, epsilon=0.05, gate=0.2, window=1)  # loose enough that rules pardon
SHAPES = [[-1, -1, -1], [-1, -1, -1, 0, 0, 3], [-1, 0, 1, 2], [-1, -1, 0, 0, 1, 2, 4]]


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """Written out: the first token whose float32 cumulative mass is above u times the total (the last token with
    mass where u times the total rounds up to it)."""
    cdf = probs.float().cumsum(0)
    bar = float(torch.tensor(u, dtype=torch.float32) * cdf[-1])
    above = [i for i in range(len(cdf)) if float(cdf[i]) > bar]
    return above[0] if above else int(probs.nonzero()[-1])


def law_after_rejection(rule, faced: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(V,) the unnormalised law a rejection draws from, by rule: the argmax (greedy), P_target (typical), else
    max(0, faced - q), or faced itself where that has no mass (the fallback: rules/base.py, RESIDUAL_EPS)."""
    if rule.argmax_only:
        return torch.zeros_like(faced).scatter_(0, faced.argmax().view(1), 1.0)
    if type(rule).residual is TypicalRule.residual:
        return faced
    res = (faced - q).clamp(min=0.0)
    return faced if float(res.cumsum(0)[-1]) <= 1e-6 else res


def edge_draw(law: torch.Tensor, gen: torch.Generator) -> float:
    """A draw on the edge of one of ``law``'s buckets: cdf[i] / total in float32, or the float next to it."""
    cdf = law.float().cumsum(0)
    inner = [i for i in range(len(cdf) - 1) if 0 < float(cdf[i]) < float(cdf[-1])]
    if not inner:
        return float(torch.rand((), generator=gen))
    i = inner[int(torch.randint(len(inner), (), generator=gen))]
    u = (cdf[i] / cdf[-1]).float()
    step = int(torch.randint(3, (), generator=gen)) - 1  # -1, 0, +1 ulp
    if step:
        u = torch.nextafter(u, torch.tensor(1.0 if step > 0 else 0.0))
    return min(float(u), 1 - 2**-24)


def awkward(logits: torch.Tensor, gen: torch.Generator, top_k: int | None = None) -> torch.Tensor:
    """float32 probabilities whose rows do not sum to 1 (a factor 1 +- 1%), with top-k zeros if asked."""
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return probs * (1 + 0.01 * torch.randn(*probs.shape[:-1], 1, generator=gen))


def test_the_draw_after_a_rejection_is_the_inverse_cdf_of_the_residual_by_hand():
    p, q = torch.tensor([0.1, 0.4, 0.2, 0.3]), torch.tensor([0.3, 0.1, 0.2, 0.4])  # residual [0, .3, 0, 0]
    rule = StandardRule()
    assert [int(draw_after(rule, p, q, False, torch.tensor(u))) for u in (0.0, 0.5, 0.999)] == [1, 1, 1]
    p2, q2 = torch.tensor([0.5, 0.0, 0.3, 0.2]), torch.tensor([0.1, 0.2, 0.3, 0.4])  # residual [.4, 0, 0, 0]
    assert int(draw_after(rule, p2, q2, False, torch.tensor(0.9))) == 0
    # p == q: no residual mass, so P_target itself, buckets .1 | .4 | .2 | .3
    assert [int(draw_after(rule, p, p.clone(), False, torch.tensor(u))) for u in (0.05, 0.3, 0.6, 0.95)] == [0, 1, 2, 3]
    assert int(draw_after(rule, p, None, True, torch.tensor(0.55))) == 2  # a bonus: P_target's CDF .1 .5 .7 1
    rows = draw_after(rule, torch.stack([p, p]), torch.stack([q, q]), torch.tensor([False, True]),
                      torch.tensor([0.5, 0.55]))
    assert rows.tolist() == [1, 2]  # a residual row and a bonus row in one call
    assert int(draw_after(TypicalRule(), p, q, False, torch.tensor(0.55))) == 2  # typical: P_target itself
    assert int(draw_after(GreedyRule(), p, q, False, torch.tensor(0.99))) == 1  # greedy: the argmax
    assert int(draw_after(EARSRule(0.3), p, q, False, torch.tensor(0.0))) == 1  # EARS: the ordinary residual


EMPTY_P = [0.1, 0.4, 0.2, 0.3, 0.0]  # P_target where q == p; the drafted token 4 has p = q = 0


@pytest.mark.parametrize("name", list(RULES))
def test_an_empty_residual_draws_from_p_target_on_every_path(name):
    """q == p at the rejected position (the drafted id has p = q = 0, so every rule rejects it; unchecked, as the
    guard refuses q = 0): max(0, p - q) is empty and the fallback P_target is drawn, its CDF .1 .5 .7 1 at U = 0.6:
    token 2 (greedy: the argmax, 1). The same on the host and device chains and trees."""
    want = 1 if name == "greedy" else 2
    p = torch.tensor(EMPTY_P)
    bonus = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0])
    target, draft, tokens = torch.stack([p, bonus])[None], p[None, None].clone(), torch.tensor([[4]])
    rule = lambda: make_rule(name, **RULE_PARAMS)  # noqa: E731  fresh: the budget keeps state
    u, su = torch.tensor([[0.3]]), torch.tensor([[0.6, 0.6]])
    for emitted_only in (False, True):
        v = verify(target, draft, tokens, rule(), uniforms=u, sample_uniforms=su, check=False,
                   emitted_only=emitted_only)
        assert v.num_accepted.tolist() == [0] and v.next_token.tolist() == [want]
    assert device_verify(target, draft, tokens, rule(), u, su).next_token.tolist() == [want]
    for walk in (verify_tree, walk_tree, device_walk):
        kw = dict(check=False) if walk is not device_walk else {}
        v = walk(target, draft, tokens, [-1], rule(), uniforms=u, sample_uniforms=su, **kw)
        assert v.num_accepted.tolist() == [0] and not bool(v.is_bonus[0]) and v.next_token.tolist() == [want], walk


def chain_case(seed: int, name: str, b: int = 6, k: int = 4, v: int = 40):
    """Rows of K drafts with awkward float32 sums, and per row a draw for the next token on a bucket's edge of the
    law it is drawn from (found by the decisions first). -> inputs, the draws, the tokens by hand."""
    gen = torch.Generator().manual_seed(seed)
    t_logits = 3 * torch.randn(b, k + 1, v, generator=gen)
    target = awkward(t_logits, gen, top_k=12 if seed % 2 else None)  # (B, K+1, V)
    draft = awkward(t_logits[:, :k] + torch.randn(b, k, v, generator=gen), gen)  # (B, K, V)
    tokens = torch.multinomial(draft.reshape(-1, v), 1, generator=gen).reshape(b, k)
    u = torch.rand(b, k, generator=gen)
    n = decide_drafts(target, draft, tokens, make_rule(name, **RULE_PARAMS), u, check=False).num_accepted.tolist()
    su, want = torch.rand(b, k + 1, generator=gen), []
    rule = make_rule(name, **RULE_PARAMS)
    for r, nr in enumerate(n):
        if nr == k:
            law = torch.zeros(v).scatter_(0, target[r, k].argmax().view(1), 1.0) if rule.argmax_only else target[r, k]
        else:
            law = law_after_rejection(rule, target[r, nr], draft[r, nr])
        su[r, nr] = edge_draw(law, gen)
        want.append(inverse_cdf(law, float(su[r, nr])))
    return target, draft, tokens, u, su, want


@pytest.mark.parametrize("name", list(RULES))
def test_the_host_and_device_chains_draw_the_same_next_token(name):
    """verify() (all rows at once, and row by row as the CPU loop has it) and device_verify emit the token by hand
    for the same draws: 12 seeds x 6 rows, draws on bucket edges where a normalised residual's rounding differs."""
    for seed in range(12):
        target, draft, tokens, u, su, want = chain_case(seed, name)
        got = [verify(target, draft, tokens, make_rule(name, **RULE_PARAMS), uniforms=u, sample_uniforms=su,
                      check=False, emitted_only=e).next_token.tolist() for e in (False, True)]
        got.append(device_verify(target, draft, tokens, make_rule(name, **RULE_PARAMS), u, su).next_token.tolist())
        assert got == [want] * 3, (seed, got, want)


def tree_case(seed: int, parents: list[int], b: int = 8, v: int = 30):
    """b random trees of one shape, awkward float32 sums, tokens drawn from each node's draft."""
    gen = torch.Generator().manual_seed(seed)
    n = len(parents)
    t_logits = 2 * torch.randn(b, n + 1, v, generator=gen)
    target = awkward(t_logits, gen, top_k=10 if seed % 2 else None)  # (B, N+1, V)
    entry = torch.tensor([p + 1 for p in parents])
    draft = awkward(t_logits[:, entry] + torch.randn(b, n, v, generator=gen), gen)  # (B, N, V)
    tokens = torch.multinomial(draft.reshape(-1, v), 1, generator=gen).reshape(b, n)
    return target, draft, tokens, torch.rand(b, n, generator=gen), gen


def stop_law(rule, target, draft, parents, r: int, verdict) -> torch.Tensor:
    """(V,) the law row r's next token is drawn from where the walk stopped, by hand: P_target at a leaf (the bonus;
    greedy: its argmax), else the rejection law after every child of the stop entry, each sibling facing the
    residual its earlier siblings left (rule.residual)."""
    n_acc = int(verdict.num_accepted[r])
    cur = 0 if n_acc == 0 else int(verdict.path[r, n_acc - 1]) + 1
    at = target[r, cur]
    if bool(verdict.is_bonus[r]):
        return law_after_rejection(rule, at, at) if rule.argmax_only else at
    kids = children(parents)[cur]
    faced = at
    for c in kids[:-1]:
        faced = rule.residual(faced, draft[r, c])
    return law_after_rejection(rule, faced, draft[r, kids[-1]])


@pytest.mark.parametrize("parents", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(RULES))
def test_the_host_and_device_trees_draw_the_same_next_token(name, parents):
    """verify_tree, walk_tree and device_walk emit the token by hand for the same draws (draws on bucket edges of the
    law at each row's stop), 4 seeds x 8 rows per shape."""
    rule = lambda: make_rule(name, **RULE_PARAMS)  # noqa: E731
    stops = set()
    for seed in range(4):
        target, draft, tokens, u, gen = tree_case(seed, parents)
        su = torch.rand(target.shape[0], max(depths(parents)) + 1, generator=gen)  # (B, D+1)
        first = device_walk(target, draft, tokens, parents, rule(), uniforms=u, sample_uniforms=su)
        want = []
        for r in range(target.shape[0]):
            law = stop_law(rule(), target, draft, parents, r, first)
            n_acc = int(first.num_accepted[r])
            su[r, n_acc] = edge_draw(law, gen)
            want.append(inverse_cdf(law, float(su[r, n_acc])))
            stops.add(bool(first.is_bonus[r]))
        for walk in (verify_tree, walk_tree, device_walk):
            v = walk(target, draft, tokens, parents, rule(), uniforms=u, sample_uniforms=su)
            assert torch.equal(v.num_accepted, first.num_accepted), walk
            assert v.next_token.tolist() == want, (walk, seed)
    assert stops == {True, False} or name == "typical"  # rows that stop on a rejection, rows that reach a leaf


def test_a_rule_with_a_residual_of_its_own_searches_that_residual():
    """next_mass of a rule that overrides residual is that residual after a rejection (typical: P_target), the
    ratio rule's is max(0, p - q) unnormalised, and both give the bonus (P_target) where a row is one; a
    residual with no mass falls back to P_target."""
    p, q = torch.tensor([[0.1, 0.4, 0.2, 0.3]] * 2), torch.tensor([[0.3, 0.1, 0.2, 0.4]] * 2)
    rejected, bonus = torch.tensor([False, True]), p[0]
    assert torch.equal(TypicalRule().next_mass(p, q, rejected), p)
    assert torch.allclose(AcceptanceRule().next_mass(p, q, rejected)[0], torch.tensor([0.0, 0.3, 0.0, 0.0]))
    assert torch.equal(AcceptanceRule().next_mass(p, q, rejected)[1], bonus)
    assert torch.equal(AcceptanceRule().next_mass(p, p, rejected)[0], bonus)  # nothing left: P_target
    assert torch.equal(GreedyRule().next_mass(p, q, rejected), torch.tensor([[0.0, 1.0, 0.0, 0.0]] * 2))
