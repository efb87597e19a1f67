"""The speculative event sampler is exact: its sequences have the autoregressive sampler's law.

Fixed seeds throughout. Two-sample KS on inter-event times at fixed positions, chi-squared on types,
KS on the event count in a window, for several l; a one-sample KS of the first gap against the model's
exact CDF; and a power check (the same statistics do tell two different models apart), so the
agreement tests are not tests that cannot fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from ears_core.tpp.model import NeuralTPP, TPPConfig, load_model
from ears_core.tpp.sampler import SpecConfig, autoregressive_sample, speculative_sample

torch.set_num_threads(1)
T_END, N_SEQ, P_MIN = 2.5, 500, 0.01


@pytest.fixture(scope="module")
def model() -> NeuralTPP:
    return load_model()


def _runs(sampler, model, n=N_SEQ, seed0=0, **kw):
    return [sampler(model, t_end=T_END, seed=seed0 + i, **kw) for i in range(n)]


def _gap(runs, j):  # inter-event time of event j, over the runs that have it
    return np.array([r.taus[j] for r in runs if len(r.times) > j])


def _types(runs, j, C=3):
    return np.bincount([r.types[j] for r in runs if len(r.times) > j], minlength=C)


def _compare(a, b):
    """p-values: gaps at events 0, 1, 3; types at events 1, 3; counts in the window."""
    out = {f"gap{j}": stats.ks_2samp(_gap(a, j), _gap(b, j)).pvalue for j in (0, 1, 3)}
    for j in (1, 3):
        out[f"type{j}"] = stats.chi2_contingency(np.stack([_types(a, j), _types(b, j)]))[1]
    out["count"] = stats.ks_2samp([len(r.times) for r in a], [len(r.times) for r in b]).pvalue
    return out


@pytest.fixture(scope="module")
def ar_runs(model):
    return _runs(autoregressive_sample, model, seed0=10_000)


@pytest.mark.parametrize("l", [pytest.param(1, marks=pytest.mark.slow), 4,
                               pytest.param(16, marks=pytest.mark.slow)])
def test_speculative_matches_autoregressive(model, ar_runs, l):
    spec = _runs(speculative_sample, model, l=l)
    kinds = [k for r in spec for k in r.kinds]
    if l > 1:  # both paths of the step are exercised: kept proposals and resampled rejections
        assert kinds.count("accepted") > 100 and kinds.count("resampled") > 100
    pv = _compare(spec, ar_runs)
    assert min(pv.values()) > P_MIN, pv
    assert max(s.mass_outside for r in spec for s in r.steps) == 0  # every M was a global bound


def test_first_gap_has_the_models_exact_law(model):
    spec = [speculative_sample(model, l=8, n_events=1, seed=i) for i in range(800)]
    with torch.no_grad():
        d = model.decode(model.start(1)[0])
    w, mu, sd = torch.softmax(d.w_logits, -1).numpy(), d.mu.numpy(), d.sd.numpy()

    def cdf(tau):
        return (w * stats.norm.cdf((np.log(np.asarray(tau))[:, None] - mu) / sd)).sum(-1)

    assert stats.kstest([r.taus[0] for r in spec], cdf).pvalue > P_MIN
    exact = torch.softmax(d.type_logits.double(), -1).numpy()
    counts = np.bincount([r.types[0] for r in spec], minlength=3)
    assert stats.chisquare(counts, exact / exact.sum() * counts.sum()).pvalue > P_MIN


def test_the_statistics_tell_two_models_apart(model, ar_runs):
    """Power: the same tests with the same sample sizes reject a slightly different model."""
    other = NeuralTPP(model.cfg)
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        other.head.bias[4:8] += 0.3  # component locations of log tau, shifted by 0.3 * y_std (0.45)
    other.eval()
    spec = _runs(speculative_sample, other, l=4)
    assert min(_compare(spec, ar_runs).values()) < 1e-3


def test_same_seed_same_sequence_and_stopping_rules(model):
    a = speculative_sample(model, l=4, n_events=50, seed=3)
    b = speculative_sample(model, l=4, n_events=50, seed=3)
    assert a.times == b.times and a.types == b.types and len(a.times) == 50
    assert all(np.diff([0.0, *a.times]) > 0)
    w = speculative_sample(model, l=4, t_end=5.0, seed=3)
    assert w.times and w.times[-1] <= 5.0
    assert len(a.kinds) == 50 and set(a.kinds) <= {"accepted", "resampled"}
    # per step: accepted proposals, then one resampled event unless all l stood
    st = a.stats()
    assert st["steps"] == len(a.steps) and 0 < st["acceptance_rate"] <= 1


def test_history_conditions_the_start(model):
    hist = ([0.2, 0.5, 0.6], [0, 1, 1])
    r = speculative_sample(model, l=4, n_events=5, history=hist, seed=0)
    assert r.times[0] > 0.6  # continues after the last history event
    assert r.taus[0] == pytest.approx(r.times[0] - 0.6)
    ar = autoregressive_sample(model, n_events=5, history=hist, seed=0)
    assert ar.times[0] > 0.6 and ar.taus[0] == pytest.approx(ar.times[0] - 0.6)
    # the history changes the law: the first gap after a burst differs from the first gap of an empty history
    with torch.no_grad():
        fresh = model.decode(model.start(1)[0])
        h = model.encode(torch.tensor([[0.2, 0.3, 0.1]]), torch.tensor([[0, 1, 1]]), model.start(1))[:, -1]
        after = model.decode(h[0])
    assert not torch.allclose(fresh.mu, after.mu, atol=1e-3)


def test_step_records_are_consistent(model):
    r = speculative_sample(model, l=8, n_events=200, seed=1)
    for s in r.steps:
        assert len(s.tau) == len(s.M) == len(s.accept_prob) == 8
        assert all(p <= 1.0 + 1e-6 for p in s.accept_prob)  # M bounds the ratio: probabilities stay <= 1
        assert all(m >= 1.0 for m in s.M)
        assert 0 <= s.num_accepted <= 8
    assert sum(1 for k in r.kinds if k == "accepted") <= sum(s.num_accepted for s in r.steps)


@pytest.mark.parametrize("kwargs, match", [
    (dict(l=0, n_events=5), "l .*>= 1"),
    (dict(l=2.5, n_events=5), "l .*integer"),
    (dict(l=4), "n_events .* or t_end"),
    (dict(l=4, n_events=0), "n_events must be a positive integer"),
    (dict(l=4, t_end=-1.0), "t_end must be positive"),
    (dict(l=4, n_events=3, history=([0.0, 1.0], [0, 1])), "positive"),
    (dict(l=4, n_events=3, history=([1.0, 0.5], [0, 1])), "strictly increasing"),
    (dict(l=4, n_events=3, history=([0.5, 0.5], [0, 1])), "strictly increasing"),
    (dict(l=4, n_events=3, history=([0.5, 1.0], [0, 7])), "unknown event type"),
    (dict(l=4, n_events=3, history=([0.5, 1.0], [0])), "one type per event"),
    (dict(l=4, n_events=3, cfg=SpecConfig(eps=0.0)), "eps"),
])
def test_bad_input_is_refused_clearly(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        speculative_sample(model, **kwargs)


def test_autoregressive_refuses_bad_history(model):
    with pytest.raises(ValueError, match="unknown event type"):
        autoregressive_sample(model, n_events=2, history=([0.5], [-1]))


def test_untrained_model_is_still_sampled_exactly():
    """A random model whose law moves a lot from event to event: many rejections, same law."""
    torch.manual_seed(5)
    m = NeuralTPP(TPPConfig(hidden=16)).eval()
    with torch.no_grad():
        for p in m.gru.parameters():
            p.mul_(3.0)
    a = [speculative_sample(m, l=6, t_end=4.0, seed=i) for i in range(300)]
    b = [autoregressive_sample(m, t_end=4.0, seed=50_000 + i) for i in range(300)]
    st = [s for r in a for s in r.steps]
    assert np.mean([s.num_accepted for s in st]) < 5  # rejections happen
    for j in (0, 2):
        assert stats.ks_2samp(_gap(a, j), _gap(b, j)).pvalue > P_MIN
    assert stats.ks_2samp([len(r.times) for r in a], [len(r.times) for r in b]).pvalue > P_MIN


def test_tolerance_beyond_the_seed_is_off_by_default_and_raises_acceptance(model):
    """beta = 0 is the exact sampler draw for draw; beta > 0 keeps more proposals (and is not exact)."""
    exact = speculative_sample(model, l=8, n_events=300, seed=4)
    zero = speculative_sample(model, l=8, n_events=300, seed=4, cfg=SpecConfig(beta=0.0))
    assert exact.times == zero.times and exact.kinds == zero.kinds
    loose = speculative_sample(model, l=8, n_events=300, seed=4, cfg=SpecConfig(beta=0.5))
    assert loose.stats()["acceptance_rate"] > exact.stats()["acceptance_rate"] + 0.05
    with pytest.raises(ValueError, match="beta"):
        speculative_sample(model, l=4, n_events=3, cfg=SpecConfig(beta=1.5))


def test_renewal_model_is_sampled_exactly_too():
    from ears_core.tpp.model import ASSET_DIR
    m = load_model(ASSET_DIR / "renewal")
    a = [speculative_sample(m, l=8, n_events=6, seed=i) for i in range(400)]
    b = [autoregressive_sample(m, n_events=6, seed=70_000 + i) for i in range(400)]
    for j in (0, 5):
        assert stats.ks_2samp(_gap(a, j), _gap(b, j)).pvalue > P_MIN
        assert stats.chi2_contingency(np.stack([_types(a, j), _types(b, j)]))[1] > P_MIN
