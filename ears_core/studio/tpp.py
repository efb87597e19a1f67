"""The "Point processes" tab: speculative vs autoregressive sampling of event sequences (seed 001).

UI only: the sampler is ears_core.tpp.sampler, the figures ears_core.tpp.viz. ``build()`` is called
inside an open ``gr.Tabs()``; the tab loads the shipped TPP (assets/tpp, a few KB) on first use and
never touches the app's language models.
"""

from __future__ import annotations

import threading

import gradio as gr
import torch

from ears_core.tpp import viz as tpp_viz
from ears_core.tpp.model import ASSET_DIR, load_model
from ears_core.tpp.sampler import autoregressive_sample, speculative_sample, step_laws

_MODELS: dict = {}
_LOCK = threading.Lock()
MAX_EVENTS = 2000
MODELS = {"Hawkes (history matters)": ASSET_DIR, "renewal (history does not matter)": ASSET_DIR / "renewal"}


def _model(name: str):
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {list(MODELS)}")
    with _LOCK:
        if name not in _MODELS:
            _MODELS[name] = load_model(MODELS[name])
    return _MODELS[name]


def _shown_position(spec, l: int) -> tuple[int, int]:
    """The first step with a rejection after at least one kept proposal (the interesting case)."""
    for i, s in enumerate(spec.steps):
        if 1 <= s.num_accepted < l:
            return i, s.num_accepted + 1
    return 0, min(2, l)


def sample_both(l, n_events, seed, model_name=next(iter(MODELS))):
    """Callback: both samplers on the same model and seed; returns summary, timeline, laws, QQ, throughput."""
    try:
        l, n_events, seed = int(l), int(n_events), int(seed)
        if not 1 <= n_events <= MAX_EVENTS:
            raise ValueError(f"events must be between 1 and {MAX_EVENTS}")
        model = _model(model_name)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny model: one thread; the setting is the process's, so restore it
        try:
            ar = autoregressive_sample(model, n_events=n_events, seed=seed)
            spec = speculative_sample(model, l=l, n_events=n_events, seed=seed)
        finally:
            torch.set_num_threads(threads)
    except ValueError as err:
        raise gr.Error(str(err)) from err
    step, pos = _shown_position(spec, l)
    laws = step_laws(model, spec, step, pos)
    return (tpp_viz.summary_markdown(spec, ar, l), tpp_viz.timeline_figure(spec, ar), tpp_viz.laws_figure(laws),
            tpp_viz.qq_figure(ar.taus, spec.taus), tpp_viz.throughput_figure(spec.events_per_second,
                                                                             ar.events_per_second, l))


def build(concurrency_id: str | None = None) -> None:
    """Create the tab and its handlers; call inside ``with gr.Tabs():``. ``concurrency_id``: the
    queue group it shares with the language-model decodes (they would time each other)."""
    with gr.Tab("Point processes"):
        gr.Markdown(
            "**Speculative sampling for temporal point processes** (seed 001). A neural TPP trained on a Hawkes "
            "process proposes *l* future events in one batch from its current next-event law; one encoder pass "
            "scores them all; each is kept with probability p*(τ, x) / (M·q(τ, x)) and everything after the first "
            "rejection is discarded. The output has exactly the model's law: the QQ plot against plain "
            "autoregressive sampling stays on the diagonal. On the renewal model the law hardly moves from event "
            "to event, so almost every proposal stands.")
        with gr.Row():
            l = gr.Slider(1, 16, value=4, step=1, label="l (proposals per step)", elem_id="tpp_l")
            n = gr.Number(300, label="events", precision=0, minimum=1, maximum=MAX_EVENTS, elem_id="tpp_n")
            seed = gr.Number(0, label="seed", precision=0, minimum=0, elem_id="tpp_seed")
            which = gr.Radio(list(MODELS), value=next(iter(MODELS)), label="model trained on", elem_id="tpp_model")
            btn = gr.Button("Sample with both samplers", variant="primary", elem_id="tpp_sample")
        summary = gr.Markdown("", elem_id="tpp_summary")
        timeline = gr.Plot(label="timeline", elem_id="tpp_timeline")
        with gr.Row():
            laws = gr.Plot(label="proposal, target and envelope at one position", elem_id="tpp_laws")
            qq = gr.Plot(label="QQ plot", elem_id="tpp_qq")
        tput = gr.Plot(label="events per second", elem_id="tpp_tput")
        btn.click(sample_both, [l, n, seed, which], [summary, timeline, laws, qq, tput], api_name="tpp_sample",
                  concurrency_id=concurrency_id)
