"""The "Point processes" tab: exact speculative sampling of event sequences from a transformer TPP.

UI only: the samplers are ears_core.tpp.run, the figures ears_core.tpp.figures. ``build()`` is called inside an
open ``gr.Tabs()``; the tab loads the shipped transformer pair of a process (assets/tpp/<process>) on first use
and never touches the app's language models. One callback, ``/tpp_sample``, streams: it first times the
autoregressive baseline on the same target, seed and number of events, then the chosen sampler round by round.
Events/s count sampling time only (the rounds' own clocks), not the drawing of the figures.
"""

from __future__ import annotations

import threading
import time

import gradio as gr
import torch

from ears_core.tpp import figures
from ears_core.tpp.processes import make_process
from ears_core.tpp.run import collect, prices_for, sample, stream
from ears_core.tpp.transformer import load_pair

PROCESSES = {"hawkes": "Hawkes (one mark)", "multi_hawkes": "multivariate Hawkes (3 marks)",
             "self_correcting": "self-correcting", "renewal": "renewal (3 marks)"}
SAMPLERS = {"draft": "TPP-SD draft model", "self": "seed 001 self-proposal", "autoregressive": "autoregressive"}
LENGTH_MODES = ("cost model", "fixed")
MAX_EVENTS = 3000
_PAIRS: dict = {}
_LOCK = threading.Lock()


def _pair(process: str):
    with _LOCK:
        if process not in _PAIRS:
            _PAIRS[process] = load_pair(process)
    return _PAIRS[process]


def _check(process, sampler, length_mode, length, n_events, seed):
    if process not in PROCESSES:
        raise ValueError(f"unknown process {process!r}: choose one of {list(PROCESSES)}")
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}: choose one of {list(SAMPLERS)}")
    if length_mode not in LENGTH_MODES:
        raise ValueError(f"length_mode must be one of {LENGTH_MODES}, got {length_mode!r}")
    n_events, seed, length = int(n_events), int(seed), int(length)
    if not 1 <= n_events <= MAX_EVENTS:
        raise ValueError(f"events must be between 1 and {MAX_EVENTS}")
    if length_mode == "fixed" and not 1 <= length <= 16:
        raise ValueError(f"draft length must be between 1 and 16, got {length}")
    return n_events, seed, (length if length_mode == "fixed" else None)


def _outputs(process, sampler, run, base, rounds, spent, base_eps, done):
    proc, C = make_process(process), _pair(process)[0].cfg.num_types
    n = len(run.times[0])
    eps = n / spent if spent > 0 else float("nan")
    st = run.stats()
    stats = dict(process=process, sampler=sampler, events=n, done=done, events_per_s=round(eps, 1),
                 baseline_events_per_s=round(base_eps, 1), ratio=round(eps / base_eps, 3) if base_eps else None,
                 acceptance=None if st["acceptance"] != st["acceptance"] else round(st["acceptance"], 4),
                 events_per_round=None if st["events_per_round"] != st["events_per_round"] else round(st["events_per_round"], 3),
                 autoregressive_rounds=st["ar_rounds"], rounds=st["rounds"],
                 lengths_used={("ar" if k == 0 else str(k)): v for k, v in st["lengths"].items()})
    summary = (f"**{SAMPLERS[sampler]}** on **{PROCESSES[process]}**: {n} events, **{eps:.0f} events/s** against "
               f"{base_eps:.0f} for autoregressive sampling of the same target: **{stats['ratio']}×**"
               + (f"; acceptance {stats['acceptance']}, {stats['events_per_round']} events per round"
                  if stats["acceptance"] is not None else "") + ("" if done else " (running…)"))
    qq = {"autoregressive": figures.rescaled_gaps(proc, base.times[0], base.types[0])}
    if sampler != "autoregressive":
        qq[SAMPLERS[sampler]] = figures.rescaled_gaps(proc, run.times[0], run.types[0])
    return (summary, stats, figures.timeline_figure(run.times[0], run.types[0], run.kinds[0], C),
            figures.acceptance_figure(rounds), figures.qq_figure(qq))


