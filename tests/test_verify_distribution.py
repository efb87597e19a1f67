"""Distributions: many seeded draws through verify(), compared with the exact answer.

The expected EARS distribution is computed here from its definition, independently of the
library's own distortion code: a drafted x stands with probability a(x) = min(1, p/q + tol)
(0 where p = 0); otherwise the residual norm(max(0, p - q)) is sampled.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from ears_core import EARSRule, StandardRule, verify

N = 40_000
P = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])  # target, after temperature
Q = np.array([0.10, 0.35, 0.05, 0.30, 0.15, 0.05])  # draft: disagrees a lot


def exact_ears(p, q, beta):
    tol = beta * (1 - p.max())
    a = np.where(p > 0, np.minimum(1.0, p / np.maximum(q, 1e-10) + tol), 0.0)
    res = np.maximum(p - q, 0)
    res = res / res.sum()
    return q * a + (1 - (q * a).sum()) * res


def emitted_tokens(rule, k=1, seed=0, position=0):
    """Draw N rows of k drafts from Q, verify against P, return the token emitted at ``position``
    for the rows that reach it within the round."""
    g = torch.Generator().manual_seed(seed)
    t = torch.tensor(P, dtype=torch.float32).expand(N, k + 1, len(P)).contiguous()
    d = torch.tensor(Q, dtype=torch.float32).expand(N, k, len(Q)).contiguous()
    tokens = torch.multinomial(d.reshape(-1, len(Q)), 1, replacement=True, generator=g).reshape(N, k)
    v = verify(t, d, tokens, rule, generator=g, with_distortion=True)
    n = v.num_accepted
    reach = n >= position  # rows whose round emits a token at `position`
    tok = torch.where(n > position, tokens[:, min(position, k - 1)], v.next_token)
    return tok[reach].numpy(), v


def counts(tokens):
    return np.bincount(tokens, minlength=len(P))


def test_standard_rule_emits_the_target_distribution():
    tok, v = emitted_tokens(StandardRule(), seed=1)
    c = counts(tok)
    assert stats.chisquare(c, P * c.sum()).pvalue > 1e-3
    assert 0.5 * np.abs(c / c.sum() - P).sum() < 0.01
    assert float(v.distortion.max()) < 1e-6


def test_standard_rule_is_lossless_at_later_positions_too():
    # K = 3: the token emitted at position 2 (after two drafts stood) is also P-distributed.
    tok, _ = emitted_tokens(StandardRule(), k=3, seed=2, position=2)
    c = counts(tok)
    assert c.sum() > 5000
    assert stats.chisquare(c, P * c.sum()).pvalue > 1e-3


def test_ears_emits_its_exact_distorted_distribution():
    beta = 0.3
    expected = exact_ears(P, Q, beta)
    tol = beta * (1 - P.max())
    assert abs(expected.sum() - 1) < 1e-12
    tok, v = emitted_tokens(EARSRule(beta), seed=3)
    c = counts(tok)
    assert stats.chisquare(c, expected * c.sum()).pvalue > 1e-3
    assert 0.5 * np.abs(c / c.sum() - expected).sum() < 0.01
    # The test has power: the same counts are far from P_target.
    assert stats.chisquare(c, P * c.sum()).pvalue < 1e-10
    # The distortion verify() reports is the exact TV between the two.
    tv = 0.5 * np.abs(expected - P).sum()
    assert tv > 0.01
    assert float(v.distortion[0, 0]) == pytest.approx(tv, abs=1e-5)
    assert float(v.tolerance[0, 0]) == pytest.approx(tol, abs=1e-6)


def test_ears_acceptance_rate_matches_theory():
    beta = 0.3
    tol = beta * (1 - P.max())
    a = np.minimum(1.0, P / Q + tol)
    _, v = emitted_tokens(EARSRule(beta), seed=4)
    rate = v.num_accepted.float().mean().item()
    expected = float((Q * a).sum())
    sd = np.sqrt(expected * (1 - expected) / N)
    assert abs(rate - expected) < 4 * sd
    std_expected = float((Q * np.minimum(1.0, P / Q)).sum())
    assert expected > std_expected + 0.02  # EARS accepts measurably more
