"""Plotly figures for the point-process sampler (no gradio here: usable in a notebook or the app).

Terms (see sampler.py)
----------------------
timeline     events on a time axis, one row per sampler, marker colour = how the event was decided:
             accepted (a kept proposal), resampled (the position's first proposal was rejected),
             target (the plain autoregressive sampler)
laws         the time laws of one speculative position in y = log tau: proposal q, target p*, and the
             envelope M q, which must lie above p* everywhere (M is the time part of the constant)
QQ           quantiles of one sampler's inter-event times against the other's: on the diagonal when
             both have the same law
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from .sampler import SampleResult

__all__ = ["KIND_COLOURS", "timeline_figure", "laws_figure", "qq_figure", "throughput_figure", "summary_markdown"]

KIND_COLOURS = {"accepted": "#2e7d32", "resampled": "#f59e0b", "target": "#6b7280"}
_LAYOUT = dict(template="plotly_white", height=300, margin=dict(l=50, r=20, t=40, b=40),
               legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))


def timeline_figure(spec: SampleResult, ar: SampleResult | None = None) -> go.Figure:
    """Speculative events (top row, by type) coloured by kind; the autoregressive run below."""
    fig = go.Figure()
    for kind in ("accepted", "resampled"):
        idx = [i for i, k in enumerate(spec.kinds) if k == kind]
        fig.add_trace(go.Scatter(x=[spec.times[i] for i in idx], y=[spec.types[i] + 0.15 for i in idx], mode="markers",
                                 name=f"speculative: {kind}", marker=dict(color=KIND_COLOURS[kind], size=8)))
    if ar is not None:
        fig.add_trace(go.Scatter(x=ar.times, y=[x - 0.15 for x in ar.types], mode="markers", name="autoregressive",
                                 marker=dict(color=KIND_COLOURS["target"], size=6, symbol="diamond")))
    n_types = 1 + max([*spec.types, *(ar.types if ar else [])], default=0)
    fig.update_layout(title="Event timeline (rows: event types)", xaxis_title="time t", **_LAYOUT)
    fig.update_yaxes(tickvals=list(range(n_types)), ticktext=[f"type {c}" for c in range(n_types)])
    return fig


def _mix_pdf(y: np.ndarray, log_w, mu, sd) -> np.ndarray:
    w, mu, sd = np.exp(np.asarray(log_w, float)), np.asarray(mu, float), np.asarray(sd, float)
    z = (y[:, None] - mu) / sd
    return (w * np.exp(-0.5 * z * z) / (sd * math.sqrt(2 * math.pi))).sum(-1)


def laws_figure(laws: dict) -> go.Figure:
    """laws: ``step_laws`` output (sampler.py): proposal / target components, M_time, M_type, the proposal."""
    t_w, t_mu, t_sd = laws["target"]
    p_w, p_mu, p_sd = laws["proposal"]
    lo = min(m - 4 * s for m, s in zip(t_mu, t_sd))  # the target's bulk (the heavy tail spreads much wider)
    hi = max(m + 4 * s for m, s in zip(t_mu, t_sd))
    y = np.linspace(lo, hi, 600)
    q, p = _mix_pdf(y, p_w, p_mu, p_sd), _mix_pdf(y, t_w, t_mu, t_sd)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=y, y=q, name="proposal q", line=dict(color="#0284c7")))
    fig.add_trace(go.Scatter(x=y, y=p, name="target p*", line=dict(color="#e6007e")))
    fig.add_trace(go.Scatter(x=y, y=laws["M_time"] * q, name="envelope M·q", line=dict(color="#0284c7", dash="dash")))
    if laws.get("tau") is not None:
        yy = math.log(laws["tau"])
        fig.add_vline(x=yy, line=dict(color=KIND_COLOURS["accepted" if laws.get("kept") else "resampled"], width=2))
    fig.update_layout(title=f"step {laws['step']}, position {laws['position']}: M_time = {laws['M_time']:.3f}, "
                            f"M_type = {laws['M_type']:.3f}", xaxis_title="y = log τ", yaxis_title="density of y", **_LAYOUT)
    return fig


def qq_figure(a: Sequence[float], b: Sequence[float], names=("autoregressive", "speculative")) -> go.Figure:
    """Quantiles of log inter-event times of b against a (both samplers drew from the same model)."""
    qs = np.linspace(0.01, 0.99, 99)
    qa, qb = np.quantile(np.log(np.asarray(a)), qs), np.quantile(np.log(np.asarray(b)), qs)
    lim = [float(min(qa.min(), qb.min())), float(max(qa.max(), qb.max()))]
    fig = go.Figure([go.Scatter(x=qa, y=qb, mode="markers", name="quantiles", marker=dict(color="#e6007e", size=6)),
                     go.Scatter(x=lim, y=lim, mode="lines", name="y = x", line=dict(color="#9ca3af", dash="dot"))])
    fig.update_layout(title="QQ plot of log inter-event times", xaxis_title=f"{names[0]} quantile",
                      yaxis_title=f"{names[1]} quantile", **_LAYOUT)
    return fig


def throughput_figure(spec_eps: float, ar_eps: float, l: int) -> go.Figure:
    fig = go.Figure(go.Bar(x=[f"speculative (l={l})", "autoregressive"], y=[spec_eps, ar_eps],
                           marker_color=[KIND_COLOURS["accepted"], KIND_COLOURS["target"]],
                           text=[f"{spec_eps:.0f}", f"{ar_eps:.0f}"], textposition="auto"))
    fig.update_layout(title="events per second (this run)", yaxis_title="events/s", **_LAYOUT)
    return fig


def summary_markdown(spec: SampleResult, ar: SampleResult, l: int) -> str:
    st = spec.stats()
    ratio = spec.events_per_second / ar.events_per_second if ar.events_per_second else float("nan")
    return (f"| sampler | events | events/s | steps | acceptance rate | mean accepted / step |\n"
            f"|---|---:|---:|---:|---:|---:|\n"
            f"| speculative (l={l}) | {st['events']} | {st['events_per_s']:.0f} | {st['steps']} | "
            f"{st['acceptance_rate']:.3f} | {st['mean_accepted_per_step']:.2f} |\n"
            f"| autoregressive | {len(ar.times)} | {ar.events_per_second:.0f} | {len(ar.times)} | | |\n\n"
            f"Speedup (events/s ratio): **{ratio:.2f}×**. Target mass outside a truncated bound: "
            f"{st['max_mass_outside']:.2g} (0 = every M was a global bound).")
