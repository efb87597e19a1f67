"""Showing a decode while it runs, without slowing it: the decode has a thread of its own, the
page redraws from the events so far at a steady frame rate.

Terms
-----
run        a ``session.Background``: a Generation decoded in its own thread, on its own clock
           (``decode_s``, ``samples``); reading ``events`` while it runs is safe.
frame      one redraw of the page (token HTML, charts) from a snapshot of the events so far, every
           ``FRAME_S`` seconds, never once per token: rendering costs the same however fast the
           decode goes, and the decode clock never counts it. Charts go out as plotly JSON built
           from ``viz`` specs (``plot``), not validated ``go.Figure`` objects: building those takes
           the interpreter for tens of milliseconds a frame, which the decode thread then waits for.
runs       the open runs of one request; ``stop_all`` ends them when the request ends early (the
           Stop button, a closed page), so no decode outlives its request.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from gradio.components.plot import PlotData

from ears_core.report import viz
from ears_core.metrics import GenerationStats
from ears_core.serve.runs import Background, Tracked

FRAME_S = 0.4  # 2.5 frames a second: every frame takes the interpreter from the decode thread


class Runs:
    """The Background runs one request started (see the module's terms)."""

    def __init__(self) -> None:
        self.open: list[Background] = []

    def start(self, tracked: Tracked) -> Background:
        run = Background(tracked)
        self.open.append(run)
        return run

    def stop_all(self) -> None:
        for run in self.open:
            run.stop()


def plot(spec: Mapping[str, Any]) -> PlotData:
    """A gr.Plot value straight from a ``viz`` spec (no plotly validation)."""
    return PlotData(type="plotly", plot=viz.spec_json(spec))


def frames(run: Background, frame_s: float = FRAME_S) -> Iterator[None]:
    """Yield once per frame while ``run`` decodes; return when it has ended."""
    while not run.wait(frame_s):
        yield None


def snapshot(run: Background) -> tuple[list[Any], list[Any], list[tuple[float, int]]]:
    """(events, steps, samples) so far, copied: the decode thread keeps appending to the originals."""
    gen = run.gen
    return list(gen.events), list(gen.steps), list(gen.samples)


def steady_samples(stats: GenerationStats, points: int = 8) -> list[tuple[float, int]]:
    """Throughput samples of a cached baseline, of which only the totals are kept: a flat line at
    its mean rate (the chart marks it as cached)."""
    if stats.decode_s <= 0:
        return []
    return [(stats.decode_s * i / points, stats.new_tokens * i / points) for i in range(1, points + 1)]
