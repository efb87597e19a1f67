"""Simulators with known answers, the neural TPP's likelihood and draws, the shipped weights, the figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from ears_core.tpp import viz
from ears_core.tpp.model import NeuralTPP, TPPConfig, load_model
from ears_core.tpp.processes import HawkesProcess, RenewalProcess, Sequence
from ears_core.tpp.sampler import autoregressive_sample, speculative_sample, step_laws

torch.set_num_threads(1)


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


@pytest.fixture(scope="module")
def random_model() -> NeuralTPP:
    torch.manual_seed(0)
    return NeuralTPP(TPPConfig(hidden=16)).eval()


def test_parallel_likelihood_equals_step_by_step(random_model):
    m = random_model
    tau, x = torch.tensor([[0.3, 1.2, 0.05, 0.7]]), torch.tensor([[0, 2, 1, 1]])
    with torch.no_grad():
        total, h = 0.0, m.start(1)
        for i in range(4):
            total += float(m.decode(h[0]).log_prob(tau[0, i], x[0, i]))
            h = m.encode(tau[:, i:i + 1], x[:, i:i + 1], h)[:, -1]
        assert float(m.log_likelihood(tau, x)) == pytest.approx(total, abs=1e-4)


def test_event_dist_draws_follow_its_density(random_model):
    with torch.no_grad():
        d = random_model.decode(random_model.start(1)[0])
    tau, x = d.sample(4000, torch.Generator().manual_seed(0))
    w, mu, sd = torch.softmax(d.w_logits, -1).numpy(), d.mu.numpy(), d.sd.numpy()
    cdf = lambda t: (w * stats.norm.cdf((np.log(np.asarray(t))[:, None] - mu) / sd)).sum(-1)  # noqa: E731
    assert stats.kstest(tau.numpy(), cdf).pvalue > 0.01
    p = torch.softmax(d.type_logits.double(), -1).numpy()
    counts = np.bincount(x.numpy(), minlength=3)
    assert stats.chisquare(counts, p / p.sum() * counts.sum()).pvalue > 0.01
    # the density integrates to 1 over tau (trapezoid in log tau)
    y = torch.linspace(-20, 20, 20001)
    assert float(torch.trapezoid(torch.exp(d.log_prob_y(y)), y)) == pytest.approx(1.0, abs=1e-4)


def test_shipped_model_is_close_to_the_true_process():
    model = load_model()
    proc = HawkesProcess()
    seqs = [proc.simulate(64, np.random.default_rng(1000 + i)) for i in range(100)]
    tau = torch.tensor(np.stack([s.taus for s in seqs]), dtype=torch.float32)
    x = torch.tensor(np.stack([s.types for s in seqs]))
    with torch.no_grad():
        nll = -float(model.log_likelihood(tau, x).sum()) / tau.numel()
    true = -np.mean([proc.log_likelihood(s) for s in seqs]) / 64
    assert true <= nll + 0.02 and nll < true + 0.05  # within 0.05 nats/event of the floor
    # and the history matters: it beats the best renewal (history-free) fit by a clear margin
    y = torch.log(tau).flatten()
    renewal = -(stats.norm(y.mean(), y.std()).logpdf(y.numpy()) - y.numpy()).mean() \
        - (np.log(np.bincount(x.flatten().numpy()) / x.numel())[x.flatten().numpy()]).mean()
    assert nll < renewal - 0.1


def test_load_model_names_the_fix_when_weights_are_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_tpp.py"):
        load_model(tmp_path)


def test_figures_show_both_samplers_and_the_envelope_lies_above_the_target():
    model = load_model()
    spec = speculative_sample(model, l=4, n_events=60, seed=0)
    ar = autoregressive_sample(model, n_events=60, seed=0)
    tl = viz.timeline_figure(spec, ar)
    assert sum(len(t.x) for t in tl.data) == 120
    assert {t.name for t in tl.data} == {"speculative: accepted", "speculative: resampled", "autoregressive"}
    step = next(i for i, s in enumerate(spec.steps) if 1 <= s.num_accepted < 4)
    laws = step_laws(model, spec, step, spec.steps[step].num_accepted + 1)
    assert not laws["kept"] and laws["tau"] == spec.steps[step].tau[laws["position"] - 1]
    fig = viz.laws_figure(laws)
    target, envelope = np.asarray(fig.data[1].y), np.asarray(fig.data[2].y)
    assert np.all(envelope >= target) and envelope.max() > target.max()
    assert laws["M_time"] * laws["M_type"] <= laws["M_recorded"] * 1.5  # the display's M matches the run's
    qq = viz.qq_figure(ar.taus, spec.taus)
    assert len(qq.data[0].x) == 99
    assert "Speedup" in viz.summary_markdown(spec, ar, 4)


def test_renewal_log_likelihood_fixed_case():
    proc = RenewalProcess(mu=0.0, sigma=1.0, probs=[0.25, 0.75])
    seq = Sequence(np.array([1.0, 1.0 + math.e]), np.array([0, 1]))  # gaps 1 and e: log gaps 0 and 1
    expected = 2 * -0.5 * math.log(2 * math.pi) - 0.5 - 1.0 + math.log(0.25) + math.log(0.75)
    assert proc.log_likelihood(seq) == pytest.approx(expected)


def test_shipped_renewal_model_ignores_history_and_nearly_every_proposal_stands():
    from ears_core.tpp.model import ASSET_DIR
    model = load_model(ASSET_DIR / "renewal")
    with torch.no_grad():
        d = model.decode(model.start(1)[0])
        y = torch.linspace(-6, 4, 2001)
        dens = torch.exp(d.log_prob_y(y)).numpy()
    assert np.abs(dens - stats.norm(-0.5, 0.8).pdf(y.numpy())).max() < 0.05  # learnt the true gap law
    st = speculative_sample(model, l=8, n_events=400, seed=0).stats()
    assert st["acceptance_rate"] > 0.85 and st["mean_accepted_per_step"] > 5
