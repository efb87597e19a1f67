"""The transformer TPP and its KV cache, the new processes, the cost model and the samplers' input checks.

Tiny random models built in memory (fast, deterministic). The cache is checked against a full causal pass:
incremental, in chunks, rows at different lengths, and after a rollback; the processes' compensators
against the time-rescaling theorem (they must be i.i.d. Exp(1) under the true process).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from ears_core.tpp.event_law import EventDist
from ears_core.tpp.cost import AcceptanceTracker, Prices, choose, expected_events
from ears_core.tpp.processes import PROCESSES, Sequence, make_process
from ears_core.tpp.run import sample, stream
from ears_core.tpp.transformer import TransformerConfig, TransformerTPP, load_transformer, save_transformer

torch.set_num_threads(1)


def _tiny(layers=2, C=3, window=6, seed=0):
    torch.manual_seed(seed)
    return TransformerTPP(TransformerConfig(num_types=C, layers=layers, d_model=16, heads=2, d_ff=32,
                                            window=window)).eval()


def _positions(B, N, C, seed=0):
    g = torch.Generator().manual_seed(seed)
    tau = torch.rand(B, N, generator=g) + 0.05
    x = torch.randint(0, C, (B, N), generator=g)
    t = torch.cumsum(tau, 1)
    return (torch.cat([torch.zeros(B, 1), t[:, :-1]], 1), torch.cat([torch.ones(B, 1), tau[:, :-1]], 1),
            torch.cat([torch.full((B, 1), C), x[:, :-1]], 1))


@torch.inference_mode()
def test_cache_matches_a_full_pass_in_chunks_per_row_and_after_rollback():
    m = _tiny()
    pt, ptau, px = _positions(3, 20, 3)
    full = m.encode_all(pt, ptau, px)  # (3, 20, D)
    c = m.new_cache(3, 32)
    outs = [m(pt[:, i:i + 7], ptau[:, i:i + 7], px[:, i:i + 7], c) for i in range(0, 20, 7)]
    assert torch.allclose(torch.cat(outs, 1), full, atol=1e-5)
    c1 = m.new_cache(1, 32)  # one row, one position at a time (the slice path)
    one = torch.cat([m(pt[2:, i:i + 1], ptau[2:, i:i + 1], px[2:, i:i + 1], c1) for i in range(20)], 1)
    assert torch.allclose(one, full[2:], atol=1e-5)
    # rows at different lengths in one call, then a rollback and a re-read with other events
    c.length = torch.tensor([5, 9, 12])
    idx = torch.tensor([[5, 6], [9, 10], [12, 13]])
    rows = torch.arange(3).unsqueeze(1)
    out = m(pt[rows, idx], ptau[rows, idx], px[rows, idx], c)
    assert torch.allclose(out, full[rows, idx], atol=1e-5)
    assert c.length.tolist() == [7, 11, 14]
    c1.length = torch.tensor([10])
    m(pt[2:, 10:13] + 5.0, ptau[2:, 10:13], px[2:, 10:13], c1)  # other events at 10..12, then roll back
    c1.length = torch.tensor([10])
    assert torch.allclose(m(pt[2:, 10:13], ptau[2:, 10:13], px[2:, 10:13], c1), full[2:, 10:13], atol=1e-5)


@torch.inference_mode()
def test_window_limits_what_a_position_sees():
    m = _tiny(window=4)  # 2 layers: a position sees up to 2 * (4 - 1) = 6 positions back, through both
    pt, ptau, px = _positions(1, 14, 3)
    a = m.encode_all(pt, ptau, px)
    px2 = px.clone()
    px2[0, 3] = (px2[0, 3] + 1) % 3  # change event 3: positions 3..9 see it, 10 onward do not
    b = m.encode_all(pt, ptau, px2)
    diff = (a - b).abs().amax(-1)[0]
    assert (diff[3:10] > 1e-4).all() and (diff[10:] < 1e-6).all() and (diff[:3] < 1e-6).all()


def test_likelihood_is_normalised_and_weights_round_trip(tmp_path):
    m = _tiny(C=2)
    with torch.no_grad():  # one event: integrate p(tau, x) over tau on a log grid, sum over x
        d = m.decode(m.encode_all(torch.zeros(1, 1), torch.ones(1, 1), torch.full((1, 1), 2))[:, 0])
        y = torch.linspace(-15, 10, 20001)
        d = EventDist(*(f.expand(y.numel(), -1) for f in (d.w_logits, d.mu, d.sd, d.type_logits)))  # (G,)
        dens = sum(torch.exp(d.log_prob(torch.exp(y), torch.full((y.numel(),), c)) + y) for c in (0, 1))
        assert abs(float(torch.trapezoid(dens, y)) - 1) < 1e-3
    save_transformer(m, tmp_path / "m", dict(note="x"))
    m2 = load_transformer(tmp_path / "m")
    tau, x = torch.rand(2, 9) + 0.1, torch.randint(0, 2, (2, 9))
    with torch.no_grad():
        assert torch.allclose(m.log_likelihood(tau, x), m2.log_likelihood(tau, x))


@pytest.mark.parametrize("name", list(PROCESSES))
def test_compensators_are_exponential_and_likelihood_prefers_the_truth(name):
    proc = make_process(name)
    rng = np.random.default_rng(3)
    seqs = [proc.simulate(60, rng) for _ in range(40)]
    lam = np.concatenate([proc.compensators(s) for s in seqs])
    assert stats.kstest(lam, "expon").pvalue > 0.01
    # the time-rescaled gaps of another process's sequences are not Exp(1): the check has power
    other = make_process("renewal" if name != "renewal" else "self_correcting")
    others = [other.simulate(60, rng) for _ in range(40)]
    lam2 = np.concatenate([proc.compensators(Sequence(o.times, o.types % proc.num_types)) for o in others])
    assert stats.kstest(lam2, "expon").pvalue < 1e-3


def test_self_correcting_likelihood_is_the_intensity_formula():
    proc = make_process("self_correcting")
    seq = proc.simulate(5, np.random.default_rng(0))
    from scipy.integrate import quad
    ll, prev = 0.0, 0.0
    for i, t in enumerate(seq.times):
        ll += proc.mu * t - proc.alpha * i - quad(lambda s: np.exp(proc.mu * s - proc.alpha * i), prev, t)[0]
        prev = t
    assert abs(ll - proc.log_likelihood(seq)) < 1e-6


def test_cost_model_falls_back_when_drafting_does_not_pay_and_drafts_long_when_cheap():
    rates = [0.9] * 12
    assert abs(expected_events("draft", rates, 2) - (1 + 0.9 + 0.81)) < 1e-12
    assert abs(expected_events("self", rates, 2) - (0.9 + 0.81)) < 1e-12
    cheap = Prices(ar=1.0, rounds={1: 1.1, 4: 1.3, 8: 1.6})
    best, pays, speed = choose(cheap, rates, "draft")
    assert pays and best == 8 and speed[8] > speed[1]
    dear = Prices(ar=1.0, rounds={1: 3.0, 4: 6.0, 8: 10.0})
    assert not choose(dear, [0.3] * 12, "draft")[1]
    tr = AcceptanceTracker(4, prior=0.5, weight=1.0, decay=1.0)
    tr.update(4, [0, 4, 2])  # evaluated: pos1 x3, pos2 x2, pos3 x2, pos4 x1; kept: 2, 2, 1, 1
    pooled = (6 + 0.5) / (8 + 1)  # every position's kept and seen, with the prior's one pseudo-observation
    assert np.allclose(tr.rates(), [(2 + pooled) / 4, (2 + pooled) / 3, (1 + pooled) / 3, (1 + pooled) / 2])
    deep = AcceptanceTracker(8, prior=0.5, weight=1.0, decay=1.0)
    deep.update(2, [2] * 50)  # only positions 1-2 ever evaluated, always kept
    assert deep.rates()[7] > 0.95  # an unexplored deeper position reads the pooled rate, not the prior


def test_cost_model_run_uses_autoregressive_rounds_when_told_drafting_is_dear():
    target, draft = _tiny(), _tiny(layers=1, seed=1)
    dear = Prices(ar=1e-3, rounds={L: 1.0 for L in (1, 2, 4)})
    run = sample(target, draft, method="draft", n_events=80, seed=0, prices=dear)
    modes = [r.mode for r in run.rounds]
    assert modes.count("ar") >= 60 and "draft" in modes  # mostly fallback, plus the acceptance probes
    assert len(run.times[0]) == 80


def test_bad_input_is_refused_with_a_clear_message():
    target, draft = _tiny(), _tiny(layers=1, seed=1)
    with pytest.raises(ValueError, match="draft length"):
        sample(target, draft, method="draft", n_events=5, length=0)
    with pytest.raises(ValueError, match="unknown sampler"):
        sample(target, draft, method="nope", n_events=5)
    with pytest.raises(ValueError, match="n_events"):
        sample(target, draft, method="draft", n_events=0)
    with pytest.raises(ValueError, match="unknown process"):
        make_process("poisson?")
    with pytest.raises(ValueError, match="ratio"):
        sample(target, draft, method="draft", n_events=5, length=2, ratio="marks")
    with pytest.raises(ValueError, match="needs a draft"):
        sample(target, None, method="draft", n_events=5, length=2)
    with pytest.raises(ValueError, match="multiple of heads"):
        TransformerConfig(d_model=10, heads=4)
    with pytest.raises(ValueError, match="strictly increasing"):
        sample(target, draft, method="draft", n_events=5, length=2, history=([1.0, 0.5], [0, 1]))


def test_history_is_continued_and_runs_are_reproducible():
    target, draft = _tiny(), _tiny(layers=1, seed=1)
    hist = ([0.4, 1.1, 1.5], [0, 2, 1])
    a = sample(target, draft, method="draft", n_events=30, length=3, seed=7, history=hist)
    b = sample(target, draft, method="draft", n_events=30, length=3, seed=7, history=hist)
    assert a.times == b.times and a.types == b.types and a.kinds == b.kinds
    assert a.start == pytest.approx(1.5) and a.times[0][0] > 1.5 and len(a.times[0]) == 30
    assert all(t > 0 for t in a.taus[0])
    recs = [rec for _, rec in stream(target, draft, method="self", n_events=20, length=4, seed=1)]
    assert sum(sum(r.committed) for r in recs) >= 20 and all(r.mode == "self" for r in recs)


def test_the_lean_single_draw_is_the_same_draw_as_the_general_one():
    g = torch.Generator().manual_seed(0)
    d = EventDist(torch.randn(50, 4, generator=g), torch.randn(50, 4, generator=g), torch.rand(50, 4, generator=g) + 0.1,
                  torch.randn(50, 3, generator=g))
    a = d.sample1(torch.Generator().manual_seed(5))
    b = d.sample(1, torch.Generator().manual_seed(5))
    assert torch.allclose(a[0], b[0]) and torch.equal(a[1], b[1])


def test_price_smoothing_is_a_line_that_ignores_a_single_spike():
    from ears_core.tpp.cost import fit_line
    line = fit_line({1: 2.0, 2: 2.5, 3: 3.0, 4: 3.5})
    assert all(abs(line[L] - (1.5 + 0.5 * L)) < 1e-12 for L in line)
    spiky = fit_line({1: 2.0, 2: 9.0, 3: 3.0, 4: 3.5, 6: 4.5, 8: 5.5})
    assert spiky[2] < 5.0 and spiky[8] > spiky[1]
