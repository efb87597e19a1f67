"""costs.py: the price curve, the draft-length policy and its losslessness.

The policy tests use synthetic price curves with known answers (a brute-force search over k).
The distribution tests decode 10,000 tokens from a bigram "model" (a table of next-token logits:
exact transitions, microseconds a call) with the policy on; the emitted sequence must be a
Markov chain with the target's transitions (ordinary rule), or EARS's exact verified-position
distribution where a draft was verified. A drafter that decides AFTER drawing (the old fixed
confidence threshold) fails the same test: the test can fail.
"""
from __future__ import annotations

import itertools
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import PretrainedConfig

from ears_core import EARSRule, GreedyRule, StandardRule, autoregressive, generate
from ears_core.policy import costs, profile
from ears_core.policy.costs import Calibration, DepthCalibration, DraftPolicy, PriceCurve, RunningPrices, round_value
from ears_core.draft.drafters import ModelDrafter
from ears_core.sampling import SamplingConfig, logits_to_probs, sample_with_uniforms
from conftest import PROMPTS, stand_in_for


def virtual_clock(now: list[float], ms_per_unit: float) -> type:
    """A ``timing.StepClock`` stand-in whose marks read ``now[0]`` (a time the test advances), in units
    of ``ms_per_unit`` milliseconds."""

    class VirtualClock:
        def __init__(self, device):
            pass

        def mark(self):
            return now[0]

        def ms(self, a, b):
            return (b - a) * ms_per_unit

    return VirtualClock


def brute_force(a, prices):
    best, arg = -1.0, 0
    for k in range(len(a) + 1):
        e = 1 + sum(np.prod(a[: i + 1]) for i in range(k))
        v = e / (k * prices.draft_ms + prices.verify(k + 1) + prices.overhead_ms)
        if v > best + 1e-12:
            best, arg = v, k
    return arg


def run_to_the_end(policy, a):
    """k for fully known estimates: the policy's stopping rule asked position by position with the
    true later estimates."""
    k, n = 0, min(len(a), policy.max_k)
    while k < n and policy.keep_going(a[: k + 1], n, future=a[k + 1 : n]):
        k += 1
    return k


def test_the_policy_picks_what_a_brute_force_search_picks():
    rng = random.Random(0)
    picked = set()
    for _ in range(500):
        m = rng.randint(2, 9)
        step = rng.uniform(5, 80)
        verify = [step]
        for _ in range(m - 1):  # a non-decreasing, sometimes flat, sometimes steep curve
            verify.append(verify[-1] + step * rng.choice([0.0, 0.03, 0.1, 0.4, 1.0]) * rng.random())
        prices = PriceCurve(verify, rng.uniform(0, 0.2) * step, rng.uniform(0, 0.1) * step)
        a = [rng.random() ** rng.choice([0.3, 1, 3]) for _ in range(m - 1)]
        want = brute_force(a, prices)
        assert run_to_the_end(DraftPolicy(prices, m - 1), a) == want  # the sequential stopping rule, run to its end
        picked.add(want)
    assert len(picked) >= 4  # the cases exercise short and long drafts alike


def test_the_policy_follows_a_curve_where_a_longer_pass_is_cheaper():
    # CPU kernels change with the rows of a pass: here V(5) < V(3) (measured on the project's
    # 2-core machine: 1.00 1.65 2.01 1.45 1.30 ...). The policy must see that 4 drafts cost less
    # than 2, on random curves of any shape against brute force, and on that one.
    rng = random.Random(1)
    for _ in range(500):
        m = rng.randint(2, 9)
        step = rng.uniform(5, 80)
        verify = [step] + [step * rng.uniform(0.9, 2.5) for _ in range(m - 1)]
        prices = PriceCurve(verify, rng.uniform(0, 0.2) * step, rng.uniform(0, 0.1) * step)
        a = [rng.random() ** rng.choice([0.3, 1, 3]) for _ in range(m - 1)]
        want = brute_force(a, prices)
        assert run_to_the_end(DraftPolicy(prices, m - 1), a) == want
    here = PriceCurve([60.0, 99.0, 120.6, 87.0, 78.0, 85.2], 3.1)
    assert brute_force([0.45] * 5, here) == 4 and run_to_the_end(DraftPolicy(here, 5), [0.45] * 5) == 4


