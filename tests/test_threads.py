"""threads.in_passing_thread: torch work in a thread that exits, so the caller keeps no OpenMP pool
(two pools on 2 cores throttle every parallel region: decoding ran at 0.6x, threads.py)."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import ears_core.pair as models
import ears_core.threads as threads_module
from ears_core.threads import in_passing_thread, join_at_exit


@pytest.fixture(autouse=True)
def no_pooled_thread(monkeypatch):
    """This worker's main thread decoded in other tests (threads.py: pooled); here it starts unmarked."""
    import weakref
    monkeypatch.setattr(threads_module, "_POOLED", weakref.WeakSet())


def test_it_runs_elsewhere_returns_and_raises_as_the_call_would():
    here = threading.get_ident()
    assert in_passing_thread(lambda a, b=0: (threading.get_ident(), a + b), 2, b=3)[1] == 5
    assert in_passing_thread(threading.get_ident) != here
    with pytest.raises(ValueError, match="bad prompt"):
        in_passing_thread(lambda: (_ for _ in ()).throw(ValueError("bad prompt")))


def test_the_callers_torch_thread_count_is_carried_over():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert in_passing_thread(torch.get_num_threads) == 1
    finally:
        torch.set_num_threads(before)


def test_load_pair_and_warm_up_run_their_torch_work_in_a_passing_thread(monkeypatch, tiny_pair):
    seen = []

    def fake_load(*a, **kw):
        seen.append(threading.get_ident())
        raise models.ModelLoadError("stop here")

    def fake_probe(threads):  # the crowding probe runs a parallel region: a pool wherever it runs
        probed.append(threading.get_ident())
        return False

    probed = []
    monkeypatch.setattr(models, "_load_pair", fake_load)
    monkeypatch.setattr(models, "cores_crowded", fake_probe)
    with pytest.raises(models.ModelLoadError, match="stop here"):
        models.load_pair("embedded", None, device="cpu")
    assert seen and seen[0] != threading.get_ident()
    assert probed and probed[0] != threading.get_ident()

    from ears_core.serve.session import Session

    session = Session(models.ModelPair(*tiny_pair, None, torch.device("cpu"), torch.float32, "tiny", 96, "tiny-draft"))
    monkeypatch.setattr(Session, "_warm_up", lambda self, tokens, strict: seen.append((threading.get_ident(), tokens)))
    session.warm_up(7)
    assert seen[1][1] == 7 and seen[1][0] != threading.get_ident()


def test_a_price_measurement_asked_for_from_a_request_thread_runs_in_a_passing_thread(monkeypatch, tiny_pair):
    # Session.prices reads or measures the profile on first use: from an app's request worker (a
    # long-lived thread) that would leave the worker a pool that throttles later decodes.
    import ears_core.serve.prices as prices_mod
    from ears_core.policy.costs import PriceCurve
    from ears_core.pair import ModelPair
    from ears_core.serve.session import Session

    seen = []

    def fake_measure(*a, **kw):
        seen.append(threading.get_ident())
        return PriceCurve([10.0] * 9, 0.4, measured_at="now")

    monkeypatch.setattr(prices_mod, "load_or_measure", fake_measure)
    target, draft = tiny_pair
    session = Session(ModelPair(target, draft, None, torch.device("cpu"), torch.float32, "tiny", 96, "tiny-draft"))
    assert session.prices.measured_at == "now"
    assert seen and seen[0] != threading.get_ident()


def test_a_thread_that_decoded_runs_passing_work_itself_and_adds_no_pool(tiny_pair):
    """After a Generation's first token its thread holds torch's pool: a Session's warm-up or price measurement
    asked for from it runs there (a second pool would slow that measurement ~1.6x), while a thread that never
    decoded still hands such work to a passing thread."""
    from ears_core import GreedyRule
    from ears_core.decode.api import stream

    seen = {}

    def decode_then_pass(name):
        torch.set_num_threads(2)  # on one thread torch keeps no pool, and no thread is marked
        if name == "decodes":
            run = stream(*tiny_pair, torch.tensor([[1, 2, 3]]), rule=GreedyRule(), temperature=0.0,
                         max_new_tokens=2, k=2)
            next(iter(run))  # the first token marks the thread
        seen[name] = (threading.get_ident(), in_passing_thread(threading.get_ident))
        torch.set_num_threads(1)  # MKL's count is the process's: the suite's one thread again

    for name in ("decodes", "never decodes"):
        worker = threading.Thread(target=decode_then_pass, args=(name,))
        worker.start()
        worker.join()
    here, ran = seen["decodes"]
    assert ran == here
    here, ran = seen["never decodes"]
    assert ran != here


