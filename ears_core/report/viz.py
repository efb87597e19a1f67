"""Plotly figures and HTML for the EARS Studio UI, built from a generation's records.

Pure functions: records in, a figure spec (a dict ``go.Figure`` takes; ``spec_json`` sends it to the app
unvalidated), a ``go.Figure``, or an HTML / Markdown string out. No gradio here, so
the same figures work in a notebook, a report or the app.

Terms (see events.py and metrics.py)
------------------------------------
event        a TokenEvent: one emitted token and how it was decided (accepted, pardoned,
             resampled, bonus, target)
draft        a DraftRecord: one drafted token put to the target, rejected ones included
max P        max over the vocabulary of P_target at a position; the EARS tolerance is
             beta * (1 - max P): wide where the target is unsure, ~0 where it is sure
pardon band  U - tolerance <= r < U: a ratio r in this band fails the ordinary test but EARS
             accepts it
samples      throughput samples ``[(elapsed_s, tokens_so_far), ...]`` recorded while a run streams
E, S         expected tokens per round and theoretical speedup (metrics.py)
tree round   a ``TreeRecord`` (decode/tree.py) (or its dict): the nodes one round drafted, their
             parents, the kind each got (accepted, pardoned, rejected, or untested: never tried
             because the walk went another way), the accepted path and the token the round
             emitted after it (resampled, bonus or target)
"""

from __future__ import annotations

import functools
import html
from typing import Any, Mapping, Sequence

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.json import to_json_plotly
from plotly.subplots import make_subplots

from ears_core.events import DraftRecord, StepRecord, TokenEvent
from ears_core.metrics import expected_tokens_per_step, theoretical_speedup

__all__ = [
    "KIND_COLOURS", "KIND_LABELS", "confidence_spec", "ratio_spec", "throughput_spec", "accept_length_spec",
    "tree_spec", "tree_layout", "spec_json", "price_figure", "rounds_figure", "theory_figure", "tokens_html",
    "legend_html", "first_divergence",
]

# Strong colours for chart markers; the token HTML uses the same hues as backgrounds.
KIND_COLOURS = {
    "accepted": "#2e7d32",  # green
    "pardoned": "#e6007e",  # magenta: the one that should catch the eye
    "resampled": "#f59e0b",  # amber
    "bonus": "#0284c7",  # blue
    "target": "#6b7280",  # grey: target-only baseline
    "rejected": "#dc2626",  # red: a draft that lost its test (charts only)
    "untested": "#d1d5db",  # light grey: a tree node never tried (tree chart only)
}
_TOKEN_STYLE = {  # (background, text colour, extra css)
    "accepted": ("#c8f0cc", "#0b3d12", ""),
    "pardoned": ("#e6007e", "#ffffff", "font-weight:700;"),
    "resampled": ("#fde68a", "#5c3a00", ""),
    "bonus": ("#bae6fd", "#063a5a", ""),
    "target": ("#eceff3", "#1f2937", ""),
}
KIND_LABELS = {
    "accepted": "accepted (ordinary rule)",
    "pardoned": "pardoned by EARS",
    "resampled": "resampled after a rejection",
    "bonus": "bonus (all K stood)",
    "target": "target-only",
}
# The legend sits at the foot of the figure, under the x-axis title: plotly grows the bottom margin to fit
# it, so however many rows it wraps into at a narrow width it never covers the title or a trace.
_LAYOUT = dict(template="plotly_white", height=340, margin=dict(l=50, r=20, t=40, b=40),
               legend=dict(orientation="h", yref="container", yanchor="bottom", y=0, x=0))


def _fig(title: str, x: str, y: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=dict(text=title, font=dict(size=14)), xaxis_title=x, yaxis_title=y, **_LAYOUT)
    return fig


# ----------------------------------------------------------------------------- figure specs
# The charts a run redraws while it decodes are built as plain dicts ("specs": {"data": [...],
# "layout": {...}}): ``go.Figure(spec)`` validates one (tests and notebooks), while
# ``spec_json`` turns it into plotly JSON far faster (docs/measurements.md), which is what the app sends
# a few times a second without taking the interpreter from the decode thread.


@functools.lru_cache(maxsize=1)
def _template() -> dict[str, Any]:
    """plotly_white as a dict: the JSON path sends it inline, as go.Figure would."""
    return pio.templates["plotly_white"].to_plotly_json()