def test_a_measured_curve_is_kept_as_measured(monkeypatch):
    # A clock that charges each pass a price by its width, slowest at 3 tokens (no wall time):
    # the measured curve keeps its dip at m = 4, 5.
    from conftest import tiny_llama
    model = tiny_llama(0)
    real, now = model.forward, [0.0]
    price_s = {1: 0.010, 2: 0.016, 3: 0.030, 4: 0.014, 5: 0.013}

    def forward(input_ids, **kw):
        now[0] += price_s.get(input_ids.shape[1], 0.0)
        return real(input_ids, **kw)

    FakeClock = virtual_clock(now, ms_per_unit=1000.0)

    monkeypatch.setattr(model, "forward", forward)
    monkeypatch.setattr("ears_core.timing.StepClock", FakeClock)
    curve = profile.measure_prices(model, max_m=5, repeats=2)
    assert [round(v, 6) for v in curve.verify_ms] == [10.0, 16.0, 30.0, 14.0, 13.0]


def test_a_curve_where_verifying_never_pays_always_picks_zero():
    # V(m) = m V(1) and a draft step dearer than the overhead: k drafts can never beat a plain step
    prices = PriceCurve([30.0 * m for m in range(1, 9)], draft_ms=2.0, overhead_ms=1.0)
    policy = DraftPolicy(prices, 7, prior=1.0)
    for a in ([1.0] * 7, [0.99] * 7, [0.5, 0.9, 0.9], [0.0]):
        assert brute_force(a, prices) == 0 and run_to_the_end(policy, a) == 0
    assert not policy.keep_going([1.0])
    assert costs.break_even_acceptance(prices, 1) == 1.0


def test_break_even_and_values_on_a_known_curve():
    prices = PriceCurve([30.0, 31.8, 33.6], draft_ms=1.5, overhead_ms=0.0)  # 1.06 and 1.12 steps
    v = round_value([0.5, 0.5], prices)
    assert v == pytest.approx([1 / 30, 1.5 / 33.3, 1.75 / 36.6])
    a1 = costs.break_even_acceptance(prices, 1)  # (1 + a) / 33.3 = 1 / 30
    assert a1 == pytest.approx(33.3 / 30 - 1, abs=1e-6)
    assert prices.steps(3) == pytest.approx(1.12) and prices.verify(5) == pytest.approx(33.6 + 2 * 1.8)
    with pytest.raises(ValueError, match="> 0 ms"):
        PriceCurve([0.0], 1.0)


def test_running_prices_and_calibration_learn_from_rounds():
    run = RunningPrices(PriceCurve([10.0, 20.0], 1.0, 0.0, measured_at="now"), alpha=0.5, measured_weight=1)
    run.observe(1, draft_ms=3.0, verify_ms=12.0, overhead_ms=2.0)  # draft and overhead were guesses: replaced
    assert run.curve.verify_ms == [10.0, 16.0] and run.curve.draft_ms == 3.0 and run.curve.overhead_ms == 2.0
    run.observe(2, draft_ms=2.0, verify_ms=99.0, overhead_ms=4.0)  # m = 3 is beyond the curve: not used
    assert run.curve.draft_ms == 2.0 and run.curve.overhead_ms == 3.0 and run.curve.verify_ms == [10.0, 16.0]
    cal = Calibration(bins=4, prior_weight=2.0)
    assert cal(0.9) == pytest.approx(0.875)  # the prior: the bin's centre
    for _ in range(8):
        cal.observe(0.9, False)
    assert cal(0.9) == pytest.approx(0.875 * 2 / 10) and cal(0.1) == pytest.approx(0.125)
    assert cal.copy().seen == cal.seen and cal.copy() is not cal