def test_a_background_price_measurement_waits_out_a_live_thread_that_decoded(monkeypatch, tiny_pair, tmp_path):
    """Beside a live pooled thread (a caller decoding in a long-lived thread) a measurement between requests would
    read a slow step (serve/prices.py: beside a pool): it measures nothing and the curve stays; once that thread
    has ended, it measures."""
    import ears_core.serve.prices as prices_mod
    from ears_core import GreedyRule
    from ears_core.decode.api import stream
    from ears_core.pair import ModelPair
    from ears_core.policy.costs import PriceCurve
    from ears_core.serve.runs import ActivityLog
    from ears_core.serve.session import Session

    measured = []
    monkeypatch.setattr(prices_mod, "load_or_measure", lambda *a, **k: measured.append(k.get("refresh"))
                        or PriceCurve([10.0] * 9, 0.4, measured_at="background" if k.get("refresh") else "cached"))
    target, draft = tiny_pair
    session = Session(ModelPair(target, draft, None, torch.device("cpu"), torch.float32, "tiny", 96, "tiny-draft"),
                      ActivityLog(), cache_dir=tmp_path, background_prices=True)
    assert session.prices.measured_at == "cached"
    decoded, release = threading.Event(), threading.Event()

    def long_lived():
        torch.set_num_threads(2)
        next(iter(stream(target, draft, torch.tensor([[1, 2, 3]]), rule=GreedyRule(), temperature=0.0,
                         max_new_tokens=2, k=2)))
        decoded.set()
        release.wait(30)
        torch.set_num_threads(1)

    worker = threading.Thread(target=long_lived)
    worker.start()
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the background thread takes the requester's count
    try:
        assert decoded.wait(30)
        session.pricing.refresh()
        assert session.pricing.wait(30)
        assert measured == [None] and session.prices.measured_at == "cached"  # nothing measured beside the pool
        release.set()
        worker.join()
        session.pricing.refresh()
        assert session.pricing.wait(30)
        assert measured == [None, True] and session.prices.measured_at == "background"
    finally:
        release.set()
        torch.set_num_threads(before)
        session.close()


_EXIT_SCRIPT = """
import threading, time, torch
from ears_core.threads import join_at_exit
from ears_core.serve.between import BetweenRequests
from ears_core.serve.runs import ActivityLog
a = torch.randn(1200, 1200)
ran = threading.Event()
def job(piece):  # a price measurement that never ends on its own: one matmul a piece
    while True:
        with piece():
            a @ a
            ran.set()
runner = BetweenRequests(ActivityLog(), job, on_done=print, quiet_s=0.0)
runner.request()
stop = threading.Event()
def loop():  # a plain registered thread: matmuls until stopped
    while not stop.is_set():
        a @ a
join_at_exit(threading.Thread(target=loop, daemon=True), stop.set).start()
assert ran.wait(30)
time.sleep(0.2)
print("main ends")
"""


def test_torch_threads_running_at_exit_are_stopped_and_joined_so_the_process_keeps_its_exit_code():
    """Unregistered, a daemon thread inside a torch kernel at interpreter exit aborts the process
    ("terminate called without an active exception", exit code 134) after the main code ended."""
    root = Path(__file__).resolve().parent.parent
    for _ in range(2):  # the abort it prevents came at nearly every exit
        done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], cwd=root, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "main ends" in done.stdout and "terminate called" not in done.stderr


def test_the_exit_join_calls_stop_and_reports_the_threads_it_found():
    stop = threading.Event()
    thread = join_at_exit(threading.Thread(target=stop.wait, daemon=True), stop.set)
    thread.start()
    assert threads_module._join_live_threads(timeout=10) >= 1
    assert stop.is_set() and not thread.is_alive()
    assert threads_module._join_live_threads(timeout=10) == 0  # ended threads are not waited for again