def _layout(title: str, x: str, y: str, **extra: Any) -> dict[str, Any]:
    lay = {k: v for k, v in _LAYOUT.items() if k != "template"}
    lay.update(template=_template(), title=dict(text=title, font=dict(size=14)),
               xaxis=dict(title=dict(text=x)), yaxis=dict(title=dict(text=y)))
    for axis in ("xaxis", "yaxis"):
        lay[axis].update(extra.pop(axis, {}))
    lay.update(extra)
    return lay


def spec_json(spec: Mapping[str, Any]) -> str:
    """Plotly JSON of a spec, unvalidated (NaN and infinities become null)."""
    return to_json_plotly(spec)


# ----------------------------------------------------------------------------- per-position charts


def confidence_spec(events: Sequence[TokenEvent], show_beta: bool = False) -> dict[str, Any]:
    """Max P_target per position, the tolerance the rule applied there (``TokenEvent.tolerance``,
    from verify) shaded below it, and the emitted token's p as markers coloured by kind.
    Positions without a test (bonus and target tokens) leave a gap in the band. ``show_beta``
    adds the beta in force at each position, tolerance / (1 - max P) (for a rule that sets beta
    each round, the distortion budget). Traces: [max P, tolerance, one per kind, beta]."""
    xs = [e.position for e in events]
    data = [dict(type="scatter", x=xs, y=[e.max_p for e in events], name="max P_target", mode="lines",
                 line=dict(color="#111827", width=2)),
            dict(type="scatter", x=xs, y=[e.tolerance for e in events], name="tolerance applied", mode="lines",
                 fill="tozeroy", line=dict(color=KIND_COLOURS["pardoned"], width=1), fillcolor="rgba(230,0,126,0.18)")]
    for kind in ("accepted", "pardoned", "resampled", "bonus", "target"):
        sel = [e for e in events if e.kind == kind]
        if sel:
            data.append(dict(type="scatter", x=[e.position for e in sel], y=[e.p for e in sel], mode="markers",
                             name=f"p ({kind})", marker=dict(color=KIND_COLOURS[kind], size=7)))
    if show_beta:
        beta = [e.tolerance / (1.0 - e.max_p) if e.tolerance is not None and e.max_p < 1 - 1e-6 else None
                for e in events]
        data.append(dict(type="scatter", x=xs, y=beta, name="β in force", mode="lines",
                         line=dict(color="#7c3aed", width=1.5, dash="dash")))
    return dict(data=data, layout=_layout("Target confidence and EARS tolerance", "position", "probability",
                                          yaxis=dict(range=[0, 1.05])))


def _drafts(steps: Sequence[StepRecord]) -> list[DraftRecord]:
    return [d for s in steps for d in s.drafts]


def ratio_spec(steps: Sequence[StepRecord], r_cap: float = 1.5) -> dict[str, Any]:
    """Ratio r = p/q against the uniform U for every drafted token, with the pardon band
    [max(U - tol, 0), U) drawn as a shaded bar at each token. r is drawn capped at ``r_cap``
    (the hover shows the true value). Traces: [pardon band, U, one r trace per draft kind]."""
    drafts = _drafts(steps)
    xs = [d.position for d in drafts]
    lows = [max(d.u - d.tolerance, 0.0) for d in drafts]
    data = [dict(type="bar", x=xs, y=[d.u - lo for d, lo in zip(drafts, lows)], base=lows, name="pardon band",
                 marker=dict(color="rgba(230,0,126,0.25)", line=dict(width=0)), width=0.8,
                 hovertemplate="band [%{base:.3f}, %{customdata:.3f})<extra></extra>", customdata=[d.u for d in drafts]),
            dict(type="scatter", x=xs, y=[d.u for d in drafts], mode="markers", name="U",
                 marker=dict(symbol="line-ew-open", size=14, color="#111827", line=dict(width=2)))]
    for kind in ("accepted", "pardoned", "rejected"):
        sel = [d for d in drafts if d.kind == kind]
        if sel:
            data.append(dict(
                type="scatter", x=[d.position for d in sel], y=[min(d.ratio, r_cap) for d in sel], mode="markers",
                name=f"r ({kind})", marker=dict(color=KIND_COLOURS[kind], size=8),
                customdata=[[d.ratio, d.u, d.tolerance] for d in sel],
                hovertemplate="r=%{customdata[0]:.3f} U=%{customdata[1]:.3f} tol=%{customdata[2]:.3f}<extra></extra>"))
    return dict(data=data, layout=_layout("Ratio r = p/q against U, per drafted token", "position", "r, U",
                                          barmode="overlay", yaxis=dict(range=[0, r_cap + 0.05])))


# ----------------------------------------------------------------------------- run-level charts