def test_a_stale_profile_is_folded_in_from_the_rounds_plain_steps():
    # Profile V = [10, 20, 30] (weight 1 each, alpha 0.5). Two plain steps of 30 ms: V(1) = 10 -> 20 -> 25,
    # the profile's share of it 1/2 -> 1/4; one pass over 2 tokens of 40 ms: V(2) = 30, share 1/2.
    run = RunningPrices(PriceCurve([10.0, 20.0, 30.0], 1.0, 0.0, measured_at="now"), alpha=0.5, measured_weight=1)
    assert run.fold_in_step() == 1.0 and run.curve.verify_ms == [10.0, 20.0, 30.0]  # no plain step seen: unchanged
    for ms in (30.0, 30.0):
        run.observe(0, draft_ms=0.0, verify_ms=ms, overhead_ms=0.0)
    run.observe(1, draft_ms=1.0, verify_ms=40.0, overhead_ms=0.0)
    assert run.curve.verify_ms == [25.0, 30.0, 30.0]
    # the rounds' own plain step is 30 ms, 3x the profile's: its part of each V(m) is tripled
    assert run.fold_in_step() == pytest.approx(3.0)
    assert run.curve.verify_ms == pytest.approx([30.0, 0.5 * 60.0 + 20.0, 90.0]) and run.profile == [30.0, 60.0, 90.0]
    run.observe(0, draft_ms=0.0, verify_ms=30.0, overhead_ms=0.0)  # it goes on learning from there
    assert run.curve.verify_ms[0] == pytest.approx(30.0)


def test_a_measurement_runs_pass_by_pass_and_stops_where_a_piece_refuses():
    from contextlib import contextmanager

    from conftest import tiny_llama
    from ears_core.model.measuring.pass_times import measure_pass_ms
    model, pieces = tiny_llama(0), []

    @contextmanager
    def piece():
        if len(pieces) == 5:
            raise RuntimeError("a request began")
        pieces.append(1)
        yield

    with pytest.raises(RuntimeError, match="a request began"):
        measure_pass_ms(model, max_m=3, repeats=2, piece=piece)
    pieces.clear()
    assert len(measure_pass_ms(model, max_m=2, repeats=1, piece=lambda: contextmanager(lambda: (yield))())) == 2


def test_a_quick_measurement_runs_one_pass_per_width_and_no_warm_up_round(monkeypatch, tmp_path):
    from conftest import tiny_llama
    from ears_core.model.measuring.pass_times import measure_pass_ms

    model = tiny_llama(0)
    widths: list[int] = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda ids, **kw: widths.append(ids.shape[1]) or forward(ids, **kw))
    measure_pass_ms(model, max_m=3, repeats=1, cache_len=8)
    assert widths == [8] + [1, 1, 2, 1, 3] * 2  # the context, then a warm-up round and a counted one
    widths.clear()
    measure_pass_ms(model, max_m=3, repeats=1, cache_len=8, warm=False)
    assert widths == [8, 1, 1, 2, 1, 3]
    widths.clear()  # a session's first use with nothing cached and a background to measure it later: quick
    curve = profile.load_or_measure(model, max_m=3, cache_dir=tmp_path, quick=True)
    assert curve.provisional and len(curve.verify_ms) == 3 and widths[0] == 64 and len(widths) == 6


def test_a_depth_calibration_keeps_one_table_per_draft_depth():
    cal = DepthCalibration([Calibration(bins=4, prior_weight=2.0) for _ in range(2)])
    for _ in range(8):
        cal.observe(0.9, True, depth=1)
        cal.observe(0.9, False, depth=2)
        cal.observe(0.9, False, depth=5)  # deeper than the tables: the last one learns it
    assert cal(0.9, 1) == pytest.approx((8 + 2 * 0.875) / 10)
    assert cal(0.9, 2) == cal(0.9, 7) == pytest.approx(2 * 0.875 / 18)
    assert cal.tables[1].seen == [0, 0, 0, 16]
    assert cal.means(3) == pytest.approx([(8 + 2 * 0.4) / 10, 2 * 0.4 / 18, 2 * 0.4 / 18])
    twin = cal.copy()
    twin.observe(0.1, True, depth=2)
    assert twin.tables[1].seen != cal.tables[1].seen  # copies do not share counts


