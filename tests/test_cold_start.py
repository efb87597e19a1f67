"""A cold start measures nothing a default can stand in for (issue 57): the lean target without timing the float
one, the row plan and the head's kernels by default and settled between requests, a quick provisional price
curve, and a measurement the busy cores spoil detected and made again.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import ears_core.timing
from ears_core.model.kernels import cpu_forms
from ears_core.model.measuring import lean_plan
from ears_core.model.loading.lean_target import from_float_model, supported
from ears_core.pair import ModelPair, Pending
from ears_core.policy import profile
from ears_core.policy.costs import PriceCurve
from ears_core.serve.between import BetweenRequests
from ears_core.serve.runs import ActivityLog
from ears_core.timing import MachineBusy, RunQueue, cores_crowded

from conftest import crowded_cores, stand_in_for, tiny_llama


def _busy(monkeypatch, shares):
    """RunQueue reads the given waited shares in turn (module timing.py), with the real threshold, in this thread
    only: another test's background measurement still running in this worker reads quiet and takes none."""
    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 0.2)
    it, here = iter(shares), threading.current_thread()

    class Queue(RunQueue):
        def __exit__(self, *exc):
            super().__exit__(*exc)  # the watch ends (timing.py: given up), then reads the share given
            self.waited_share = next(it) if threading.current_thread() is here else 0.0

    return Queue


def test_the_run_queue_sees_another_job_on_the_cores():
    with RunQueue() as quiet:
        time.sleep(0.05)
    assert 0.0 <= quiet.waited_share <= 1.0
    if not list(__import__("pathlib").Path("/proc/self/task").glob("*/schedstat")):
        pytest.skip("this kernel does not report run-queue waits")
    # this thread spinning while other processes spin on every core, twice over: it waits for a core most of the time
    with crowded_cores():
        with RunQueue() as crowded:
            stop = time.perf_counter() + 0.6
            while time.perf_counter() < stop:
                pass
    assert crowded.waited_share > 0.3, crowded.waited_share  # a fair share is 1 core in 2 * cores + 1


def test_crowded_cores_are_seen_and_a_quiet_machine_is_not(monkeypatch):
    """timing.py, crowded: the probe that sends a load to one thread."""
    if not list(__import__("pathlib").Path("/proc/self/task").glob("*/schedstat")):
        pytest.skip("this kernel does not report run-queue waits")
    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 0.2)
    assert not cores_crowded(1)  # one thread never waits for its peers
    with crowded_cores():
        assert cores_crowded(2)


def _ticks(monkeypatch, *readings):
    """timing.cpu_ticks reads the given (stolen, wanted) ticks in turn; the run queue reads nothing waited."""
    it = iter(readings)
    monkeypatch.setattr(ears_core.timing, "cpu_ticks", lambda: next(it))
    monkeypatch.setattr(ears_core.timing, "_schedstat", dict)
    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 0.2)


@pytest.mark.parametrize("readings,share", [(((100, 1000), (400, 1600)), 0.5), (((100, 1000), (110, 1100)), 0.1),
                                            (((100, 1000), (130, 1040)), 0.0), ((None, None), 0.0)],
                         ids=["half stolen", "a tenth", "too short to say", "not reported"])
def test_time_the_hypervisor_took_is_read_beside_the_run_queue(monkeypatch, readings, share):
    """timing.py, stolen: a measurement reads busy where more than BUSY_SHARE of the CPU time it wanted went to
    other guests, over STEAL_MIN_TICKS at least; a run's crowding watch (no steal) never reads the ticks."""
    _ticks(monkeypatch, *readings)
    with RunQueue(steal=True) as measured:
        pass
    assert measured.stolen_share == share and measured.busy == (share > 0.2)
    monkeypatch.setattr(ears_core.timing, "cpu_ticks", lambda: pytest.fail("read without steal"))
    with RunQueue() as watched:
        pass
    assert watched.stolen_share == 0.0 and not watched.busy


