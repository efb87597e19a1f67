"""metrics.py: the theory formulas, a Monte-Carlo check of them, and summaries of real runs."""

import numpy as np
import pytest

from conftest import PROMPTS
from ears_core import EARSRule, StandardRule, autoregressive, expected_tokens_per_step, generate, theoretical_speedup


def test_expected_tokens_per_step_known_values():
    assert expected_tokens_per_step(0.5, 4) == pytest.approx(1.9375)  # 1 + .5 + .25 + .125 + .0625
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0
    assert expected_tokens_per_step(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)


def test_theoretical_speedup_known_values():
    assert theoretical_speedup(0.8, 4, 0.05) == pytest.approx(((1 - 0.8**5) / 0.2) / 1.2)
    assert theoretical_speedup(0.0, 4, 0.05) == pytest.approx(1 / 1.2)  # a useless draft slows down
    with pytest.raises(ValueError):
        expected_tokens_per_step(1.5, 4)


@pytest.mark.parametrize("a, k", [(0.3, 1), (0.6, 4), (0.9, 8)])
def test_theory_agrees_with_a_monte_carlo_simulation(a, k):
    rng = np.random.default_rng(0)
    ok = rng.random((200_000, k)) < a  # independent acceptances
    stood = np.where(ok.all(1), k, np.argmin(ok, 1))  # leading run of acceptances
    assert (stood + 1).mean() == pytest.approx(expected_tokens_per_step(a, k), rel=0.01)


def test_summary_of_a_speculative_run_matches_its_events(tiny_pair):
    target, draft = tiny_pair
    out = generate(target, draft, PROMPTS[0], rule=EARSRule(0.3), k=4, temperature=0.9, max_new_tokens=80, seed=0)
    s = out.stats
    kinds = [e.kind for e in out.events]
    assert s.new_tokens == 80 == len(out.token_ids)
    assert s.accepted == kinds.count("accepted") + kinds.count("pardoned")
    assert s.pardoned == kinds.count("pardoned") > 0
    assert s.drafted == sum(st.drafted for st in out.steps)
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert s.pardon_rate == pytest.approx(s.pardoned / s.drafted)
    assert s.mean_accept_length == pytest.approx(80 / s.steps)  # every round emits n + 1
    assert s.resampled + s.bonus + kinds.count("target") == s.steps  # one closing token per round
    assert s.mean_distortion == pytest.approx(np.mean([e.distortion for e in out.events]))
    assert s.mean_distortion > 0 and s.total_distortion == pytest.approx(80 * s.mean_distortion)
    assert s.tokens_per_s > 0 and s.cost_ratio > 0
    k_eff = s.drafted / s.steps  # K = 4 except in the last rounds, which stop at max_new_tokens
    assert 3 < k_eff < 4
    assert s.theory_tokens_per_step == pytest.approx(expected_tokens_per_step(s.acceptance_rate, k_eff))
    assert s.theory_speedup == pytest.approx(s.theory_tokens_per_step / (k_eff * s.cost_ratio + 1))


def test_ordinary_rule_reports_no_distortion_and_no_pardons(tiny_pair):
    target, draft = tiny_pair
    s = generate(target, draft, PROMPTS[0], rule=StandardRule(), k=4, temperature=0.9, max_new_tokens=60, seed=0).stats
    assert s.pardoned == 0 and s.pardon_rate == 0
    assert s.mean_distortion < 1e-5


def test_baseline_summary(tiny_pair):
    target, _ = tiny_pair
    s = autoregressive(target, PROMPTS[0], temperature=0.9, max_new_tokens=30, seed=0).stats
    assert s.new_tokens == 30 and s.steps == 30 and s.drafted == 0
    assert s.acceptance_rate is None and s.theory_speedup is None and s.mean_accept_length == 1.0
