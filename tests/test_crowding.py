"""A Session's runs on crowded cores (ears_core/serve/crowding.py): one thread, labelled, prices not learnt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ears_core.timing
from ears_core import autoregressive_stream
from ears_core.serve import crowding
from ears_core.serve.crowding import CrowdWatch
from ears_core.serve.runs import ActivityLog, Tracked
from ears_core.timing import RunQueue

from conftest import crowded_cores, tiny_llama

IDS = torch.tensor([[1, 5, 7, 9]])


def _run(model, on_end=None, device="cpu", tokens=24):
    """A Tracked target-only run; the torch thread count seen at each event."""
    run = Tracked(autoregressive_stream(model, IDS, temperature=0, max_new_tokens=tokens), ActivityLog(), on_end,
                  device)
    return run, [torch.get_num_threads() for _ in run]


@pytest.fixture
def two_threads():
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(1)


def test_a_quiet_run_keeps_its_threads_and_its_timings(two_threads):
    ended = []
    run, seen = _run(tiny_llama(0), lambda gen, timed: ended.append(timed))
    assert set(seen) == {2} and not run.crowded and not run.contended
    assert ended == [True] and torch.get_num_threads() == 2


@pytest.mark.skipif(not list(Path("/proc/self/task").glob("*/schedstat")), reason="no run-queue waits reported")
def test_a_run_on_crowded_cores_decodes_on_one_thread_then_gives_the_threads_back(monkeypatch, two_threads):
    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 0.2)  # the real threshold
    ended = []
    with crowded_cores():
        run, seen = _run(tiny_llama(0), lambda gen, timed: ended.append(timed))
    assert set(seen) == {1}, seen
    assert run.crowded and run.contended and ended == [False]  # labelled, and its timings not learnt
    assert torch.get_num_threads() == 2


def test_cores_crowded_during_a_run_send_the_rest_of_it_to_one_thread(monkeypatch, two_threads):
    """Quiet at the start, busy at the second reading: every event after it runs on one thread."""
    monkeypatch.setattr(ears_core.timing, "BUSY_SHARE", 0.2)
    monkeypatch.setattr(crowding, "cores_crowded", lambda threads: False)
    monkeypatch.setattr(crowding, "CHECK_S", 0.0)  # a reading at every event
    shares = iter([0.0, 0.0, 0.6])

    class Queue(RunQueue):
        def end(self):
            self.waited_share = next(shares)
            return self.busy

    monkeypatch.setattr(crowding, "RunQueue", Queue)
    run, seen = _run(tiny_llama(0), tokens=8)
    assert seen == [2, 2, 1, 1, 1, 1, 1, 1] and run.crowded and torch.get_num_threads() == 2


@pytest.mark.parametrize("device,threads", [("cpu", 1), ("cuda", 2)])
def test_the_watch_is_off_on_one_thread_and_on_a_gpu(monkeypatch, device, threads):
    monkeypatch.setattr(crowding, "cores_crowded", lambda *a: pytest.fail("probed"))
    torch.set_num_threads(threads)
    try:
        watch = CrowdWatch(device)
        watch.start()
        watch.tick()
        watch.stop()
        assert not watch.active and not watch.crowded and torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(1)


def test_an_untimed_run_teaches_the_session_no_prices(tiny_pair, tmp_path):
    from test_no_stall import PRICES, plain_steps, tiny_session

    from ears_core import GreedyRule

    session = tiny_session(tiny_pair, tmp_path, prices=PRICES)
    session.absorb(plain_steps(8, 30.0), GreedyRule(), 0.0, timed=False)  # steps 3x the curve's: crowded
    assert session.prices.verify_ms == PRICES.verify_ms
    session.absorb(plain_steps(8, 30.0), GreedyRule(), 0.0)
    assert session.prices.verify_ms == pytest.approx([3 * v for v in PRICES.verify_ms])