def test_the_machine_reports_its_stolen_ticks():
    first = ears_core.timing.cpu_ticks()
    if first is None:
        pytest.skip("no /proc/stat here")
    time.sleep(0.05)
    second = ears_core.timing.cpu_ticks()
    assert 0 <= first[0] <= first[1] and second[0] >= first[0] and second[1] >= first[1]


def test_measurements_made_while_the_hypervisor_took_the_cores_are_made_again_or_refused(monkeypatch):
    """A price curve measured in a spell of steal is measured again (the quiet one kept); a kernel choice
    measured in one raises MachineBusy naming it (the caller keeps its default: pair.py, provisional)."""
    from ears_core.model.measuring import measured

    _ticks(monkeypatch, (0, 0), (500, 1000), (500, 1000), (510, 2000))
    calls = []
    monkeypatch.setattr(profile, "measure_prices", stand_in_for(None, lambda *a, **k: calls.append(1) or "curve"))
    assert profile.measured_quietly(None, max_m=3, key="k") == ("curve", False) and len(calls) == 2
    _ticks(monkeypatch, (0, 0), (500, 1000))
    with pytest.raises(MachineBusy, match="measuring the head's form"):
        measured.quietly("the head's form", lambda: 1)


@pytest.mark.parametrize("crowded", [False, True])
def test_a_load_runs_on_one_thread_where_the_cores_are_crowded(monkeypatch, crowded):
    import ears_core.pair

    seen = []
    monkeypatch.setattr(ears_core.pair, "cores_crowded", lambda threads: crowded)
    monkeypatch.setattr(ears_core.pair, "_load_pair", lambda *a: seen.append(torch.get_num_threads()) or _Loaded())
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ears_core.pair.load_pair("embedded", None, device="cpu")
        assert seen == [1 if crowded else 2] and torch.get_num_threads() == 2  # the caller's count is back
    finally:
        torch.set_num_threads(before)


class _Loaded:
    rows_exact = True


def test_a_price_measurement_made_under_contention_is_made_again(monkeypatch, tmp_path):
    model = tiny_llama(0)
    monkeypatch.setattr(profile, "RunQueue", _busy(monkeypatch, [0.6, 0.05]))
    calls = []
    real = profile.measure_prices
    here = threading.current_thread()  # another test's background measurement may still run in this worker
    monkeypatch.setattr(profile, "measure_prices",
                        lambda *a, **k: (threading.current_thread() is here and calls.append(1)) or real(*a, **k))
    curve = profile.load_or_measure(model, max_m=3, cache_dir=tmp_path)
    assert len(calls) == 2 and not curve.provisional  # busy, then quiet: the quiet one is cached
    assert list((tmp_path / "costs").glob("*.json"))


def test_a_measurement_busy_throughout_is_never_cached_and_is_put_aside_in_the_background(monkeypatch, tmp_path):
    model = tiny_llama(0)
    monkeypatch.setattr(profile, "RunQueue", _busy(monkeypatch, [0.6] * 6))
    curve = profile.load_or_measure(model, max_m=3, cache_dir=tmp_path)  # a caller's thread: for this process only
    assert curve.verify_ms and not list((tmp_path / "costs").glob("*.json"))
    with pytest.raises(MachineBusy):
        profile.load_or_measure(model, max_m=3, cache_dir=tmp_path, piece=lambda: __import__("contextlib").nullcontext())


def _schedstat_growing(monkeypatch, waited: float) -> None:
    """timing._schedstat: one thread that has wanted a core 0.1 s more at every reading, ``waited`` of it waiting;
    a watch looks at every chance it gets (timing.py: given up)."""
    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 0.2)
    monkeypatch.setattr(ears_core.timing, "EARLY_EVERY_S", 0.0)
    monkeypatch.setattr(ears_core.timing, "cpu_ticks", lambda: None)
    wanted = iter(range(0, 10**12, 10**8))
    monkeypatch.setattr(ears_core.timing, "_schedstat",
                        lambda: {"1": (lambda n: (round(n * (1 - waited)), round(n * waited)))(next(wanted))})


