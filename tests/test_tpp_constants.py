"""Rejection constants: closed forms with known answers, and every M checked against a dense grid of the
true ratio on its stated domain (an M below the supremum would make sampling inexact)."""

from __future__ import annotations

import math

import pytest
import torch

from ears_core.tpp.constants import envelope_constant, quad_sup, rejection_constant, with_heavy_tail

D = torch.distributions
torch.set_num_threads(1)


def dense_sup(target, proposal, lo, hi, n=400_001):
    """max of f_T / f_P on a dense grid inside [lo, hi] (float64)."""
    x = torch.linspace(float(lo), float(hi), n, dtype=torch.float64)[1:-1]
    return float(torch.exp(target.log_prob(x) - proposal.log_prob(x)).max())


def test_categorical_largest_ratio():
    r = rejection_constant(D.Categorical(probs=torch.tensor([0.5, 0.3, 0.2])),
                           D.Categorical(probs=torch.tensor([0.25, 0.5, 0.25])))
    assert float(r.M) == pytest.approx(2.0) and float(r.mass_outside) == 0


def test_categorical_zero_proposal_mass_has_no_bound():
    r = rejection_constant(D.Categorical(probs=torch.tensor([0.5, 0.5])), D.Categorical(probs=torch.tensor([1.0, 0.0])))
    assert math.isinf(float(r.M))


def test_exponential_falling_ratio_is_rate_ratio():
    # lambda_T > lambda_P: r(x) = 2 exp(-x) falls from its value 2 at x = 0 (the seed's sign is reversed)
    r = rejection_constant(D.Exponential(2.0), D.Exponential(1.0))
    assert float(r.M) == pytest.approx(2.0, rel=1e-3)
    assert float(r.mass_outside) == 0 and math.isinf(float(r.hi))
    assert float(r.M) >= dense_sup(D.Exponential(2.0), D.Exponential(1.0), 0, 50)


def test_exponential_rising_ratio_is_truncated_at_target_quantile():
    # lambda_T < lambda_P: r(x) = 0.5 exp(x) grows; truncate at the target's 99.9% quantile
    r = rejection_constant(D.Exponential(1.0), D.Exponential(2.0), alpha=1e-3)
    hi = -math.log(1e-3)
    assert float(r.hi) == pytest.approx(hi, rel=1e-5)
    assert float(r.M) == pytest.approx(0.5 * math.exp(hi), rel=1e-3)  # = 500
    assert float(r.mass_outside) == pytest.approx(1e-3)
    assert float(r.M) >= dense_sup(D.Exponential(1.0), D.Exponential(2.0), 0, float(r.hi))


def test_lognormal_stationary_point_is_the_maximum_when_target_narrower():
    mt, st, mp, sp = 0.0, 0.5, 0.3, 0.8
    t, p = D.LogNormal(mt, st), D.LogNormal(mp, sp)
    x_star = math.exp((mt * sp**2 - mp * st**2) / (sp**2 - st**2))
    expected = math.exp(float(t.log_prob(torch.tensor(x_star)) - p.log_prob(torch.tensor(x_star))))
    r = rejection_constant(t, p)
    assert float(r.M) == pytest.approx(expected, rel=1e-3)
    assert float(r.mass_outside) == 0 and float(r.M) >= dense_sup(t, p, 1e-6, 100)


def test_lognormal_wider_target_is_truncated_and_reports_mass():
    t, p = D.LogNormal(0.0, 0.9), D.LogNormal(0.3, 0.8)  # sigma_T > sigma_P: x* is a minimum, r unbounded
    r = rejection_constant(t, p, alpha=1e-3)
    assert float(r.mass_outside) == pytest.approx(1e-3)
    assert float(t.cdf(r.hi) - t.cdf(r.lo)) == pytest.approx(1 - 1e-3, abs=1e-5)
    assert float(r.M) >= dense_sup(t, p, r.lo, r.hi)


def test_quad_sup_fixed_cases():
    inf = float("inf")
    A, B, C = torch.tensor([-1.0, -1.0, 1.0, 0.0, 0.0, 0.0]), torch.tensor([2.0, 2.0, 0.0, -1.0, 1.0, 0.0]), torch.full((6,), 0.5)
    lo = torch.tensor([-inf, 2.0, -1.0, 0.0, 0.0, -inf])
    hi = torch.tensor([inf, 3.0, 2.0, inf, inf, inf])
    out = quad_sup(A, B, C, lo, hi)  # -y^2+2y peaks at 1; on [2,3] at 2; y^2 on [-1,2] at 2; -y falls; y rises
    assert out.tolist() == [1.5, 0.5, 4.5, 0.5, inf, 0.5]  # the last: a constant on the whole line


def _mix(gen, K, loc_scale=0.6, dtype=torch.float64):
    w = torch.randn(K, generator=gen, dtype=dtype)
    mu = torch.randn(K, generator=gen, dtype=dtype) * loc_scale
    sd = torch.rand(K, generator=gen, dtype=dtype) * 0.6 + 0.15
    return D.MixtureSameFamily(D.Categorical(logits=w), D.LogNormal(mu, sd))


