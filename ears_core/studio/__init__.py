"""EARS Studio, the Gradio UI: one module per tab, over ``ears_core.serve.session``; the only part of
ears_core that imports gradio.

Modules
-------
controls   the shared request controls: prompt, the rule selector and one slider per rule
           parameter (from ``rules.RULES``), temperature, K, length, seed
pairs      the pair's status line (loading, ready) and the model-pair picker over
           ``serve.pair_slot.PairSlot`` (``/load``)
api        the run endpoints' parameter names (``/generate``, ``/race``)
generate   the Generate tab (``/generate``, ``/export``, ``/tree_round``)
race       the Race tab: two registered rules and target-only on one seed (``/race``)
theory     the "Why it speeds up" tab
quality    the Quality tab: accuracy against speed from the bench, and a live sweep (``/quality_sweep``)
tpp        the "Point processes" tab (seed 001, ``/tpp_sample``)
live       decoding in a thread of its own while the page redraws at a steady frame rate
errors     messages for the page and the checks of a request's values
zerogpu    the ZeroGPU Space (spaces/zerogpu): the decoding handlers inside ``spaces.GPU`` calls

Terms
-----
gpu_call      ``build_app``'s ``gpu_call(handler, name)``: what each handler that decodes (``name``:
              "generate", "race", "quality_sweep") is wired as; ``as_is`` by default, ``spaces.GPU``
              in the ZeroGPU Space (``zerogpu``).
decode group  ``/generate``, ``/race``, ``/quality_sweep`` and ``/tpp_sample`` share one queue group of
              ``Settings.concurrency`` workers (1 by default): requests beyond it wait in Gradio's
              queue, which shows their position, instead of timing each other.
"""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr

from ears_core.pair import ModelPair
from ears_core.serve.pair_slot import PairSlot
from ears_core.serve.settings import Settings

from . import generate, pairs, quality, race, theory, tpp
from .controls import build_controls

__all__ = ["build_app", "as_is", "LAUNCH_KW", "CSS", "calm_queue", "QUEUE_POLL_S", "PROGRESS_POLL_S"]

CSS = ".ears-tokens {font-family: ui-sans-serif, system-ui;} #message {color: #b91c1c; font-weight: 600;}"
LAUNCH_KW: dict[str, Any] = dict(theme=gr.themes.Soft(primary_hue="pink"), css=CSS)
DECODE_GROUP = "decode"
# Gradio's queue polls its event list every 1 ms (its progress list every 10 ms) on Linux: about
# 1,000 wake-ups a second of the event loop, each taking the interpreter and a core from the decode
# (measured in docs/measurements.md). 50 ms is
# Gradio's own Windows value; it delays only the pick-up of a new request.
QUEUE_POLL_S = 0.05
PROGRESS_POLL_S = 0.1


def calm_queue(demo: gr.Blocks, poll_s: float = QUEUE_POLL_S, progress_s: float = PROGRESS_POLL_S) -> None:
    """Make the queue's idle polling slow (see QUEUE_POLL_S). Fails loudly if Gradio renames the
    attributes, rather than silently polling at 1 kHz again."""
    queue = demo._queue
    for name, value in (("sleep_when_free", poll_s), ("progress_update_sleep_when_free", progress_s)):
        if not hasattr(queue, name):
            raise AttributeError(f"gradio's Queue has no {name!r}: update ears_core.studio.calm_queue for this version")
        setattr(queue, name, value)


INTRO = ("# EARS Studio\nSpeculative decoding with **EARS**: a draft proposes K tokens, the target checks them "
         "in one pass. EARS *pardons* a draft whose ratio r = p/q falls just short of the uniform U, by at most "
         "β·(1 − max P_target).")


def as_is(handler: Callable, name: str) -> Callable:
    """``build_app``'s default ``gpu_call``: the handler itself (module terms)."""
    return handler