@pytest.mark.parametrize("waited, check, units", [(0.5, True, 4), (0.1, True, 30), (0.5, False, 30)])
def test_a_measurement_on_busy_cores_is_given_up_once_it_has_read_busy_long_enough(monkeypatch, waited, check,
                                                                                   units):
    """Half the thread time waited: given up before the unit that would pass EARLY_S (0.5 s) of thread time wanted
    (the watch's first reading is its start), naming what it measured; a tenth, or a scripted timer, runs whole."""
    from ears_core.model.measuring.measured import interleaved, quietly

    _schedstat_growing(monkeypatch, waited)
    ran = []
    measure = lambda: interleaved(list(range(10)), ran.append, 3)  # noqa: E731  (30 units)
    if units < 30:
        with pytest.raises(MachineBusy, match="measuring the output head's layouts"):
            quietly("the output head's layouts", measure, check=check)
    else:
        quietly("the output head's layouts", measure, check=check)
    assert len(ran) == units
    ears_core.timing.check_early()  # outside any watch: nothing to read


def test_price_tries_given_up_partway_leave_a_quick_provisional_curve_never_cached(monkeypatch, tmp_path):
    model = tiny_llama(0)
    _schedstat_growing(monkeypatch, 0.5)
    calls = []
    real = profile.measure_prices
    monkeypatch.setattr(profile, "measure_prices",
                        stand_in_for(model, lambda *a, **k: calls.append(k.get("repeats")) or real(*a, **k)))
    curve = profile.load_or_measure(model, max_m=3, cache_dir=tmp_path)
    assert calls == [5] * profile.BUSY_TRIES + [1]  # each try given up, then one pass per width, unwatched
    assert curve.provisional and len(curve.verify_ms) == 3 and not list(tmp_path.glob("costs/*.json"))
    with pytest.raises(MachineBusy):
        profile.load_or_measure(model, max_m=3, cache_dir=tmp_path, strict=True)


def test_a_quick_provisional_curve_is_not_cached_and_running_prices_replace_it_fast(tmp_path):
    model = tiny_llama(0)
    curve = profile.load_or_measure(model, max_m=3, cache_dir=tmp_path, quick=True)
    assert curve.provisional and not list((tmp_path / "costs").glob("*.json"))
    from ears_core.policy.costs import RunningPrices
    quick = RunningPrices(PriceCurve([100.0, 110.0, 120.0], 10.0, provisional=True))
    slow = RunningPrices(PriceCurve([100.0, 110.0, 120.0], 10.0, measured_at="x"))
    for prices in (quick, slow):
        prices.observe(2, 2.0, 12.0, 0.5)  # the rounds say: ten times cheaper
    assert quick.curve.verify(3) < 70 < slow.curve.verify(3)


@pytest.mark.skipif(not supported(), reason="needs PyTorch's CPU int4 kernel running with bfloat16 activations")
def test_a_row_plan_is_default_until_measured_and_the_same_bits_either_way(tmp_path):
    lean = from_float_model(tiny_llama(0, vocab=96, hidden=64))
    assert lean_plan.install_row_plan(lean, tmp_path, measure=False) is None
    assert lean.row_plan == {m: tuple(c) for m, c in enumerate(lean_plan.best_chunks(list(lean_plan.DEFAULT_COST)), 1)}
    ids = torch.tensor([[1, 5, 7, 9, 11, 13, 2, 4, 8, 16]])
    before = lean(ids).logits
    plan = lean_plan.install_row_plan(lean, tmp_path, piece=lambda: __import__("contextlib").nullcontext())
    assert plan is not None and lean_plan.install_row_plan(lean, tmp_path, measure=False) == plan  # now cached
    assert torch.equal(lean(ids).logits, before)


@pytest.mark.slow
@pytest.mark.skipif(not cpu_forms.int4_pays(), reason="needs PyTorch's CPU int4 kernel running with bfloat16 "
                    "activations and outrunning float32 (the lean target as the default)")
