"""The known point processes: simulators and likelihoods against answers known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ears_core.tpp.processes import HawkesProcess, RenewalProcess, Sequence


def test_hawkes_without_excitation_is_poisson():
    proc = HawkesProcess(mu=[1.5], alpha=[[0.0]], beta=1.0)
    seq = proc.simulate(3000, np.random.default_rng(0))
    assert stats.kstest(seq.taus, stats.expon(scale=1 / 1.5).cdf).pvalue > 0.01
    fixed = Sequence(np.array([0.5, 1.0, 2.5]), np.array([0, 0, 0]))
    assert proc.log_likelihood(fixed) == pytest.approx(3 * math.log(1.5) - 1.5 * 2.5)


def test_hawkes_event_rate_matches_stationary_rate():
    proc = HawkesProcess()
    lam = np.linalg.solve(np.eye(3) - np.asarray(proc.alpha), np.asarray(proc.mu))  # (I - alpha)^-1 mu
    seq = proc.simulate(20_000, np.random.default_rng(1))
    assert len(seq.times) / seq.times[-1] == pytest.approx(lam.sum(), rel=0.05)
    shares = np.bincount(seq.types, minlength=3) / len(seq.types)
    assert np.allclose(shares, lam / lam.sum(), atol=0.02)


def test_hawkes_refuses_explosive_or_bad_parameters():
    with pytest.raises(ValueError, match="spectral radius"):
        HawkesProcess(mu=[0.5], alpha=[[1.2]])
    with pytest.raises(ValueError, match="mu > 0"):
        HawkesProcess(mu=[0.0], alpha=[[0.1]])


def test_renewal_intervals_are_lognormal():
    proc = RenewalProcess(mu=-0.5, sigma=0.8)
    seq = proc.simulate(4000, np.random.default_rng(2))
    assert stats.kstest(np.log(seq.taus), stats.norm(-0.5, 0.8).cdf).pvalue > 0.01
    assert np.all(np.diff(seq.times) > 0)


def test_renewal_log_likelihood_fixed_case():
    proc = RenewalProcess(mu=0.0, sigma=1.0, probs=[0.25, 0.75])
    seq = Sequence(np.array([1.0, 1.0 + math.e]), np.array([0, 1]))  # gaps 1 and e: log gaps 0 and 1
    expected = 2 * -0.5 * math.log(2 * math.pi) - 0.5 - 1.0 + math.log(0.25) + math.log(0.75)
    assert proc.log_likelihood(seq) == pytest.approx(expected)

