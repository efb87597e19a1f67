"""The "Why it speeds up" tab: expected tokens per round E and speedup S against acceptance rate.

Terms (``ears_core.metrics``)
-----------------------------
a       acceptance rate: drafts that stood / drafts made
c       cost ratio: one draft step / one target verify pass, as measured by the last run
E, S    E = (1 - a^(K+1)) / (1 - a) tokens per round; S = E / (K c + 1) over target-only decoding
star    the last run's measured point (its state's ``measured``: a, tokens per round, speedup)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ears_core import viz


@dataclass
class TheoryTab:
    plot: gr.Plot
    k: gr.Slider
    c: gr.Slider


def redraw(k: Any, c: Any, state: dict | None) -> Any:
    return viz.theory_figure(int(k), float(c), (state or {}).get("measured"))


def build() -> TheoryTab:
    """The tab's components; call inside ``gr.Tabs()``; ``wire`` connects the sliders."""
    with gr.Tab("Why it speeds up"):
        gr.Markdown("One round costs K draft steps and one target pass and emits E = (1 − a^(K+1))/(1 − a) "
                    "tokens on average at acceptance rate a, so the speedup is S = E/(Kc + 1), c = draft "
                    "step / target pass. EARS raises a; the star is the last run.")
        with gr.Row():
            k = gr.Slider(1, 8, value=4, step=1, label="K")
            c = gr.Slider(0, 1, value=0.05, step=0.005, label="cost ratio c")
        plot = gr.Plot(viz.theory_figure(4, 0.05), label="theory", elem_id="theory_plot")
    return TheoryTab(plot, k, c)


def wire(tab: TheoryTab, state: gr.State) -> None:
    gr.on([tab.k.change, tab.c.change], redraw, [tab.k, tab.c, state], tab.plot, api_name=False)
