"""The draft-model rule on hand-made laws: fixed cases, and one position's output law is exactly p*.

The fixed case is the one TPP-SD's public code gets wrong: the draft's time law equals the target's, but the
drafted mark is one the target almost never emits. The joint ratio rejects it and the residual only ever
emits the target's mark; the time-only ratio keeps it. The distribution test draws one position many times
(rows of a batch) and compares what comes out, accepted draft or residual / bonus, with p* itself.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from ears_core.tpp.event_law import EventDist
from ears_core.tpp.verify import residual_draw, verify_drafts

torch.set_num_threads(1)


def _law(B, w, mu, sd, type_probs, g=None) -> EventDist:
    """Leading (B,) or (B, g): a log-normal mixture in tau times a categorical, the same for every row."""
    lead = (B,) if g is None else (B, g)
    f = lambda v: torch.tensor(v, dtype=torch.float32).expand(*lead, -1)  # noqa: E731
    return EventDist(torch.log(f(w)), f(mu), f(sd), torch.log(f(type_probs)))


def test_a_drafted_mark_the_target_does_not_want_is_rejected_by_the_joint_ratio_only():
    p = _law(1, [1.0], [0.0], [0.5], [0.99, 0.01], g=2)  # target: mark 0 almost surely
    q = _law(1, [1.0], [0.0], [0.5], [0.01, 0.99], g=1)  # draft: same time law, mark 1 almost surely
    tau, x, u = torch.tensor([[1.3]]), torch.tensor([[1]]), torch.tensor([[0.5]])
    n_joint, log_r = verify_drafts(p, q, tau, x, u, "joint")
    assert int(n_joint) == 0 and math.isclose(float(log_r), math.log(0.01 / 0.99), rel_tol=1e-5)
    n_time, log_r_time = verify_drafts(p, q, tau, x, u, "time")
    assert int(n_time) == 1 and abs(float(log_r_time)) < 1e-6  # the time-only ratio keeps the wrong mark
    # the replacement comes from max(0, p - q) / Z: all its mass is on mark 0, with p's time law
    B = 4000
    pb, qb = _law(B, [1.0], [0.0], [0.5], [0.99, 0.01]), _law(B, [1.0], [0.0], [0.5], [0.01, 0.99])
    tau_r, x_r, _ = residual_draw(pb, qb, torch.zeros(B, dtype=torch.bool), torch.Generator().manual_seed(0))
    assert (x_r == 0).all()
    assert stats.kstest(np.log(tau_r.numpy()), stats.norm(0, 0.5).cdf).pvalue > 0.01


def test_bonus_rows_draw_from_the_target_and_equal_laws_always_accept():
    B = 3000
    p = _law(B, [0.3, 0.7], [-1.0, 0.5], [0.3, 0.6], [0.2, 0.5, 0.3])
    tau, x, drawn = residual_draw(p, p, torch.ones(B, dtype=torch.bool), torch.Generator().manual_seed(1))
    assert (drawn == 1).all()  # a bonus row keeps its first candidate
    ref_tau, ref_x = p.sample(1, torch.Generator().manual_seed(2))
    assert stats.ks_2samp(tau.numpy(), ref_tau[:, 0].numpy()).pvalue > 0.01
    assert stats.chisquare(np.bincount(x.numpy(), minlength=3), np.array([0.2, 0.5, 0.3]) * B).pvalue > 0.01
    pg = _law(1, [0.3, 0.7], [-1.0, 0.5], [0.3, 0.6], [0.2, 0.5, 0.3], g=4)
    n, _ = verify_drafts(pg, pg, torch.rand(1, 4) + 0.1, torch.tensor([[0, 1, 2, 1]]), torch.full((1, 4), 0.999))
    assert int(n) == 4


def _one_position(ratio: str, B: int = 20000, seed: int = 0):
    """Draft from q, verify against p, replace at a rejection: what one position emits (tau, x) (B,)."""
    gen = torch.Generator().manual_seed(seed)
    p = _law(B, [0.5, 0.5], [-1.0, 0.8], [0.4, 0.5], [0.6, 0.3, 0.1])
    q = _law(B, [0.8, 0.2], [-0.6, 0.9], [0.6, 0.4], [0.2, 0.3, 0.5])
    tau, x = q.sample(1, gen)  # (B, 1)
    p2 = EventDist(*(f.unsqueeze(1).expand(-1, 2, -1) for f in (p.w_logits, p.mu, p.sd, p.type_logits)))
    q1 = EventDist(*(f.unsqueeze(1) for f in (q.w_logits, q.mu, q.sd, q.type_logits)))
    n, _ = verify_drafts(p2, q1, tau, x, torch.rand(B, 1, generator=gen), ratio)
    r_tau, r_x, _ = residual_draw(p, q, torch.zeros(B, dtype=torch.bool), gen, ratio)
    kept = n == 1
    return torch.where(kept, tau[:, 0], r_tau).numpy(), torch.where(kept, x[:, 0], r_x).numpy(), p


def _p_values(tau, x, p):
    w, mu, sd = [0.5, 0.5], np.array([-1.0, 0.8]), np.array([0.4, 0.5])
    cdf = lambda t: (np.array(w) * stats.norm.cdf((np.log(np.asarray(t))[:, None] - mu) / sd)).sum(-1)  # noqa: E731
    probs = np.array([0.6, 0.3, 0.1])
    joint = np.array([np.bincount(x[np.log(tau) < -0.2], minlength=3), np.bincount(x[np.log(tau) >= -0.2], minlength=3)])
    cut = float(cdf([math.exp(-0.2)])[0])
    expected = np.outer([cut, 1 - cut], probs) * len(x)
    return dict(time=stats.kstest(tau, cdf).pvalue,
                marks=stats.chisquare(np.bincount(x, minlength=3), probs * len(x)).pvalue,
                joint=stats.chisquare(joint.ravel(), expected.ravel()).pvalue)


def test_one_position_emits_exactly_the_target_law_with_the_joint_ratio():
    pv = _p_values(*_one_position("joint"))
    assert min(pv.values()) > 0.01, pv


def test_one_position_with_the_time_only_ratio_does_not_emit_the_target_law():
    pv = _p_values(*_one_position("time"))
    assert pv["marks"] < 1e-6, pv  # the drafted marks kept unverified follow the draft's mark law