def test_the_drift_ratio_corrects_a_table_measured_on_other_text():
    # a table that learnt 0.8 at depth 1 from 1,000 drafts, on text where drafts now stand half as
    # often: the bins alone would need thousands of rounds; the drift ratio corrects it in a hundred
    def table() -> Calibration:
        return Calibration(bins=4, prior_weight=2.0, stood=[0.0, 0.0, 0.0, 800.0], seen=[0.0, 0.0, 0.0, 1000.0])

    slow = DepthCalibration([table(), table()])
    fast = DepthCalibration([table(), table()], drift_memory=32.0, drift_prior=4.0)
    assert fast(0.9, 1) == slow(0.9, 1) == pytest.approx((800 + 2 * 0.875) / 1002)  # no evidence yet: ratio 1
    rng = random.Random(3)
    for _ in range(200):
        stood = rng.random() < 0.4
        slow.observe(0.9, stood, depth=1)
        fast.observe(0.9, stood, depth=1)
    assert slow(0.9, 1) > 0.7  # the bin still holds its 1,000 old drafts
    assert fast(0.9, 1) == pytest.approx(0.4, abs=0.1)
    assert fast.drift(2) == 1.0 and fast(0.9, 2) == slow(0.9, 2)  # depth 2 saw nothing: untouched
    assert fast.means(2)[0] == pytest.approx(fast.tables[0].mean() * fast.drift(1)) and fast.means(2)[0] < 0.6
    twin = fast.copy()
    assert twin(0.9, 1) == fast(0.9, 1)  # a copy keeps the ratio ...
    twin.observe(0.9, True, depth=1)
    assert twin(0.9, 1) != fast(0.9, 1)  # ... and does not share it
    good = DepthCalibration([table()], drift_memory=32.0)
    for _ in range(100):
        good.observe(0.9, True, depth=1)  # better than the table: up, but never above 1
    assert 0.8 < good(0.9, 1) <= 1.0


def test_the_policy_reads_a_prior_per_depth_for_positions_not_drafted_yet():
    # a first draft at 0.9 does not pay alone (1.9 / 20 < 1 / 10) but does with two more at 0.9 each
    # ((1 + 0.9 + 0.81 + 0.729) / 25 > 1 / 10): the answer rests on the priors of depths 2 and 3
    curve = PriceCurve([10.0, 20.0, 20.0, 25.0], draft_ms=0.0)
    assert DraftPolicy(curve, 3, prior=0.9).keep_going([0.9])
    assert DraftPolicy(curve, 3, prior=[0.0, 0.9, 0.9]).keep_going([0.9])  # depth 1's own prior is not read
    assert not DraftPolicy(curve, 3, prior=[0.9, 0.0, 0.0]).keep_going([0.9])
    assert DraftPolicy(curve, 3, prior=[0.9, 0.9, 0.0]).keep_going([0.9])  # k = 2: (1 + .9 + .81) / 20 > 1 / 10


def test_a_position_already_computed_is_not_saved_by_stopping_before_it():
    # verify 10 / 10 / 10.5 ms for 1 / 2 / 3 tokens, 2 ms a draft step. Estimates 0.9 then 0.1:
    # verifying position 2 gives (1 + 0.9 + 0.09) / (2 * 2 + 10.5) = 0.1372 tokens/ms. Stopping at 1
    # before computing position 2 gives 1.9 / 12 = 0.1583 (stop); after the step that computed it,
    # 1.9 / 14 = 0.1357 (go on). At 0.01: 1.909 / 14.5 = 0.1317, a stop either way.
    curve = PriceCurve([10.0, 10.0, 10.5, 11.0, 11.5], draft_ms=2.0)
    policy = DraftPolicy(curve, 4, prior=0.0)
    assert not policy.keep_going([0.9, 0.1])
    assert policy.keep_going([0.9, 0.1], looked=True)
    assert not policy.keep_going([0.9, 0.01], looked=True)
    free = DraftPolicy(PriceCurve([10.0] * 5, draft_ms=0.0), 4, prior=0.0)  # nothing to sink: looked changes nothing
    assert all(free.keep_going(a) == free.keep_going(a, looked=True) for a in ([0.9, 0.1], [0.5, 0.0], [0.2]))


class _SpyPolicy(DraftPolicy):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked: list[tuple[int, bool]] = []  # (position asked about, looked)

    def keep_going(self, a_known, limit=None, future=None, looked=False):
        self.asked.append((len(a_known), looked))
        return super().keep_going(a_known, limit, future, looked)


