"""The "Why it speeds up" tab: expected tokens per round E and speedup S against acceptance rate.

Terms (``ears_core.metrics``)
-----------------------------
a       acceptance rate: drafts that stood / drafts made
c       cost ratio: one draft step / one target verify pass, as measured by the last run
E, S    E = (1 - a^(K+1)) / (1 - a) tokens per round; S = E / (K c + 1) over target-only decoding
star    the last run's measured point (its state's ``measured``: a, tokens per round, speedup)
prices  this machine's measured price curve (``costs``): a verify pass over m tokens in target
        steps, and the break-even acceptance for each k; the policy picks each round's k from it
rounds  the last run's rounds: the drafts the policy sent, the tokens it expected and got
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import gradio as gr

from ears_core.report import viz
from ears_core.serve.session import MAX_K


@dataclass
class TheoryTab:
    plot: gr.Plot
    k: gr.Slider
    c: gr.Slider
    prices: gr.Plot
    rounds: gr.Plot
    profile: gr.Markdown


def redraw(k: Any, c: Any, state: dict | None) -> Any:
    return viz.theory_figure(int(k), float(c), (state or {}).get("measured"))


def build() -> TheoryTab:
    """The tab's components; call inside ``gr.Tabs()``; ``wire`` connects the sliders."""
    with gr.Tab("Why it speeds up"):
        gr.Markdown("One round costs K draft steps and one target pass and emits E = (1 − a^(K+1))/(1 − a) "
                    "tokens on average at acceptance rate a, so the speedup is S = E/(Kc + 1), c = draft "
                    "step / target pass. EARS raises a; the star is the last run.")
        with gr.Row():
            k = gr.Slider(1, MAX_K, value=4, step=1, label="K")
            c = gr.Slider(0, 1, value=0.05, step=0.005, label="cost ratio c")
        plot = gr.Plot(viz.theory_figure(4, 0.05), label="theory", elem_id="theory_plot")
        gr.Markdown("On a CPU a verify pass over m tokens is not free: **this machine's price curve** below "
                    "sets how much acceptance k drafts need to pay. With the draft length on *policy*, every "
                    "round drafts the k with the most expected tokens per second, from the drafter's own "
                    "confidence before each draw (so every rule stays as exact as it is).")
        profile = gr.Markdown("*the price curve is measured when the pair first decodes*", elem_id="profile")
        prices = gr.Plot(label="this machine's prices", elem_id="price_plot")
        rounds = gr.Plot(viz.rounds_figure([]), label="the last run's rounds", elem_id="rounds_plot")
    return TheoryTab(plot, k, c, prices, rounds, profile)


def machine(session_of: Callable[[], Any], state: dict | None) -> tuple[Any, Any, Any]:
    """(price figure, profile line, rounds figure) for the pair in memory and the last run."""
    session = session_of()
    steps = [SimpleNamespace(**s) for s in (state or {}).get("steps", [])]
    if session is None:
        return gr.skip(), gr.skip(), viz.rounds_figure(steps)
    curve = session.prices
    return viz.price_figure(curve), f"*this machine: {session.profile_text()}*", viz.rounds_figure(steps)


def wire(tab: TheoryTab, state: gr.State, session_of: Callable[[], Any], after: Sequence[Any]) -> None:
    """``after``: the events that set ``state`` (the Generate run); the machine panel redraws when
    one ends. Not ``state.change``: Gradio would then deep-hash the state (the last run's every
    token and round) twice per frame of every run, on the event loop the decode shares its cores with."""
    gr.on([tab.k.change, tab.c.change], redraw, [tab.k, tab.c, state], tab.plot, api_name=False)
    for event in after:
        event.then(lambda st: machine(session_of, st), [state], [tab.prices, tab.profile, tab.rounds], api_name=False)