def test_a_cold_load_takes_the_lean_target_and_times_nothing(monkeypatch, tmp_path):
    """Nothing but the int4 kernel's one-row price (kernels/cpu_forms.py: pays, ~15 ms)."""
    from ears_core import pair as em
    from ears_core.draft import head_kernels
    from ears_core.model.loading.embedded import CACHE_SUBDIR, prepare_embedded

    (tmp_path / CACHE_SUBDIR).symlink_to(prepare_embedded())  # only the prepared target: no kernels, no costs
    monkeypatch.delenv("EARS_LEAN", raising=False)
    monkeypatch.delenv("EARS_DTYPE", raising=False)
    monkeypatch.delenv("EARS_DRAFT_DTYPE", raising=False)
    monkeypatch.setenv("EARS_CACHE", str(tmp_path))
    monkeypatch.setattr(em, "_float_target", lambda *a, **k: pytest.fail("the float target was loaded"))
    monkeypatch.setattr(head_kernels, "time_round", lambda *a, **k: pytest.fail("a head variant was timed"))
    monkeypatch.setattr(lean_plan, "measure_widths", lambda *a, **k: pytest.fail("the row plan was measured"))
    pair = em.load_pair()
    assert type(pair.target).__name__ == "LeanLlama"
    assert pair.provisional == ["the int4 row plan", "the output head's form", "the draft head's kernels"]
    assert pair.draft.kernel_provisional and pair.draft.kernel_choice is None
    assert not list(tmp_path.glob("kernels/*.json"))


# transformers' Llama modules and what their configuration validators import: 5 s of a cold start on two cores
HEAVY = ("transformers.models.llama.configuration_llama", "transformers.models.llama.modeling_llama",
         "transformers.modeling_utils", "torch._dynamo", "sympy")
_LOAD_AND_DECODE = """
import json, sys
from ears_core import load_pair
from ears_core.serve.session import RunConfig, Session
from ears_core.policy.profile import profile_key
pair = load_pair()
session = Session(pair)
ids = session.encode("Why is the sky blue?")
run = session.speculative(ids, RunConfig(rule="ears", params={"beta": 0.1}, temperature=0.9, max_new_tokens=8, seed=0))
tokens = sum(1 for _ in run)
print(json.dumps({"target": type(pair.target).__name__, "body": type(pair.new_drafter().head.body).__name__,
                  "key": profile_key(pair.target), "tokens": tokens, "heavy": [m for m in %r if m in sys.modules]}))
"""