def test_the_decode_loop_counts_a_model_step_spent_on_a_later_position_and_none_for_ngrams(tiny_pair):
    from ears_core.draft.drafters import NGramDrafter

    target, draft = tiny_pair
    curve = PriceCurve([10.0, 10.1, 10.2, 10.3, 10.4], 0.5, 0.0)
    prompt = PROMPTS[0] * 3  # repeats, so the n-gram drafter finds matches
    for drafter, sunk in ((ModelDrafter(draft), True), (NGramDrafter(target.config.vocab_size), False)):
        pol = _SpyPolicy(curve, 4)
        generate(target, drafter, prompt, rule=StandardRule(), k=4, temperature=0, max_new_tokens=24,
                 policy=pol, calibration=Calibration(prior_weight=0.0))
        with_conf = [(i, looked) for i, looked in pol.asked if i >= 1]
        assert any(i >= 2 for i, _ in with_conf), type(drafter).__name__
        assert all(looked == (sunk and i >= 2) for i, looked in with_conf), (type(drafter).__name__, with_conf)


def test_load_or_measure_caches_the_profile_per_machine_key(tmp_path, monkeypatch):
    from conftest import tiny_llama
    model = tiny_llama(0)
    first = profile.load_or_measure(model, max_m=4, cache_dir=tmp_path)
    assert len(first.verify_ms) == 4 and all(v > 0 for v in first.verify_ms)
    files = list((tmp_path / "costs").glob("*.json"))
    assert len(files) == 1 and "threads=" in json.loads(files[0].read_text())["key"]
    monkeypatch.setattr(profile, "measure_prices", stand_in_for(model, lambda *a, **k: pytest.fail("measured again")))
    assert profile.load_or_measure(model, max_m=4, cache_dir=tmp_path).verify_ms == first.verify_ms


def test_a_slower_refresh_is_used_but_not_cached(tmp_path, monkeypatch):
    # Contention only adds time: a re-measurement slower than the cached profile serves this
    # process, and the file keeps the faster one; a faster re-measurement replaces it.
    from conftest import tiny_llama
    model = tiny_llama(0)
    curves = iter([PriceCurve([10.0, 11.0], 1.0, measured_at="a"), PriceCurve([30.0, 20.0], 1.0, measured_at="b"),
                   PriceCurve([25.0, 26.0], 1.0, measured_at="b2"), PriceCurve([8.0, 9.0], 1.0, measured_at="c")])
    monkeypatch.setattr(profile, "measure_prices", stand_in_for(model, lambda *a, **k: next(curves)))
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path).verify_ms == [10.0, 11.0]
    # much slower: measured once more, the faster of the two per m serves this process only
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path, refresh=True).verify_ms == [25.0, 20.0]
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path).verify_ms == [10.0, 11.0]
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path, refresh=True).verify_ms == [8.0, 9.0]
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path).verify_ms == [8.0, 9.0]


def test_a_refresh_caught_in_a_slow_moment_is_measured_again(tmp_path, monkeypatch):
    # The machine jitters for seconds at a time: a second measurement that reads like the cached one
    # wins, per m, and is cached.
    from conftest import tiny_llama
    model = tiny_llama(0)
    curves = iter([PriceCurve([10.0, 11.0], 1.0, measured_at="a"), PriceCurve([16.0, 18.0], 1.0, measured_at="b"),
                   PriceCurve([10.5, 12.5], 1.0, measured_at="c")])
    monkeypatch.setattr(profile, "measure_prices", stand_in_for(model, lambda *a, **k: next(curves)))
    profile.load_or_measure(model, max_m=2, cache_dir=tmp_path)
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path, refresh=True).verify_ms == [10.5, 12.5]
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path).verify_ms == [10.5, 12.5]


def test_a_refresh_a_little_slower_replaces_the_cached_shape(tmp_path, monkeypatch):
    # The machine drifts (a step 10 % slower) and the curve's shape with it: that is not contention.
    from conftest import tiny_llama
    model = tiny_llama(0)
    curves = iter([PriceCurve([10.0, 10.5], 1.0, measured_at="a"), PriceCurve([11.0, 13.2], 1.0, measured_at="b")])
    monkeypatch.setattr(profile, "measure_prices", stand_in_for(model, lambda *a, **k: next(curves)))
    profile.load_or_measure(model, max_m=2, cache_dir=tmp_path)
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path, refresh=True).verify_ms == [11.0, 13.2]
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path).verify_ms == [11.0, 13.2]


