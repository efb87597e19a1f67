"""The next event's law (draws against its own density, a density that integrates to 1) and the history checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from ears_core.tpp.event_law import EventDist, check_history

torch.set_num_threads(1)


def _law() -> EventDist:
    """One position's law: 4 time components, 3 marks (fixed numbers, not a trained model)."""
    return EventDist(torch.tensor([0.3, -0.5, 1.0, 0.0]), torch.tensor([-1.0, 0.2, 0.5, 1.5]),
                     torch.tensor([0.4, 0.9, 0.3, 0.6]), torch.tensor([0.5, -1.0, 0.2]))


def test_draws_follow_the_laws_own_density():
    d = _law()
    tau, x = d.sample(4000, torch.Generator().manual_seed(0))
    w, mu, sd = torch.softmax(d.w_logits, -1).numpy(), d.mu.numpy(), d.sd.numpy()
    cdf = lambda t: (w * stats.norm.cdf((np.log(np.asarray(t))[:, None] - mu) / sd)).sum(-1)  # noqa: E731
    assert stats.kstest(tau.numpy(), cdf).pvalue > 0.01
    p = torch.softmax(d.type_logits.double(), -1).numpy()
    counts = np.bincount(x.numpy(), minlength=3)
    assert stats.chisquare(counts, p / p.sum() * counts.sum()).pvalue > 0.01
    y = torch.linspace(-20, 20, 20001)  # the density integrates to 1 over tau (trapezoid in log tau)
    assert float(torch.trapezoid(torch.exp(d.log_prob_y(y)), y)) == pytest.approx(1.0, abs=1e-4)


def test_the_statistics_tell_a_different_law_apart():
    d, other = _law(), _law()
    other.mu = other.mu + 0.15  # every time component shifted: tau about 16 % longer
    tau, _ = other.sample(4000, torch.Generator().manual_seed(0))
    w, mu, sd = torch.softmax(d.w_logits, -1).numpy(), d.mu.numpy(), d.sd.numpy()
    cdf = lambda t: (w * stats.norm.cdf((np.log(np.asarray(t))[:, None] - mu) / sd)).sum(-1)  # noqa: E731
    assert stats.kstest(tau.numpy(), cdf).pvalue < 1e-3


def test_log_prob_is_the_time_density_with_its_jacobian_times_the_mark_probability():
    d = _law()
    tau, x = torch.tensor(0.7), torch.tensor(2)
    expected = float(d.log_prob_y(torch.log(tau))) - float(torch.log(tau)) + float(d.type_log_probs[2])
    assert float(d.log_prob(tau, x)) == pytest.approx(expected, abs=1e-6)


def test_a_valid_history_comes_back_as_tensors_and_none_is_empty():
    times, types = check_history(([0.5, 1.0, 2.25], [0, 2, 1]), num_types=3)
    assert times.tolist() == [0.5, 1.0, 2.25] and types.dtype == torch.long and types.tolist() == [0, 2, 1]
    times, types = check_history(None, num_types=3)
    assert times.numel() == 0 and types.numel() == 0


@pytest.mark.parametrize("history, match", [
    (([0.0, 1.0], [0, 1]), "positive"),
    (([1.0, 0.5], [0, 1]), "strictly increasing"),
    (([0.5, 0.5], [0, 1]), "strictly increasing"),
    (([0.5, 1.0], [0, 7]), "unknown event type"),
    (([0.5, 1.0], [0, -1]), "unknown event type"),
    (([0.5, 1.0], [0]), "one type per event"),
    (([0.5, 1.0], [0.0, 1.5]), "integers"),
])
def test_a_bad_history_is_refused_with_the_fix(history, match):
    with pytest.raises(ValueError, match=match):
        check_history(history, num_types=3)