@pytest.mark.slow
def test_a_lean_load_and_its_first_request_import_no_transformers_llama_module():
    """From a fresh process: the embedded pair loads, answers and keys its prices by the model's folder with the
    model's config read as transformers' base config, the draft head's body as plain weights (plain_body.py) and
    the tokenizer as its own class: none of the imports that cost a cold start 5 s."""
    if not cpu_forms.int4_pays():
        pytest.skip("needs PyTorch's CPU int4 kernel running with bfloat16 activations and outrunning float32 "
                    "(the lean target as the default)")
    env = {k: v for k, v in os.environ.items() if k not in ("EARS_LEAN", "EARS_DTYPE", "EARS_DRAFT_DTYPE")}
    out = subprocess.run([sys.executable, "-c", _LOAD_AND_DECODE % (HEAVY,)], capture_output=True, text=True,
                         timeout=600, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["target"] == "LeanLlama" and got["body"] == "PlainBody" and got["tokens"] > 0
    assert got["key"].startswith("smollm2-135m-instruct|30x576x49152|cpu|bfloat16")  # the folder's name, not the class
    assert got["heavy"] == []


def test_settling_runs_in_pieces_and_a_decode_puts_it_aside(monkeypatch):
    """Background measurements never run while a request decodes: every unit of ``settle`` is a piece, and a
    decode that begins puts the attempt aside until the next quiet (serve/between.py)."""
    activity = ActivityLog()
    log: list[str] = []
    decoding = threading.Event()

    def unit(piece):
        for i in range(6):
            with piece():
                log.append("decoding" if activity.active else "quiet")
                if i == 1 and not decoding.is_set():
                    decoding.set()
            time.sleep(0.01)

    pair = ModelPair(None, None, None, torch.device("cpu"), torch.float32, "fake", 4, pending=[Pending("x", unit)])
    done = []
    runner = BetweenRequests(activity, lambda piece: pair.settle(piece), done.append, quiet_s=0.05)
    runner.request()
    assert decoding.wait(10)
    mark = activity.begin()  # a request decodes: the attempt stops at its next piece
    time.sleep(0.2)
    activity.end(mark)
    assert runner.wait(10) and done == [["x"]] and pair.provisional == []
    assert "decoding" not in log and runner.attempts >= 2 and log.count("quiet") >= 8  # the unit ran again, whole


@pytest.mark.slow
@pytest.mark.parametrize("form", ["lean", "float"])
def test_a_session_warmed_beside_busy_processes_starts_and_decodes(monkeypatch, tmp_path, form):
    """Two spinning processes per core through the warm-up (timing.py: busy, with the real threshold) and a cache
    holding only the prepared target, so every choice is measured: the warm-up keeps the defaults it cannot measure and
    says so, the session decodes, and only a caller asking for strictness gets MachineBusy."""
    if form == "lean" and not supported():
        pytest.skip("needs PyTorch's CPU int4 kernel running with bfloat16 activations")
    if not list(__import__("pathlib").Path("/proc/self/task").glob("*/schedstat")):
        pytest.skip("this kernel does not report run-queue waits")
    from ears_core import GreedyRule, generate, load_pair
    from ears_core.model.loading.embedded import CACHE_SUBDIR, prepare_embedded
    from ears_core.serve.session import Session

    (tmp_path / CACHE_SUBDIR).symlink_to(prepare_embedded())
    monkeypatch.setenv("EARS_CACHE", str(tmp_path))
    monkeypatch.setenv("EARS_LEAN", "1" if form == "lean" else "0")
    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 0.2)
    from ears_core.draft import head_kernels

    # the flow under test, not the figures: one busy try, one pass per width, two rounds of the head's variants
    monkeypatch.setattr(profile, "BUSY_TRIES", 1)
    real = profile.measure_prices
    monkeypatch.setattr(profile, "measure_prices", lambda *a, **k: real(*a, **{**k, "repeats": 1}))
    monkeypatch.setattr(head_kernels, "REPEATS", 2)
    from ears_core.model.kernels import output_head, packed_linear  # a float target's kernels: one round each

    plan, modes = output_head.plan_head, packed_linear.measure_modes
    monkeypatch.setattr(output_head, "plan_head", lambda w, rows, **k: plan(w, rows, **{**k, "repeats": 1}))
    monkeypatch.setattr(packed_linear, "measure_modes", lambda m, **k: modes(m, **{**k, "rounds": 1}))
    pair = load_pair()  # on quiet cores; what it measures may be cached (a bfloat16 "float" target's kernels)
    measured_quietly = set(tmp_path.glob("kernels/*.json"))
    with crowded_cores(seconds=600):
        session = Session(pair, cache_dir=tmp_path)
        session.warm_up(tokens=8)
        assert session.provisional, "busy cores, yet every measurement was kept as this machine's"
        assert "provisional until measured on quiet cores" in session.profile_text()
        ids = pair.encode("What is the capital of France?")
        out = generate(*pair, ids, rule=GreedyRule(), temperature=0.0, max_new_tokens=8, k=2)
        assert len(out.token_ids) == 8
        with pytest.raises(MachineBusy):
            Session(pair, cache_dir=tmp_path).warm_up(strict=True)
    assert not list(tmp_path.glob("costs/*.json"))  # nothing measured on busy cores was cached
    assert set(tmp_path.glob("kernels/*.json")) == measured_quietly
