"""Plotly figures for the transformer TPP samplers (no gradio: usable in a notebook or the app).

Terms (see events.py, cost.py)
------------------------------
timeline     one sequence's events on a time axis, one row per mark, coloured by how each was decided:
             accepted, resampled, bonus, target (an autoregressive step)
acceptance   per speculative round: drafts kept before the first rejection, and the round's length
QQ           time-rescaled inter-event times Lambda_i (integral of the true process's intensity over each
             gap) against Exp(1) quantiles: a model equal to the process lies on the diagonal. The sampler's
             points must follow the autoregressive baseline's (same model, same law), wherever both lie.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .events import KINDS, RoundRecord

__all__ = ["KIND_COLOURS", "timeline_figure", "acceptance_figure", "qq_figure", "rescaled_gaps"]

KIND_COLOURS = {"accepted": "#2e7d32", "resampled": "#f59e0b", "bonus": "#7c3aed", "target": "#6b7280"}
# The legend at the foot of the figure (as in report/viz.py): it never covers the title or a trace.
_LAYOUT = dict(template="plotly_white", height=340, margin=dict(l=50, r=20, t=40, b=40),
               legend=dict(orientation="h", yref="container", yanchor="bottom", y=0, x=0))


def timeline_figure(times: list[float], types: list[int], kinds: list[str], num_types: int) -> go.Figure:
    """Events of one sequence by mark (rows) and kind (colours); every kind gets a trace, empty or not."""
    fig = go.Figure()
    t, x, k = np.asarray(times), np.asarray(types), np.asarray(kinds)
    for kind in KINDS:
        sel = k == kind
        fig.add_trace(go.Scatter(x=t[sel].tolist(), y=x[sel].tolist(), mode="markers", name=kind,
                                 marker=dict(color=KIND_COLOURS[kind], size=7, line=dict(width=0))))
    fig.update_layout(title=f"{len(t)} events (rows: marks)", xaxis_title="time t", **_LAYOUT)
    fig.update_yaxes(tickvals=list(range(num_types)), ticktext=[f"mark {c}" for c in range(num_types)],
                     range=[-0.5, num_types - 0.5])
    return fig


def acceptance_figure(rounds: list[RoundRecord]) -> go.Figure:
    """Drafts kept per speculative round (bars) and the round's draft length (line); row 0 only."""
    spec = [(i, r) for i, r in enumerate(rounds) if r.mode != "ar"]
    idx = [i for i, _ in spec]
    fig = go.Figure([go.Bar(x=idx, y=[r.num_accepted[0] for _, r in spec], name="drafts kept",
                            marker_color=KIND_COLOURS["accepted"]),
                     go.Scatter(x=idx, y=[r.length for _, r in spec], name="draft length", mode="lines",
                                line=dict(color="#0284c7", shape="hv"))])
    n_ar = len(rounds) - len(spec)
    fig.update_layout(title=f"acceptance per round ({len(spec)} speculative, {n_ar} autoregressive rounds)",
                      xaxis_title="round", yaxis_title="events", **_LAYOUT)
    return fig


def rescaled_gaps(process, times: list[float], types: list[int]) -> np.ndarray:
    """Lambda_i of one sequence under the true process (processes.py ``compensators``)."""
    from .processes import Sequence
    return process.compensators(Sequence(np.asarray(times, float), np.asarray(types, np.int64)))


def qq_figure(samples: dict[str, np.ndarray]) -> go.Figure:
    """Quantiles of each named set of rescaled gaps against Exp(1)."""
    qs = np.linspace(0.01, 0.99, 60)
    ref = -np.log1p(-qs)
    colours = ["#6b7280", "#e6007e", "#0284c7"]
    fig = go.Figure()
    for (name, lam), c in zip(samples.items(), colours):
        if len(lam):
            fig.add_trace(go.Scatter(x=ref.tolist(), y=np.quantile(lam, qs).tolist(), mode="markers", name=name,
                                     marker=dict(color=c, size=6)))
    top = float(ref[-1])
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="Exp(1)", line=dict(color="#9ca3af", dash="dot")))
    fig.update_layout(title="QQ: time-rescaled gaps under the true intensity vs Exp(1)",
                      xaxis_title="Exp(1) quantile", yaxis_title="sample quantile", **_LAYOUT)
    return fig