def build_app(pair_loader: Callable[[], ModelPair] | None = None, settings: Settings | None = None,
              loader: Callable[[str, str | None], ModelPair] | None = None, preload: bool = True,
              gpu_call: Callable[[Callable, str], Callable] = as_is, slot: PairSlot | None = None,
              notice: str = "") -> gr.Blocks:
    """The Blocks app, queued; ``demo.ears_slot`` is its ``PairSlot``. ``pair_loader()`` loads the
    configured pair (tests inject a tiny pair): with ``preload`` in a background thread from now on (the
    page says "loading" until then, and a Generate sent sooner waits); else on the first request.
    ``loader(target, draft)`` loads a picked pair (default ``models.load_pair`` on the settings).
    ``settings`` default: ``Settings.from_env()``. The rule selector and its sliders are read from
    ``rules.RULES`` now. ``gpu_call``: wraps the handlers that decode (module terms); ``slot``: a
    PairSlot the caller made, with its own settings and loaders; ``notice``: a line under the title."""
    slot = slot or PairSlot(settings or Settings.from_env(), pair_loader, loader)
    settings = slot.settings
    if preload:
        slot.preload()
    with gr.Blocks(title="EARS Studio") as demo:
        gr.Markdown(INTRO)
        gr.Markdown(notice, elem_id="notice", visible=bool(notice))  # the ZeroGPU Space's: what a request asks for
        status = pairs.build_status(slot, demo)
        controls = build_controls(settings)
        pairs.build(slot, status)
        with gr.Tabs():
            gen_tab = generate.build()
            race_tab = race.build()
            theory_tab = theory.build()
            quality_tab = quality.build()
            tpp.build(concurrency_id=DECODE_GROUP)
        state = gr.State(None)
        outs = dict(tokens=gen_tab.tokens, message=gen_tab.message, summary=gen_tab.summary, conf=gen_tab.conf,
                    ratio=gen_tab.ratio, tput=gen_tab.tput, hist=gen_tab.hist, details=gen_tab.details, state=state,
                    theory=theory_tab.plot, theory_k=theory_tab.k, theory_c=theory_tab.c, tree=gen_tab.tree,
                    tree_round=gen_tab.tree_round, tree_panel=gen_tab.tree_panel)
        decode = dict(concurrency_id=DECODE_GROUP, concurrency_limit=settings.concurrency)
        gen_event = gen_tab.go.click(gpu_call(generate.make_generate(slot, controls.names), "generate"),
                                     [*controls.request, controls.rule, controls.with_base, *controls.extra,
                                      controls.draft_length, controls.tree, controls.tree_budget],
                                     [outs[n] for n in generate.OUT], api_name="generate", **decode)
        gen_tab.stop.click(None, cancels=[gen_event])
        race_event = race_tab.go.click(gpu_call(race.make_race(slot, controls.names), "race"),
                                       [*controls.request, race_tab.rule_a, race_tab.rule_b, *controls.extra],
                                       [*race_tab.html, race_tab.summary, race_tab.plot], api_name="race", **decode)
        race_tab.stop.click(None, cancels=[race_event])
        quality.wire(quality_tab, slot, gpu_call, **decode)
        gen_tab.tree_round.release(generate.show_round, [state, gen_tab.tree_round], gen_tab.tree, api_name="tree_round",
                                   queue=False)
        gen_tab.export.click(generate.export, state, [gen_tab.csv_file, gen_tab.json_file, gen_tab.message],
                             api_name="export")
        theory.wire(theory_tab, state, lambda: slot.loaded, after=[gen_event])
        controls.follow([controls.rule, race_tab.rule_a, race_tab.rule_b])
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=settings.concurrency)
    calm_queue(demo)
    demo.ears_slot = slot
    close = demo.close

    def close_all(*args: Any, **kwargs: Any) -> Any:  # the server closes: the pair's background work stops too
        slot.close()
        return close(*args, **kwargs)

    demo.close = close_all
    return demo