# --------------------------------------------------------------------- losslessness with the policy


class Bigram(torch.nn.Module):
    """A causal "LM" whose next-token logits depend on the last token only: table (V, V)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table
        self.config = PretrainedConfig(vocab_size=table.shape[0], max_position_embeddings=10**6, num_hidden_layers=1)
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.generation_config = SimpleNamespace(eos_token_id=None)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def get_output_embeddings(self):
        return None

    def forward(self, ids, past_key_values=None, use_cache=True, logits_to_keep=1, output_hidden_states=False):
        if past_key_values is not None:  # a cache entry per token, so that the loop's crop() is real
            kv = torch.zeros(1, 1, ids.shape[1], 1)
            past_key_values.update(kv, kv, 0)
        return SimpleNamespace(logits=self.table[ids[:, -logits_to_keep:]], hidden_states=None)


class BigramDrafter:
    """Drafts from its own bigram table. ``after_draw`` (the old threshold): drop a drawn token
    whose own probability is below the threshold, a decision made after the draw."""

    needs_target_hidden = False

    def __init__(self, table: torch.Tensor, after_draw: float | None = None) -> None:
        self.table, self.after_draw, self.vocab_size = table, after_draw, table.shape[0]
        self.confidence: list[float] = []

    def prefill(self, input_ids, target_hidden):
        self.last = int(input_ids[0, -1])

    def propose(self, k, probs_fn, uniforms, keep=None):
        toks, probs, self.confidence, last = [], [], [], self.last
        for i in range(k):
            logits = self.table[last]
            conf = float(torch.softmax(logits, -1).max())
            if keep is not None and not keep(conf):
                break
            pr = probs_fn(logits[None])  # (1, V)
            tok = sample_with_uniforms(pr, uniforms[:, i])
            if self.after_draw is not None and float(torch.softmax(logits, -1)[tok]) < self.after_draw:
                break
            self.confidence.append(conf)
            toks.append(tok)
            probs.append(pr)
            last = int(tok)
        self.proposed = toks
        if not toks:
            return torch.empty((1, 0), dtype=torch.long), torch.empty((1, 0, self.vocab_size))
        return torch.stack(toks, 1), torch.stack(probs, 1)

    def commit(self, n, next_token, target_hidden):
        self.last = int(next_token.reshape(-1)[0])


V, T = 6, 0.9


def tables():
    g = torch.Generator().manual_seed(5)
    target = torch.randn(V, V, generator=g) * 0.9
    draft = target + torch.randn(V, V, generator=g) * 0.9  # agrees often, not always
    return target, draft


def transition_test(events, start, expected_of):
    """chi-squared of the emitted tokens' counts per (previous token, verified?) cell against
    ``expected_of(prev, verified)`` (V,) -> p-value, cells used."""
    obs, exp = {}, {}
    prev = start
    for ev in events:
        verified = ev.kind in ("accepted", "pardoned", "resampled")
        key = (prev, verified)
        obs.setdefault(key, np.zeros(V))[ev.token_id] += 1
        prev = ev.token_id
    o, e = [], []
    for key, counts in obs.items():
        dist = expected_of(*key)
        o.append(counts)
        e.append(dist * counts.sum())
    o, e = np.concatenate(o), np.concatenate(e)
    ok = e > 0
    assert o[~ok].sum() == 0  # nothing emitted where the distribution has no mass
    stat = float((((o - e) ** 2)[ok] / e[ok]).sum())
    dof = int(ok.sum()) - len(obs)  # each (prev, verified) row's counts are fixed by its total
    return float(stats.chi2.sf(stat, dof)), len(obs)


def policy():
    # V(1..3) nearly flat, a draft step and overhead: break-even near the drafts' typical confidence
    return DraftPolicy(PriceCurve([10.0, 13.0, 16.0], draft_ms=1.5, overhead_ms=0.5), max_k=2)


def decode(rule, drafter, n=10_000, seed=0):  # 10,000: a drafter deciding after the draw at 0.1 gives p 1e-33
    t_table, _ = tables()
    out = generate(Bigram(t_table), drafter, [0], rule=rule, k=2, temperature=T, max_new_tokens=n, seed=seed,
                   policy=policy(), calibration=Calibration(prior_weight=8.0))
    return out


def probs(table_row):
    return logits_to_probs(table_row[None], SamplingConfig(T))[0].double().numpy()


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_policy_keeps_the_rule_exact_over_10000_tokens(beta):
    t_table, d_table = tables()
    rule = StandardRule() if beta == 0 else EARSRule(beta)
    out = decode(rule, BigramDrafter(d_table))
    drafted = [s.drafted for s in out.steps]
    assert {0, 1, 2} <= set(drafted)  # the policy really varies k, so the test can see a bias

    def expected(prev, verified):
        p = probs(t_table[prev])
        if not verified or beta == 0:
            return p
        q = probs(d_table[prev])
        tol = beta * (1 - p.max())
        a = np.where(p > 0, np.minimum(1, p / np.maximum(q, 1e-10) + tol), 0)
        res = np.maximum(p - q, 0)
        res = res / res.sum()
        return q * a + (1 - (q * a).sum()) * res

    pvalue, cells = transition_test(out.events, 0, expected)
    assert cells >= V + 2 and pvalue > 1e-4  # verified and unverified positions after several tokens


@pytest.mark.slow
def test_deciding_after_the_draw_is_caught_by_the_same_test():
    t_table, d_table = tables()
    out = decode(StandardRule(), BigramDrafter(d_table, after_draw=0.3))
    pvalue, _ = transition_test(out.events, 0, lambda prev, verified: probs(t_table[prev]))
    assert pvalue < 1e-6


# --------------------------------------------------------------------------- greedy stays greedy


def test_greedy_with_the_policy_equals_the_targets_greedy_output(tiny_pair):
    target, draft = tiny_pair
    pol = DraftPolicy(PriceCurve([10.0, 10.5, 11.0, 11.5, 12.0], 0.3, 0.2), max_k=4)
    for prompt in PROMPTS:
        ref = autoregressive(target, prompt, temperature=0, max_new_tokens=24)
        out = generate(target, ModelDrafter(draft), prompt, rule=GreedyRule(), k=4, temperature=0,
                       max_new_tokens=24, policy=pol, calibration=Calibration())
        assert out.token_ids == ref.token_ids
        assert all(len(s.estimates) == s.drafted and (s.expected is None) == (s.drafted > 0 and False) for s in out.steps)
    drafted = [s.drafted for s in out.steps]
    assert max(drafted) > 0


def test_a_policy_that_never_drafts_is_target_only_draw_for_draw(tiny_pair):
    # k = 0 rounds skip verify() (the plain-step fast path) but use the same draw per position
    target, draft = tiny_pair
    dear = DraftPolicy(PriceCurve([10.0 * m for m in range(1, 6)], 1.0, 0.0), max_k=4)
    for prompt, temperature in ((PROMPTS[0], 0.9), (PROMPTS[2], 1.3)):
        ref = autoregressive(target, prompt, temperature=temperature, max_new_tokens=20, seed=7)
        out = generate(target, ModelDrafter(draft), prompt, rule=EARSRule(0.3), k=4, temperature=temperature,
                       max_new_tokens=20, seed=7, policy=dear, calibration=Calibration())
        assert out.token_ids == ref.token_ids and {e.kind for e in out.events} == {"target"}
        assert [e.p for e in out.events] == pytest.approx([e.p for e in ref.events], rel=1e-4)
        probes = [s for s in out.steps if s.estimates or s.drafted]
        assert not probes  # nothing was drafted; rounds 2-3, 5-8, ... did not even ask the drafter


def test_a_session_starts_from_the_drafters_shipped_calibration():
    from ears_core.serve.session import Session

    table = {"greedy": {"bins": 10, "stood": [0.0] * 9 + [9.0], "seen": [10.0] * 10},
             "sampled": {"bins": 10, "stood": [5.0] * 10, "seen": [10.0] * 10}}
    pair = SimpleNamespace(draft=SimpleNamespace(calibration_table=table))
    session = Session(pair, prices=PriceCurve([10.0, 10.5], 0.5))
    greedy, sampled = session._initial_calibration(0.0), session._initial_calibration(0.9)
    assert greedy(0.95) == pytest.approx((9 + 4 * 0.95) / 14) and greedy(0.05) == pytest.approx(4 * 0.05 / 14)
    assert sampled(0.05) == pytest.approx((5 + 4 * 0.05) / 14)
    table["greedy"]["depths"] = [{"stood": [8.0] * 10, "seen": [10.0] * 10}, {"stood": [1.0] * 10, "seen": [10.0] * 10}]
    chain, pooled = session._initial_calibration(0.0), session._initial_calibration(0.0, by_depth=False)
    assert isinstance(chain, DepthCalibration) and isinstance(pooled, Calibration)
    assert chain(0.05, 1) == pytest.approx((8 + 0.2) / 14) and chain(0.05, 3) == pytest.approx((1 + 0.2) / 14)
    assert chain.drift_memory > 0  # a shipped table follows the text at hand (its drift ratio)
    assert pooled(0.95) == greedy(0.95)
    bare = Session(SimpleNamespace(draft=object()), prices=PriceCurve([10.0], 0.5))
    assert bare._initial_calibration(0.0)(0.55) == pytest.approx(0.55)  # no table: the prior


def test_probes_back_off_only_while_an_average_first_draft_would_not_pay(tiny_pair):
    """The tiny draft's confidence stays in the low bin, where no draft ever stood: every probe
    drafts nothing. With a high mean acceptance (the high bin) drafting pays on average, so every
    round asks the drafter again; with a mean of 0 the probes back off (2, 4, 8 rounds)."""
    target, draft = tiny_pair
    cheap = PriceCurve([10.0, 10.1, 10.2, 10.3, 10.4], 0.5, 0.0)

    def asked(high_bin_stood):
        drafter = ModelDrafter(draft)
        calls = []
        inner = drafter.propose
        drafter.propose = lambda k, *a, **kw: calls.append(k) or inner(k, *a, **kw)
        cal = Calibration(bins=2, prior_weight=0.0, stood=[0.0, high_bin_stood], seen=[1000.0, 9000.0])
        out = generate(target, drafter, PROMPTS[0], rule=StandardRule(), k=4, temperature=1.0,
                       max_new_tokens=30, seed=3, policy=DraftPolicy(cheap, 4), calibration=cal)
        assert sum(s.drafted for s in out.steps) == 0  # every confidence fell in the hopeless bin
        return sum(1 for k in calls if k > 0), len(out.steps)

    probes, rounds = asked(9000.0)
    assert probes >= rounds - 1  # every round but the last (k = 0 at the end) was a probe
    backed_off, rounds = asked(0.0)
    assert backed_off <= rounds // 2


def test_a_price_curve_measured_through_a_slow_spell_keeps_its_shape(monkeypatch):
    """A pass over m tokens costs 10 + m virtual ms (the step: 10), and every pass runs 1.5x slower
    except seven in a row early on (a fast spell). Each wide pass is timed right after a one-token
    pass and priced by their ratio, so the curve is the true one; the fastest pass of each width alone
    would read the widths never caught in the fast spell 1.5x too dear."""
    import ears_core.timing as timing
    from conftest import tiny_llama
    from ears_core.model.measuring.pass_times import measure_pass_ms

    model, now, calls = tiny_llama(0), [0.0], []

    VirtualClock = virtual_clock(now, ms_per_unit=1.0)

    def advance(module, args, output):
        m = args[0].shape[1]
        if m > 9:  # the cache's prompt, not a timed pass
            return
        fast = 17 <= len(calls) < 24
        now[0] += (10.0 + (m if m > 1 else 0)) * (1.0 if fast else 1.5)
        calls.append(m)

    monkeypatch.setattr(timing, "StepClock", VirtualClock)
    hook = model.register_forward_hook(advance)
    try:
        curve = measure_pass_ms(model, max_m=9, repeats=5)
    finally:
        hook.remove()
    assert curve == pytest.approx([10.0] + [10.0 + m for m in range(2, 10)])
    assert calls[17:24] == [1, 1, 2, 1, 3, 1, 4]  # the fast spell: one step and three pairs