@pytest.mark.parametrize("seed", range(8))
def test_mixture_bound_with_heavy_tail_is_global_and_never_below_the_ratio(seed):
    gen = torch.Generator().manual_seed(seed)
    t, p = _mix(gen, 4), with_heavy_tail(_mix(gen, 4), eps=0.05)
    r = rejection_constant(t, p)
    assert float(r.mass_outside) == 0 and math.isinf(float(r.hi))  # the heavy tail bounds the whole line
    true = dense_sup(t, p, 1e-7, 1e4, n=800_001)
    assert true <= float(r.M) <= 3 * true + 1  # valid, and not uselessly loose


@pytest.mark.parametrize("seed", range(4))
def test_mixture_bound_without_heavy_tail_truncates_and_holds_on_domain(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    t, p = _mix(gen, 3), _mix(gen, 3)
    r = rejection_constant(t, p, alpha=1e-3)
    lo, hi = max(float(r.lo), 1e-9), min(float(r.hi), 1e6)
    assert float(r.M) >= dense_sup(t, p, lo, hi, n=800_001)
    assert 0 <= float(r.mass_outside) <= 1e-3


def test_proposal_equal_to_target_with_heavy_tail_gives_m_near_one():
    t = _mix(torch.Generator().manual_seed(7), 4)
    r = rejection_constant(t, with_heavy_tail(t, eps=0.05))
    assert 1 / 0.95 * 0.98 <= float(r.M) <= 1.5  # sup is about 1/(1 - eps)


@pytest.mark.parametrize("pair", [
    (D.Gamma(2.0, 1.0), D.Gamma(1.5, 0.8)),
    (D.Gamma(2.0, 1.0), D.Gamma(3.0, 1.5)),
    (D.Weibull(1.0, 1.5), D.Weibull(1.2, 1.3)),
    (D.Normal(0.0, 1.0), D.StudentT(3.0, 0.0, 1.2)),
    (D.Normal(0.5, 0.7), D.Normal(0.0, 1.0)),
], ids=["gamma-wide", "gamma-narrow", "weibull", "normal-studentt", "normal-normal"])
def test_envelope_algorithms_2_and_3_bound_the_ratio_on_their_domain(pair):
    t, p = pair
    r = envelope_constant(t, p, alpha=1e-3, n=64)
    assert r.method == "envelope"
    true = dense_sup(t, p, r.lo, r.hi)
    assert true <= float(r.M) <= 3 * true
    assert float(r.mass_outside) == pytest.approx(1e-3, abs=2e-4)


def test_bad_alpha_and_mixed_kinds_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        rejection_constant(D.Exponential(1.0), D.Exponential(2.0), alpha=0.0)
    with pytest.raises(ValueError, match="Categorical"):
        rejection_constant(D.Categorical(probs=torch.ones(2) / 2), D.Exponential(1.0))


@pytest.mark.parametrize("process", ["hawkes", "multi_hawkes", "self_correcting", "renewal"])
def test_the_self_proposal_samplers_constants_bound_the_true_ratio_on_the_shipped_targets(process):
    """The time bound M_time of every position of real self-proposal rounds, as the sampler computes it
    (``SelfProposalSampler.time_bound``: one shared grid, no mediant), against a dense grid of the true time
    ratio p*_j / q (M_type is the exact largest ratio, tested above): never below it, and not loose."""
    import numpy as np

    from ears_core.tpp.processes import make_process
    from ears_core.tpp.samplers import SelfProposalSampler, draw_proposals, proposal_law
    from ears_core.tpp.transformer import load_pair

    target, _ = load_pair(process)
    seq, l = make_process(process).simulate(40, np.random.default_rng(1)), 8
    gen = torch.Generator().manual_seed(0)
    y_dense = torch.linspace(-30.0, 15.0, 300_001)
    with torch.inference_mode():
        for n in range(1, 40, 8):  # rounds after histories of 1, 9, ..., 33 events of the true process
            s = SelfProposalSampler(target, 1, 64, gen, history=(seq.times[:n], seq.types[:n]))
            empty = torch.zeros(1, 0)
            comps, heavy, type_lp = proposal_law(s.target_pass(empty, empty.long())[:, 0], s.eps, s.widen)
            y, x, _ = draw_proposals(comps, heavy, type_lp, l, gen)  # (1, l)
            p = s.target_pass(torch.exp(y), x)[:, :l]  # p*_1..p*_l, leading (1, l)
            log_m, outside = s.time_bound(p, comps, heavy)  # (1, l)
            assert float(outside.max()) == 0  # the heavy tail makes every bound global
            lw, mu, sd = (torch.cat([c[0], h]) for c, h in zip(comps, heavy))  # (R+1,) with the heavy tail
            zq = (y_dense[:, None] - mu) / sd
            log_q = torch.logsumexp(lw - 0.5 * zq * zq - torch.log(sd), -1) - 0.5 * math.log(2 * math.pi)
            for j in range(l):
                true = float((p[0, j].log_prob_y(y_dense) - log_q).max())
                assert true <= float(log_m[0, j]) <= true + math.log(1.7)  # valid, and within 70 %
