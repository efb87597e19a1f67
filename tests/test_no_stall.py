"""No stall on a request's path: a stale price curve is folded in at once and measured again only
between requests (serve/prices.py, serve/between.py); the wall clock, time to first token and why
the clocks differ (decode/generation.py, metrics.clock_parts, serve/summary.py)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import ears_core.policy.profile as costs
import ears_core.serve.between as between
import ears_core.serve.prices as prices_mod
from conftest import PROMPTS
from ears_core.decode.api import stream
from ears_core.events import StepRecord
from ears_core.metrics import BETWEEN_TOKENS, SETUP, clock_parts
from ears_core.pair import ModelPair
from ears_core.policy.costs import PriceCurve
from ears_core.rules import GreedyRule, StandardRule
from ears_core.serve.between import BetweenRequests
from ears_core.serve.prices import ON_PATH
from ears_core.serve.runs import ActivityLog, Busy
from ears_core.serve.session import RunConfig, Session
from ears_core.serve.summary import clock_note, summary_rows

PRICES = PriceCurve([10.0, 10.4, 10.8, 11.4, 12.2, 13.4, 15.0, 17.0, 19.5], 0.4, 0.3, measured_at="test")


def tiny_session(tiny_pair, tmp_path, activity=None, **kw) -> Session:
    target, draft = tiny_pair
    pair = ModelPair(target, draft, None, torch.device("cpu"), torch.float32, "tiny", 96, "tiny-draft")
    return Session(pair, activity or ActivityLog(), cache_dir=tmp_path, **kw)


def plain_steps(n: int, ms: float) -> SimpleNamespace:
    """A finished run as ``absorb`` reads it: n plain target steps of ``ms`` each."""
    return SimpleNamespace(steps=[StepRecord(i, 0, 0, 0, 1, 0.0, ms) for i in range(n)])


def test_a_request_started_right_after_the_refresh_flag_streams_with_no_price_measurement_on_its_path(
        tiny_pair, tmp_path, monkeypatch):
    """The rounds find the curve stale (plain steps 3x the profile's): it is folded in at once, and a
    request started right then prices with it and streams its first token after the prefill and one
    verify pass, in its own thread, while the new measurement runs only in the background and never
    during one of the request's forward passes."""
    monkeypatch.setattr(between, "QUIET_S", 0.05)
    activity = ActivityLog()
    session = tiny_session(tiny_pair, tmp_path, activity, prices=PRICES, background_prices=True)
    target = session.pair.target
    passes, forwards, lock = [], [], threading.Lock()  # (thread, start, end) of measurement passes / forwards
    real = costs.measure_pass_ms

    def spy(model, *a, piece=None, **kw):
        if model is not target:  # another server's pair, measured between its own requests
            return real(model, *a, piece=piece, **kw)

        @contextmanager
        def watched():
            with (piece or nullcontext)():
                t0 = time.perf_counter()
                yield
                with lock:
                    passes.append((threading.get_ident(), t0, time.perf_counter()))
        return real(model, *a, piece=watched, **kw)

    monkeypatch.setattr(costs, "measure_pass_ms", spy)
    starts: dict[int, float] = {}
    pre = target.register_forward_pre_hook(lambda *a: starts.__setitem__(threading.get_ident(), time.perf_counter()))
    post = target.register_forward_hook(lambda *a: forwards.append((threading.get_ident(), starts[threading.get_ident()],
                                                                     time.perf_counter())))
    me = threading.get_ident()
    try:
        session.absorb(plain_steps(8, 30.0), GreedyRule(), 0.0)
        assert session.pricing.pending  # the refresh flag is set ...
        assert session.prices.verify_ms == pytest.approx([3 * v for v in PRICES.verify_ms])  # ... and folded in
        run = session.speculative(torch.tensor([PROMPTS[2]]), RunConfig(rule="greedy", params={}, temperature=0,
                                                                        max_new_tokens=16))
        events = iter(run)
        next(events)
        assert [t for t, _, _ in forwards].count(me) == 2  # the prefill and one round's verify pass: the first token
        for _ in events:
            pass
    finally:
        pre.remove()
        post.remove()
    assert session.pricing.wait(60)  # measured between requests ...
    mine = [(a, b) for t, a, b in forwards if t == me]
    assert passes and all(t != me for t, _, _ in passes)  # ... never in the request's thread
    assert not [p for p in passes for a, b in mine if p[1] < b and a < p[2]]  # nor during one of its passes
    assert session.prices.measured_at != "test"
    session.close()


def test_a_request_puts_a_background_measurement_aside_and_it_runs_again_at_the_next_quiet(monkeypatch):
    monkeypatch.setattr(between, "QUIET_S", 0.02)
    activity = ActivityLog()
    running, began, calls, results = threading.Event(), threading.Event(), [], []

    def job(piece):
        calls.append(activity.active)
        if len(calls) == 1:  # the first attempt runs until a request begins (its next piece is refused) ...
            while not began.is_set():
                with piece():
                    running.set()
                    time.sleep(0.001)
            with piece():
                pass
            return "overlapped a request"  # ... or, if the request came and went between two pieces, ends
        with piece():
            return "measured"

    runner = BetweenRequests(activity, job, results.append)
    runner.request()
    assert running.wait(30)
    mark = activity.begin()  # a request begins: it waits for the piece in hand, no more
    began.set()
    assert mark["waited_s"] >= 0 and runner.pending and results == []
    with pytest.raises(Busy):  # any further piece is refused while it decodes
        with activity.piece():
            pass
    activity.end(mark)
    assert runner.wait(30) and results == ["measured"]  # the first attempt is thrown away, the job tried again
    assert runner.attempts == 2 and calls == [0, 0]  # neither attempt started while the request ran
    runner.close()
    runner.request()
    assert not runner.pending and runner.attempts == 2  # closed: nothing more runs


def test_a_stale_curve_without_the_background_is_folded_in_and_nothing_is_measured(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setattr(prices_mod, "load_or_measure", lambda *a, **k: pytest.fail("measured"))
    session = tiny_session(tiny_pair, tmp_path, prices=PRICES)
    session.absorb(plain_steps(7, 30.0), GreedyRule(), 0.0)
    assert session.prices.verify_ms[1:] == PRICES.verify_ms[1:]  # too short a run to call the curve stale
    session.absorb(plain_steps(8, 30.0), GreedyRule(), 0.0)
    assert session.prices.verify_ms[1:] == pytest.approx([3 * v for v in PRICES.verify_ms[1:]])
    assert not session.pricing.pending


def test_a_first_use_measurement_on_a_requests_path_is_labelled_in_its_waits(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setattr(prices_mod, "load_or_measure", lambda *a, **k: PRICES)
    session = tiny_session(tiny_pair, tmp_path)  # no curve yet: the first request's path reads or measures one
    cfg = RunConfig(rule="standard", params={}, max_new_tokens=4, draft_shape="chain")
    since = time.perf_counter()
    session.resolved(cfg)
    run = session.speculative(torch.tensor([PROMPTS[0]]), cfg, since=since)
    assert ON_PATH in run.gen.waits and run.gen.started_at == since
    later = session.speculative(torch.tensor([PROMPTS[0]]), cfg, since=time.perf_counter())
    assert ON_PATH not in later.gen.waits


def test_stats_carry_the_wall_clock_and_time_to_first_token_and_the_summary_says_why_they_differ(tiny_pair):
    target, draft = tiny_pair
    gen = stream(target, draft, PROMPTS[2], rule=StandardRule(), k=3, max_new_tokens=12)
    gen.started_at -= 2.0  # the request came 2 s before the Generation was made ...
    gen.waits[ON_PATH] = 1.5  # ... 1.5 s of it measuring prices on its path
    stats = gen.result().stats
    assert stats.wall_s >= stats.decode_s + 2.0 and stats.setup_s >= 2.0
    assert stats.ttft_s >= 2.0 and 0 < stats.first_token_decode_s <= stats.decode_s
    assert stats.wall_tokens_per_s == pytest.approx(stats.new_tokens / stats.wall_s)
    parts = dict(clock_parts(stats))
    assert parts[ON_PATH] == 1.5 and parts[SETUP] == pytest.approx(stats.setup_s - 1.5)
    assert sum(parts.values()) == pytest.approx(stats.wall_s - stats.decode_s)
    assert list(parts)[0] == ON_PATH and set(parts) <= {ON_PATH, SETUP, BETWEEN_TOKENS}
    rows = dict(summary_rows(stats, 10.0, baseline_wall_tps=10.0))
    assert f"{ON_PATH}: 1.50 s" in rows["wall vs decode clock"]
    assert rows["time to first token"].startswith(f"{stats.ttft_s:.2f} s on the wall clock")
    assert f"{stats.wall_s:.2f} s" in rows["wall clock"] and "speedup, wall clock" in rows
    close = replace(stats, wall_s=stats.decode_s * 1.04, setup_s=stats.decode_s * 0.03, waits={})
    assert clock_note(close) == "" and "wall vs decode clock" not in dict(summary_rows(close))
    assert "wall clock" not in dict(summary_rows(replace(stats, wall_s=None)))  # a stats with no wall clock