def throughput_spec(runs: Mapping[str, Sequence[tuple[float, int]]]) -> dict[str, Any]:
    """Tokens/s so far (tokens_so_far / elapsed_s) against elapsed time, one line per run, e.g.
    {"EARS": samples, "target-only": samples}. Samples with elapsed_s <= 0 are skipped."""
    palette = ["#e6007e", "#0284c7", "#6b7280", "#2e7d32"]
    data = []
    for i, (name, samples) in enumerate(runs.items()):
        pts = [(t, n) for t, n in samples if t > 0]
        colour = KIND_COLOURS["target"] if "target" in name else palette[i % len(palette)]
        data.append(dict(type="scatter", x=[t for t, _ in pts], y=[n / t for t, n in pts], mode="lines", name=name,
                         line=dict(color=colour, width=2, dash="dash" if "target" in name else "solid")))
    return dict(data=data, layout=_layout("Throughput: tokens/s so far", "elapsed (s)", "tokens / s"))


def accept_length_spec(steps: Sequence[StepRecord], k: int) -> dict[str, Any]:
    """Histogram of drafts that stood per round (0..K), split into rounds with and without a
    pardon (stacked). Traces: [without pardon, with pardon], x = 0..K, y = round counts."""
    top = max([k] + [s.accepted for s in steps])
    xs = list(range(top + 1))
    plain, pardoned = [0] * (top + 1), [0] * (top + 1)
    for s in steps:
        (pardoned if s.pardoned else plain)[s.accepted] += 1
    data = [dict(type="bar", x=xs, y=plain, name="no pardon", marker=dict(color=KIND_COLOURS["accepted"])),
            dict(type="bar", x=xs, y=pardoned, name="with a pardon", marker=dict(color=KIND_COLOURS["pardoned"]))]
    return dict(data=data, layout=_layout("Drafts that stood per round", "drafts accepted in the round", "rounds",
                                          barmode="stack", xaxis=dict(dtick=1)))


