"""The quality frontier: accuracy against speedup, one curve per rule over its knob, distortion as colour.

Pure: the quality section's rows in (``quality.summary.pool``), a plotly spec out (a dict ``go.Figure``
takes; ``viz.spec_json`` sends it to the app unvalidated). The bench's report and the app's Quality
tab draw the same figure.

Terms
-----
row        one setting's pooled figures: ``setting`` (label), ``method``, ``knob``, ``value``,
           ``accuracy`` and ``accuracy_ci``, ``speedup`` (against target-only), ``distortion``.
band       target-only's 95 % interval, shaded across the plot: a rule inside it answers as well as
           the target alone, as far as this many questions can tell.
paper      the EARS paper's headline (+18 % speed, -0.84 points of GSM8K accuracy at T = 0.9, EARS
           against its ordinary rule), placed relative to this sweep's ordinary rule: a reference for
           the size of the trade, not a measurement here.
live       rows from a run on the machine at hand (the app's live sweep), drawn over the shipped ones
           with open markers.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["frontier_spec", "PALETTE"]

PALETTE = {"standard": "#636efa", "ears": "#e6007e", "ears-entropy": "#00a087", "typical": "#f59e0b", "fly": "#7c3aed",
           "ears-budget": "#0284c7"}
_NAMES = {"standard": "ordinary", "ears": "EARS (beta)", "ears-entropy": "entropy tolerance (beta)",
          "typical": "typical acceptance (eps)", "fly": "FLy (gate)", "ears-budget": "distortion budget (epsilon)"}


def _err(pts: Sequence[Mapping[str, Any]], colour: str = "#111827") -> dict[str, Any]:
    ci = [p.get("accuracy_ci") or [None, None] for p in pts]
    return dict(type="data", symmetric=False, thickness=1, width=3, color=colour,
                array=[None if c[1] is None else c[1] - p["accuracy"] for p, c in zip(pts, ci)],
                arrayminus=[None if c[0] is None else p["accuracy"] - c[0] for p, c in zip(pts, ci)])


def _hover(p: Mapping[str, Any]) -> str:
    ci = p.get("accuracy_ci") or [None, None]
    parts = [f"<b>{p['setting']}</b>", f"accuracy {p['accuracy']:.3f}"
             + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if None not in ci else ""),
             f"speedup {p['speedup']:.2f}x" if p.get("speedup") is not None else "speedup: n/a"]
    if p.get("distortion") is not None:
        parts.append(f"distortion {p['distortion']:.4f} TV/token")
    return "<br>".join(parts)


def _curves(rows: Sequence[Mapping[str, Any]], live: bool) -> list[dict[str, Any]]:
    """One trace per rule: its points in knob order, markers coloured by distortion."""
    data = []
    pts_all = [r for r in rows if r["method"] != "target" and r.get("speedup") is not None and r.get("accuracy") is not None]
    for method in dict.fromkeys(r["method"] for r in pts_all):
        pts = sorted((r for r in pts_all if r["method"] == method), key=lambda r: (r.get("value") is None, r.get("value") or 0))
        ordinary = method == "standard"
        name = _NAMES.get(method, method) + (" (live)" if live else "")
        data.append(dict(
            type="scatter", x=[p["speedup"] for p in pts], y=[p["accuracy"] for p in pts], name=name,
            mode="markers" if ordinary or len(pts) == 1 else "lines+markers+text",
            text=[] if ordinary else [f"{p['value']:g}" for p in pts], textposition="top center",
            hovertext=[_hover(p) for p in pts], hoverinfo="text", error_y=_err(pts, PALETTE.get(method, "#6b7280")),
            line=dict(color=PALETTE.get(method, "#6b7280"), width=1.5, dash="dot" if live else "solid"),
            marker=dict(size=15 if ordinary else 11, symbol=("star" if ordinary else "circle") + ("-open" if live else ""),
                        color=[p.get("distortion") or 0.0 for p in pts], coloraxis="coloraxis",
                        line=dict(color=PALETTE.get(method, "#6b7280"), width=2))))
    return data


def _target(rows: Sequence[Mapping[str, Any]], live: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Target-only's point and its band (a shape), if it has a row."""
    base = next((r for r in rows if r["method"] == "target" and r.get("accuracy") is not None), None)
    if base is None:
        return [], []
    trace = dict(type="scatter", x=[1.0], y=[base["accuracy"]], name="target-only" + (" (live)" if live else ""),
                 mode="markers", error_y=_err([base]), hovertext=[_hover(dict(base, speedup=1.0))], hoverinfo="text",
                 marker=dict(size=12, symbol="square-open" if live else "square", color="#111827"))
    ci = base.get("accuracy_ci") or [None, None]
    shapes = [] if None in ci else [dict(type="rect", xref="paper", x0=0, x1=1, y0=ci[0], y1=ci[1], line=dict(width=0),
                                         fillcolor="rgba(17,24,39,0.06)" if live else "rgba(17,24,39,0.10)", layer="below")]
    return [trace], shapes


def _paper(rows: Sequence[Mapping[str, Any]], paper: Mapping[str, Any]) -> list[dict[str, Any]]:
    ref = next((r for r in rows if r["method"] == "standard" and r.get("speedup") is not None), None)
    if ref is None:
        return []
    x, y = ref["speedup"] * paper["speedup"], ref["accuracy"] + paper["accuracy_delta"]
    return [dict(type="scatter", x=[x], y=[y], mode="markers", name="EARS paper (relative to ordinary)",
                 hovertext=[paper["label"]], hoverinfo="text",
                 marker=dict(symbol="x", size=13, color="#111827", line=dict(width=1)))]


def frontier_spec(rows: Sequence[Mapping[str, Any]], paper: Mapping[str, Any] | None = None,
                  live: Sequence[Mapping[str, Any]] = (), title: str | None = None) -> dict[str, Any]:
    """The frontier figure (module terms) from the shipped ``rows`` and optional ``live`` rows."""
    data, shapes = [], []
    for rs, is_live in ((rows, False), (live, True)):
        t, s = _target(rs, is_live)
        data += t + _curves(rs, is_live)
        shapes += s
    if paper:
        data += _paper(rows or live, paper)
    layout = dict(
        title=dict(text=title or "Accuracy against speed: each rule over its knob (colour: distortion)"),
        xaxis=dict(title=dict(text="speedup against target-only (same questions and seeds)"), zeroline=False),
        yaxis=dict(title=dict(text="accuracy (95 % bootstrap interval over questions)"), rangemode="tozero"),
        coloraxis=dict(colorscale="Viridis", cmin=0, cmax=max([0.01, *(r.get("distortion") or 0 for r in (*rows, *live))]),
                       colorbar=dict(title=dict(text="TV / token"), len=0.6, y=0.3)),
        shapes=shapes, legend=dict(orientation="h", y=-0.2), margin=dict(l=60, r=20, t=50, b=40), height=520,
        template="plotly_white")
    return dict(data=data, layout=layout)