def sample_events(process="hawkes", sampler="draft", length_mode="cost model", length=4, n_events=1000, seed=0):
    """Callback (streams): baseline first, then the chosen sampler; yields summary, stats, timeline,
    acceptance per round and the QQ plot every few tenths of a second and at the end."""
    try:
        n_events, seed, fixed = _check(process, sampler, length_mode, length, n_events, seed)
        target, draft = _pair(process)
    except (ValueError, FileNotFoundError) as err:
        raise gr.Error(str(err)) from err
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread; the setting is the process's, so restore it
    try:
        if sampler != "autoregressive" and fixed is None:
            prices_for(sampler, target, draft)  # measured once per model pair, before any clock runs
        yield (f"Timing the autoregressive baseline ({n_events} events)…", None, None, None, None)
        base = sample(target, method="autoregressive", n_events=n_events, seed=seed)
        base_eps = n_events / sum(r.seconds for r in base.rounds)
        rounds, spent, last = [], 0.0, time.perf_counter()
        s = None
        for s, rec in stream(target, draft, method=sampler, n_events=n_events, seed=seed, length=fixed):
            rounds.append(rec)
            spent += rec.seconds
            if time.perf_counter() - last > 0.5:
                n = min(int(s.ev.n[0]) - s.n_history, n_events)
                yield _outputs(process, sampler, collect(s, n, rounds, spent), base, rounds, spent, base_eps, False)
                last = time.perf_counter()
        yield _outputs(process, sampler, collect(s, n_events, rounds, spent), base, rounds, spent, base_eps, True)
    finally:
        torch.set_num_threads(threads)


def build(concurrency_id: str | None = None) -> None:
    """Create the tab and its handlers; call inside ``with gr.Tabs():``. ``concurrency_id``: the queue group it
    shares with the language-model decodes (they would time each other)."""
    with gr.Tab("Point processes"):
        gr.Markdown(
            "**Speculative sampling for temporal point processes**, exact. A 16-layer transformer TPP trained on a "
            "known process is the target. *TPP-SD draft model*: a 1-layer transformer drafts K events, one target "
            "pass scores them, each stands with probability min(1, p*(τ, x) / q(τ, x)) over the joint time-and-mark "
            "density; the first rejected one is replaced from the residual max(0, p* − q), and when all stand a bonus "
            "event comes from the target. *Seed 001 self-proposal*: the target's own law proposes the events. The "
            "cost model picks the draft length each round (or falls back to plain steps); the QQ plot shows the "
            "sampler's events follow the same law as plain autoregressive sampling.")
        with gr.Row():
            process = gr.Radio([(v, k) for k, v in PROCESSES.items()], value="hawkes", label="process",
                               elem_id="tpp_process")
            sampler = gr.Radio([(v, k) for k, v in SAMPLERS.items()], value="draft", label="sampler",
                               elem_id="tpp_method")
        with gr.Row():
            length_mode = gr.Radio(list(LENGTH_MODES), value="cost model", label="draft length",
                                   elem_id="tpp_length_mode")
            length = gr.Slider(1, 16, value=4, step=1, label="fixed draft length (K or l)", elem_id="tpp_length")
            n_events = gr.Number(1000, label="events", precision=0, minimum=1, maximum=MAX_EVENTS, elem_id="tpp_n")
            seed = gr.Number(0, label="seed", precision=0, minimum=0, elem_id="tpp_seed")
            btn = gr.Button("Sample", variant="primary", elem_id="tpp_sample")
        summary = gr.Markdown("", elem_id="tpp_summary")
        stats = gr.JSON(label="run statistics (events/s, ratio to autoregressive, acceptance)", elem_id="tpp_stats")
        timeline = gr.Plot(label="timeline", elem_id="tpp_timeline")
        with gr.Row():
            accept = gr.Plot(label="acceptance per round", elem_id="tpp_accept")
            qq = gr.Plot(label="QQ plot", elem_id="tpp_qq")
        btn.click(sample_events, [process, sampler, length_mode, length, n_events, seed],
                  [summary, stats, timeline, accept, qq], api_name="tpp_sample", concurrency_id=concurrency_id)