def theory_figure(k: int, c: float, measured: tuple[float, float | None, float | None] | None = None,
                  ks: Sequence[int] = (1, 2, 4, 8), n: int = 101) -> go.Figure:
    """E(a, K) and S(a, K, c) against acceptance rate a (two panels), one curve per K in ks plus
    the chosen ``k`` (drawn bold). ``measured`` = (a, tokens per round, measured speedup) of a run
    (None entries are not drawn). Trace order: E curves, S curves, then measured points."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("E: expected tokens per round", f"S: speedup at c = {c:.3f}"))
    a_grid = [i / (n - 1) for i in range(n)]
    all_k = sorted(set(ks) | {k})
    for col, fn in ((1, lambda a, kk: expected_tokens_per_step(a, kk)), (2, lambda a, kk: theoretical_speedup(a, kk, c))):
        for kk in all_k:
            bold = kk == k
            fig.add_trace(go.Scatter(x=a_grid, y=[fn(a, kk) for a in a_grid], mode="lines", name=f"K={kk}",
                                     legendgroup=f"K{kk}", showlegend=col == 1,
                                     line=dict(width=3 if bold else 1, color="#e6007e" if bold else None),
                                     opacity=1.0 if bold else 0.5), row=1, col=col)
    if measured is not None:
        a, e_meas, s_meas = measured
        for col, y, label in ((1, e_meas, "measured tokens/round"), (2, s_meas, "measured speedup")):
            if y is not None:
                fig.add_trace(go.Scatter(x=[a], y=[y], mode="markers", name=label,
                                         marker=dict(symbol="star", size=16, color="#111827")), row=1, col=col)
    fig.add_hline(y=1.0, line=dict(dash="dot", color="#9ca3af"), row=1, col=2)
    fig.update_xaxes(title_text="acceptance rate a", range=[0, 1])
    fig.update_layout(template="plotly_white", height=340, margin=dict(l=50, r=20, t=50, b=40))
    return fig


def price_figure(curve: Any) -> go.Figure:
    """This machine's measured price curve (``costs.PriceCurve``): the verify price V(m) in target
    steps against m new tokens, and (second panel) the acceptance per drafted token at which k
    drafts pay as much as a plain target step (break-even; 1 where they never do)."""
    from ears_core.policy.costs import break_even_acceptance

    fig = make_subplots(rows=1, cols=2, subplot_titles=("verify price: a target pass over m tokens, in steps",
                                                        "break-even acceptance for k drafts"))
    ms = list(range(1, curve.max_m + 1))
    fig.add_trace(go.Scatter(x=ms, y=[curve.steps(m) for m in ms], mode="lines+markers", name="V(m) / V(1)",
                             line=dict(color="#111827", width=2)), row=1, col=1)
    fig.add_trace(go.Scatter(x=ms, y=ms, mode="lines", name="m (no batching gain)",
                             line=dict(dash="dot", color="#9ca3af")), row=1, col=1)
    ks = list(range(1, curve.max_m))
    fig.add_trace(go.Bar(x=ks, y=[break_even_acceptance(curve, k) for k in ks], name="break-even a",
                         marker_color=KIND_COLOURS["pardoned"]), row=1, col=2)
    fig.update_xaxes(title_text="m new tokens", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="k drafts per round", dtick=1, row=1, col=2)
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(template="plotly_white", height=320, margin=dict(l=50, r=20, t=50, b=40),
                      title=dict(text=f"{curve.step_ms:.1f} ms a step · draft step {curve.draft_ms:.2f} ms · "
                                 f"overhead {curve.overhead_ms:.2f} ms", font=dict(size=12)))
    return fig


def rounds_figure(steps: Sequence[StepRecord]) -> go.Figure:
    """Each round's decision: the drafts the policy sent (k), the tokens it expected E(k) and the
    tokens the round emitted. Traces: [k, expected, emitted]."""
    fig = _fig("Each round: drafts sent, tokens expected and emitted", "round", "tokens")
    xs = [s.step for s in steps]
    fig.add_trace(go.Bar(x=xs, y=[s.drafted for s in steps], name="k drafts sent", marker_color="#cbd5e1"))
    fig.add_trace(go.Scatter(x=xs, y=[s.expected for s in steps], mode="markers", name="expected E(k)",
                             marker=dict(symbol="circle-open", size=9, color="#111827")))
    fig.add_trace(go.Scatter(x=xs, y=[s.emitted for s in steps], mode="markers", name="emitted",
                             marker=dict(size=6, color=KIND_COLOURS["accepted"])))
    return fig


# ----------------------------------------------------------------------------- a round's tree


def tree_layout(parents: Sequence[int], ranks: Sequence[int], path: Sequence[int]) -> tuple[list[int], list[float]]:
    """(depth, row) of every entry of a drawn round: entry 0 is the root (the last committed token),
    1..N the nodes, N + 1 the token emitted after the path (a child of the path's last node).
    Siblings are ordered by rank, the emitted token after them; each leaf takes the next row and
    a parent sits midway between its first and last child, so no two edges cross."""
    n = len(parents)
    parent = [-1] + [p + 1 for p in parents] + [(path[-1] + 1) if path else 0]
    kids: list[list[int]] = [[] for _ in range(n + 2)]
    for e in sorted(range(1, n + 1), key=lambda e: ranks[e - 1]):
        kids[parent[e]].append(e)
    kids[parent[n + 1]].append(n + 1)
    depth, row, leaves = [0] * (n + 2), [0.0] * (n + 2), [0]

    def place(e: int) -> None:  # the tree is at most a few dozen entries deep
        for c in kids[e]:
            depth[c] = depth[e] + 1
            place(c)
        if kids[e]:
            row[e] = (row[kids[e][0]] + row[kids[e][-1]]) / 2
        else:
            row[e], leaves[0] = float(leaves[0]), leaves[0] + 1

    place(0)
    return depth, row


def tree_spec(record: Any, labels: Sequence[str] | None = None, root_label: str | None = None,
              next_label: str | None = None) -> dict[str, Any]:
    """One round's tree (a ``TreeRecord`` or its dict): entries laid out by depth (``tree_layout``),
    edges to parents (the accepted path thick and dark), nodes coloured as the token stream colours
    tokens (accepted, pardoned; rejected red, untested grey), the emitted token after the path as a
    diamond of its kind, token text beside each node (``labels``, else a record's ``labels``, else
    token ids). Traces: [other edges, path edges, then one per kind present: root, accepted,
    pardoned, rejected, untested, resampled, bonus, target]."""
    get = (lambda k, d=None: record.get(k, d)) if isinstance(record, Mapping) else (lambda k, d=None: getattr(record, k, d))
    tokens, parents, path = list(get("tokens")), list(get("parents")), list(get("path"))
    n, kinds = len(tokens), ["root"] + [k or "untested" for k in get("kinds")] + [get("next_kind")]
    text = [root_label or get("root_label") or "root", *(labels or get("labels") or map(str, tokens)),
            next_label or get("next_label") or str(get("next_token"))]
    depth, row = tree_layout(parents, get("ranks"), path)
    parent = [-1] + [p + 1 for p in parents] + [(path[-1] + 1) if path else 0]
    on_path = {0, n + 1} | {a + 1 for a in path}
    data = []
    for name, keep, line in (("other branches", False, dict(color="#cbd5e1", width=1.5)),
                             ("accepted path", True, dict(color="#111827", width=3.5))):
        sel = [e for e in range(1, n + 2) if (e in on_path) == keep]  # edges: parent -> e, None between
        data.append(dict(type="scatter", mode="lines", name=name, hoverinfo="skip", showlegend=keep, line=line,
                         x=[v for e in sel for v in (depth[parent[e]], depth[e], None)],
                         y=[v for e in sel for v in (-row[parent[e]], -row[e], None)]))
    for k in ("root", "accepted", "pardoned", "rejected", "untested", "resampled", "bonus", "target"):
        sel = [e for e in range(n + 2) if kinds[e] == k]
        if sel:
            data.append(dict(
                type="scatter", mode="markers+text", name=k, x=[depth[e] for e in sel], y=[-row[e] for e in sel],
                text=[text[e] for e in sel], textposition="middle right", cliponaxis=False,
                marker=dict(color="#111827" if k == "root" else KIND_COLOURS[k],
                            size=[16 if e in on_path else 11 for e in sel],
                            symbol=["diamond" if e == n + 1 else "circle" for e in sel],
                            line=dict(color="#111827", width=[2 if e in on_path else 0 for e in sel])),
                customdata=[[e - 1, depth[e]] for e in sel],
                hovertemplate="%{text}<br>node %{customdata[0]}, depth %{customdata[1]}<extra>" + k + "</extra>"))
    return dict(data=data, layout=_layout(f"Round {get('step', 0)}: {n} nodes, {len(path)} stood", "depth", "",
                                          xaxis=dict(dtick=1, range=[-0.3, max(depth) + 1.2]),
                                          yaxis=dict(showticklabels=False, zeroline=False, showgrid=False)))


# ----------------------------------------------------------------------------- HTML and text


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _token_title(e: TokenEvent) -> str:
    lines = [f"{e.kind} · step {e.step} · position {e.position}", f"p = {_fmt(e.p)}   q = {_fmt(e.q)}",
             f"ratio = {_fmt(e.ratio)}   U = {_fmt(e.u)}", f"tolerance = {_fmt(e.tolerance)}   max P = {_fmt(e.max_p)}"]
    if e.rejected_token is not None:
        lines.append(f"rejected draft id {e.rejected_token}")
    return "\n".join(lines)


def tokens_html(events: Sequence[TokenEvent], mark_position: int | None = None, cursor: bool = False) -> str:
    """One <span> per token, coloured by kind, with a hover title (p, q, ratio, U, tolerance,
    max P, step). Text is HTML-escaped; the wrapper keeps spaces and newlines (pre-wrap).
    ``mark_position`` outlines one token (the race's first divergence)."""
    parts = []
    for e in events:
        bg, fg, extra = _TOKEN_STYLE.get(e.kind, _TOKEN_STYLE["target"])
        if e.position == mark_position:
            extra += "outline:2px solid #111827;outline-offset:1px;"
        text = e.text if e.text else "\u200b"  # an unfinished character still gets a (thin) span
        parts.append(
            f'<span class="tok tok-{e.kind}" data-kind="{e.kind}" data-pos="{e.position}" '
            f'title="{html.escape(_token_title(e), quote=True)}" '
            f'style="background:{bg};color:{fg};{extra}border-radius:3px;'
            f'box-shadow:inset -1px 0 0 rgba(0,0,0,0.18);padding:1px 0">{html.escape(text)}</span>')
    if cursor:
        parts.append('<span class="tok-cursor" style="opacity:.6">▌</span>')
    return ('<div class="ears-tokens" style="white-space:pre-wrap;word-break:break-word;line-height:1.7;'
            f'font-size:15px;min-height:3em">{"".join(parts)}</div>')


def legend_html(kinds: Sequence[str] = ("accepted", "pardoned", "resampled", "bonus")) -> str:
    """The colour key for ``tokens_html``."""
    items = []
    for kind in kinds:
        bg, fg, extra = _TOKEN_STYLE[kind]
        items.append(f'<span class="legend-{kind}" style="background:{bg};color:{fg};{extra}border-radius:3px;'
                     f'padding:2px 6px;margin-right:8px">{html.escape(KIND_LABELS[kind])}</span>')
    return f'<div class="ears-legend" style="line-height:2">{"".join(items)}</div>'


def first_divergence(a: Sequence[TokenEvent], b: Sequence[TokenEvent]) -> int | None:
    """The first position where two runs emitted different tokens (None if one is a prefix)."""
    for ea, eb in zip(a, b):
        if ea.token_id != eb.token_id:
            return ea.position
    return None
