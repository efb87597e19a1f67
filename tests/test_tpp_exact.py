"""Both samplers draw the shipped transformer target's law exactly, on every process.

For each process, 2,000 sequences of 12 events (rows of one batch, fixed seeds) from the draft-model sampler
(TPP-SD rule over the joint density) and from the self-proposal sampler (seed 001), each against 2,000 from
the plain autoregressive sampler of the same target: two-sample KS on the inter-event time at positions 1, 4,
8 and 12, KS on the number of events in a window, chi-squared on the marks (at three positions, and pooled)
where the process has several. A draft whose mark logits are tilted makes the rule's job harder and must
not matter with the joint ratio; with the time-only ratio (TPP-SD's public code) the same check fails.
A target with a shifted time law is told apart by the same statistics: they have power.
"""

from __future__ import annotations

import copy
from functools import lru_cache

import numpy as np
import pytest
import torch
from scipy import stats

from ears_core.tpp.processes import PROCESSES
from ears_core.tpp.run import sample
from ears_core.tpp.transformer import load_pair

torch.set_num_threads(1)
N_SEQ, N_EV, P_MIN = 2000, 12, 1e-3
pytestmark = pytest.mark.slow


@lru_cache(maxsize=None)
def _pair(name):
    return load_pair(name)


@lru_cache(maxsize=None)
def _ar(name):
    return sample(_pair(name)[0], method="autoregressive", n_events=N_EV, batch=N_SEQ, seed=10_000)


def _tilted(draft, by: float = 2.0):
    """The draft with mark 0's logit raised by ``by``: its mark law differs from the target's."""
    d = copy.deepcopy(draft)
    K = d.cfg.num_components
    with torch.no_grad():
        d.head.bias[3 * K] += by
    return d


def _p_values(a, b, C: int) -> dict:
    ta, tb = np.array(a.taus), np.array(b.taus)  # (N, N_EV)
    out = {f"gap{j + 1}": stats.ks_2samp(ta[:, j], tb[:, j]).pvalue for j in (0, 3, 7, 11)}
    window = float(np.median(np.array(a.times)[:, 5]))
    out["count"] = stats.ks_2samp((np.array(a.times) <= window).sum(1), (np.array(b.times) <= window).sum(1)).pvalue
    if C > 1:
        xa, xb = np.array(a.types), np.array(b.types)
        for j in (0, 5, 11):
            out[f"mark{j + 1}"] = stats.chi2_contingency(np.stack([np.bincount(xa[:, j], minlength=C),
                                                                   np.bincount(xb[:, j], minlength=C)]))[1]
        out["marks"] = stats.chi2_contingency(np.stack([np.bincount(xa.ravel(), minlength=C),
                                                        np.bincount(xb.ravel(), minlength=C)]))[1]
    return out


def _kinds(run) -> dict:
    flat = [k for row in run.kinds for k in row]
    return {k: flat.count(k) for k in ("accepted", "resampled", "bonus")}


@pytest.mark.parametrize("name", list(PROCESSES))
def test_draft_model_sampler_matches_autoregressive(name):
    target, draft = _pair(name)
    run = sample(target, draft, method="draft", n_events=N_EV, batch=N_SEQ, seed=1, length=4)
    kinds = _kinds(run)
    assert min(kinds.values()) > 100, kinds  # every path of the rule is exercised
    pv = _p_values(run, _ar(name), target.cfg.num_types)
    assert min(pv.values()) > P_MIN, pv


@pytest.mark.parametrize("name", list(PROCESSES))
def test_self_proposal_sampler_matches_autoregressive(name):
    target, _ = _pair(name)
    run = sample(target, method="self", n_events=N_EV, batch=N_SEQ, seed=2, length=4, cells=64)
    kinds = _kinds(run)
    assert kinds["accepted"] > 100 and kinds["resampled"] > 100, kinds
    pv = _p_values(run, _ar(name), target.cfg.num_types)
    assert min(pv.values()) > P_MIN, pv


MARKED = [n for n in PROCESSES if n in ("multi_hawkes", "renewal")]


@pytest.mark.parametrize("name", MARKED)
def test_a_draft_with_the_wrong_marks_still_gives_the_target_law_with_the_joint_ratio(name):
    target, draft = _pair(name)
    run = sample(target, _tilted(draft), method="draft", n_events=N_EV, batch=N_SEQ, seed=3, length=4)
    pv = _p_values(run, _ar(name), target.cfg.num_types)
    assert min(pv.values()) > P_MIN, pv


@pytest.mark.parametrize("name", MARKED)
def test_dropping_the_mark_from_the_ratio_fails_the_same_check(name):
    target, draft = _pair(name)
    run = sample(target, _tilted(draft), method="draft", n_events=N_EV, batch=N_SEQ, seed=3, length=4,
                 ratio="time")
    pv = _p_values(run, _ar(name), target.cfg.num_types)
    assert pv["marks"] < 1e-6, pv


def test_the_statistics_tell_a_shifted_time_law_apart():
    target, _ = _pair("hawkes")
    shifted = copy.deepcopy(target)
    shifted.cfg.y_mean += 0.15  # every inter-event time about 16 % longer
    run = sample(shifted, method="autoregressive", n_events=N_EV, batch=N_SEQ, seed=4)
    pv = _p_values(run, _ar("hawkes"), 1)
    assert min(pv.values()) < 1e-6, pv
