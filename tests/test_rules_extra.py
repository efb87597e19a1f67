"""The comparison rules: typical acceptance (Medusa) and the entropy-based EARS tolerance."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import PROMPTS
from ears_core import DraftKind, EARSRule, EntropyEARSRule, StandardRule, TypicalRule, generate, verify
from test_verify_distribution import P, Q, counts, emitted_tokens

A, PAR, R = int(DraftKind.ACCEPTED), int(DraftKind.PARDONED), int(DraftKind.REJECTED)
T0 = [0.25, 0.5, 0.125, 0.125]
D0 = [0.5, 0.25, 0.25, 0.0]
PEAKED = [0.9, 0.05, 0.05, 0.0]  # entropy 0.394 nats: threshold min(0.09, 0.3 e^-0.394 = 0.202) = 0.09


def one(t, d, tok, rule, u, su=0.0):
    return verify(torch.tensor([t]), torch.tensor([d]), torch.tensor([tok]), rule,
                  uniforms=torch.tensor([u]), sample_uniforms=torch.tensor([su]), with_distortion=True)


def test_typical_threshold_and_kinds():
    rule = TypicalRule(eps=0.09, delta=0.3)
    # T0 has entropy 1.213 nats -> threshold 0.3 * e^-1.213 = 0.0892; p = 0.25 stands.
    assert one([T0, T0], [D0], [0], rule, [0.3]).kinds.tolist() == [[A]]  # r = 0.5 >= U too
    assert one([T0, T0], [D0], [0], rule, [0.9]).kinds.tolist() == [[PAR]]  # only typical keeps it
    # PEAKED: token 1 (p = 0.05 < 0.09) is rejected whatever U is; the next token comes from P_target.
    v = one([PEAKED, PEAKED], [D0], [1], rule, [0.0], su=0.5)
    assert v.kinds.tolist() == [[R]] and v.next_token.tolist() == [0]
    assert one([PEAKED, PEAKED], [D0], [1], rule, [0.0], su=0.97).next_token.tolist() == [2]
    with pytest.raises(ValueError):
        TypicalRule(eps=0.0)


def test_entropy_tolerance_is_normalised_entropy():
    h = -sum(p * math.log(p) for p in T0)
    v = one([T0, T0], [D0], [0], EntropyEARSRule(0.25), [0.9])
    assert v.tolerance.item() == pytest.approx(0.25 * h / math.log(4), abs=1e-6)
    # r = 0.5 < U = 0.7 <= r + tol = 0.719: pardoned; EARS with 1 - max P would give tol 0.125: rejected.
    assert one([T0, T0], [D0], [0], EntropyEARSRule(0.25), [0.7]).kinds.tolist() == [[PAR]]
    assert EntropyEARSRule(0.0).lossless and not EntropyEARSRule(0.1).lossless


def exact_typical(p, q, eps=0.09, delta=0.3):
    h = -(p[p > 0] * np.log(p[p > 0])).sum()
    a = (p > min(eps, delta * np.exp(-h))).astype(float)
    return q * a + (1 - (q * a).sum()) * p


def exact_entropy_ears(p, q, beta):
    h = -(p[p > 0] * np.log(p[p > 0])).sum()
    tol = beta * h / np.log(len(p))
    a = np.where(p > 0, np.minimum(1.0, p / q + tol), 0.0)
    res = np.maximum(p - q, 0)
    return q * a + (1 - (q * a).sum()) * res / res.sum()


@pytest.mark.parametrize(
    "rule, expected",
    [(TypicalRule(), exact_typical(P, Q)), (EntropyEARSRule(0.3), exact_entropy_ears(P, Q, 0.3))],
    ids=["typical", "entropy"],
)
def test_emitted_distribution_matches_the_exact_formula(rule, expected):
    assert abs(expected.sum() - 1) < 1e-12
    tok, v = emitted_tokens(rule, seed=7)
    c = counts(tok)
    assert stats.chisquare(c, expected * c.sum()).pvalue > 1e-3
    tv = 0.5 * np.abs(expected - P).sum()
    assert tv > 0.01 and float(v.distortion[0, 0]) == pytest.approx(tv, abs=1e-5)
    assert stats.chisquare(c, P * c.sum()).pvalue < 1e-10  # and the test can tell it from P_target


@pytest.mark.parametrize("rule", [TypicalRule(), EntropyEARSRule(0.2)], ids=repr)
def test_new_rules_run_in_the_decoder(tiny_pair, rule):
    target, draft = tiny_pair
    out = generate(target, draft, PROMPTS[0], rule=rule, k=4, temperature=0.9, max_new_tokens=40, seed=0)
    assert len(out.token_ids) == 40 and out.stats.method == rule.describe()
    assert out.stats.mean_distortion > 0


@pytest.mark.parametrize("rule", [EARSRule(0.05), EARSRule(0.3), EARSRule(2.5), EntropyEARSRule(0.2), StandardRule()],
                         ids=repr)
def test_closed_form_distortion_equals_the_enumerated_one(rule):
    """A ratio rule's exact_distortion (closed form) against TV(rule.emitted, P_target), on supports
    cut by top-k on either side (p = 0 where the draft has mass and the other way round)."""
    g = torch.Generator().manual_seed(11)
    tp = torch.softmax(3 * torch.randn(64, 4, 50, generator=g), dim=-1)
    dp = torch.softmax(3 * torch.randn(64, 4, 50, generator=g), dim=-1)
    tp[:32] = tp[:32] * (tp[:32] >= tp[:32].topk(10, dim=-1).values[..., -1:])  # target cut by top-k
    dp[16:48] = dp[16:48] * (dp[16:48] >= dp[16:48].topk(7, dim=-1).values[..., -1:])  # draft cut
    tp, dp = tp / tp.sum(-1, keepdim=True), dp / dp.sum(-1, keepdim=True)
    tol = rule.tolerance(tp, tp.amax(dim=-1))  # (64, 4)
    closed = rule.exact_distortion(tp, dp, tol)
    enumerated = 0.5 * (rule.emitted(tp, dp, tol) - tp).abs().sum(dim=-1)
    assert torch.allclose(closed, enumerated, atol=2e-6)
    assert bool((closed <= tol + 1e-6).all())
    assert float(closed.max()) > (0.01 if tol.any() else -1) and (tol.any() or not closed.any())
