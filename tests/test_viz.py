"""ears_core.report.viz: figures and HTML hold the data they claim to show (hand-made records + one real run)."""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go
import pytest

from conftest import perturbed_copy, tiny_llama
from ears_core import EARSRule, expected_tokens_per_step, generate, theoretical_speedup
from ears_core.report import viz
from ears_core.events import DraftRecord, StepRecord, TokenEvent


def ev(pos, kind, p=0.5, q=0.6, ratio=0.8, u=0.85, tol=0.1, max_p=0.5, step=0, text="x", rejected=None):
    bonus = kind in ("bonus", "target")
    return TokenEvent(step, pos, pos, text, kind, p, None if bonus else q, None if bonus else ratio,
                      None if bonus else u, None if bonus else tol, max_p, 0.0, rejected)


def dr(pos, kind, ratio, u, tol, p=0.4, q=0.5, max_p=0.6):
    return DraftRecord(pos, pos, kind, p, q, ratio, u, tol, max_p)


@pytest.fixture
def records():
    events = [ev(0, "accepted", max_p=0.9, tol=0.01), ev(1, "pardoned", max_p=0.4, tol=0.06),
              ev(2, "resampled", max_p=0.7, tol=0.03, rejected=5), ev(3, "bonus", max_p=0.2, p=0.1)]
    steps = [
        StepRecord(0, 3, 2, 1, 3, 1.0, 2.0, [dr(0, "accepted", 0.9, 0.3, 0.01), dr(1, "pardoned", 0.5, 0.55, 0.06),
                                             dr(2, "rejected", 2.7, 0.9, 0.5)]),  # r > cap, band clamped at 0
        StepRecord(1, 3, 3, 0, 4, 1.0, 2.0, []),
        StepRecord(2, 3, 0, 0, 1, 1.0, 2.0, []),
        StepRecord(3, 3, 2, 0, 3, 1.0, 2.0, []),
    ]
    return events, steps


def figure(spec, *args, **kwargs) -> go.Figure:
    """The validated plotly figure of a spec function's output."""
    return go.Figure(spec(*args, **kwargs))


def by_name(fig: go.Figure) -> dict[str, go.BaseTraceType]:
    return {t.name: t for t in fig.data}


def test_confidence_figure_traces(records):
    events, _ = records
    t = by_name(figure(viz.confidence_spec, events))
    assert list(t["max P_target"].y) == [0.9, 0.4, 0.7, 0.2]
    # the tolerance verify() applied; a bonus token had no test, so the band has a gap there
    assert list(t["tolerance applied"].y) == [0.01, 0.06, 0.03, None]
    assert t["tolerance applied"].fill == "tozeroy"
    assert list(t["p (pardoned)"].x) == [1] and list(t["p (bonus)"].y) == [0.1]
    assert t["p (pardoned)"].marker.color == viz.KIND_COLOURS["pardoned"]


def test_ratio_figure_band_and_cap(records):
    _, steps = records
    t = by_name(figure(viz.ratio_spec, steps, r_cap=1.5))
    band = t["pardon band"]
    assert list(band.x) == [0, 1, 2]
    assert list(band.base) == pytest.approx([0.29, 0.49, 0.4])  # max(U - tol, 0)
    assert list(band.y) == pytest.approx([0.01, 0.06, 0.5])  # heights: the band ends at U
    assert list(t["U"].y) == [0.3, 0.55, 0.9]
    assert list(t["r (pardoned)"].y) == [0.5]  # inside [U - tol, U): the pardon band
    assert list(t["r (rejected)"].y) == [1.5]  # capped for drawing, true value kept for hover
    assert t["r (rejected)"].customdata[0][0] == 2.7


def test_accept_length_histogram(records):
    _, steps = records
    t = by_name(figure(viz.accept_length_spec, steps, k=3))
    assert list(t["no pardon"].x) == [0, 1, 2, 3]
    assert list(t["no pardon"].y) == [1, 0, 1, 1]
    assert list(t["with a pardon"].y) == [0, 0, 1, 0]


def test_throughput_figure_rates():
    fig = figure(viz.throughput_spec, {"EARS": [(0.0, 0), (0.5, 4), (1.0, 10)], "target-only": [(0.0, 0), (2.0, 10)]})
    t = by_name(fig)
    assert list(t["EARS"].x) == [0.5, 1.0] and list(t["EARS"].y) == [8.0, 10.0]
    assert list(t["target-only"].y) == [5.0] and t["target-only"].line.dash == "dash"


def test_theory_figure_matches_formulas():
    fig = viz.theory_figure(3, 0.1, measured=(0.6, 2.0, 1.4), ks=(1, 8), n=11)
    curves = [t for t in fig.data if t.mode == "lines"]
    assert [t.name for t in curves] == ["K=1", "K=3", "K=8"] * 2
    e3, s3 = curves[1], curves[4]
    assert e3.line.width == 3  # the chosen K is bold
    for a, e, s in zip(e3.x, e3.y, s3.y):
        assert e == pytest.approx(expected_tokens_per_step(a, 3))
        assert s == pytest.approx(theoretical_speedup(a, 3, 0.1))
    assert e3.y[-1] == 4.0 and e3.y[0] == 1.0  # a = 1: K + 1 tokens; a = 0: one token
    stars = [t for t in fig.data if t.mode == "markers"]
    assert [(t.x[0], t.y[0]) for t in stars] == [(0.6, 2.0), (0.6, 1.4)]
    assert len(viz.theory_figure(3, 0.1, measured=(0.6, 2.0, None), ks=(1, 8)).data) == 7  # 6 curves, one star


def test_tokens_html_escapes_and_keeps_whitespace(records):
    events, _ = records
    events[0].text, events[1].text, events[2].text = "<b>&", " a\n", '"q"'
    out = viz.tokens_html(events, mark_position=1)
    assert "<b>" not in out and "&lt;b&gt;&amp;" in out
    assert " a\n</span>" in out and "white-space:pre-wrap" in out
    assert re.findall(r'data-kind="(\w+)"', out) == ["accepted", "pardoned", "resampled", "bonus"]
    titles = re.findall(r'title="([^"]*)"', out)
    assert "pardoned · step 0 · position 1" in titles[1] and "U = 0.850" in titles[1]
    assert "tolerance = 0.060" in titles[1] and "max P = 0.400" in titles[1]
    assert "rejected draft id 5" in titles[2] and "q = –" in titles[3]
    assert out.count("outline:2px") == 1
    assert "#e6007e" in out  # pardoned tokens get the eye-catching colour
    legend = viz.legend_html()
    assert all(f"legend-{k}" in legend for k in ("accepted", "pardoned", "resampled", "bonus"))


def test_first_divergence(records):
    events, _ = records
    other = [ev(e.position, e.kind) for e in events]
    assert viz.first_divergence(events, other) is None
    other[2].token_id = 99
    assert viz.first_divergence(events, other) == 2


def test_figures_from_a_real_run():
    """A tiny random pair through the decoder: the charts show exactly the run's records."""
    target = tiny_llama(0)
    draft = perturbed_copy(target, 0.03, seed=1)
    res = generate(target, draft, [1, 5, 7, 9], rule=EARSRule(0.5), k=4, temperature=1.0, max_new_tokens=40, seed=3)
    drafts = [d for s in res.steps for d in s.drafts]
    t = by_name(figure(viz.ratio_spec, res.steps))
    shown = sum(len(t[f"r ({k})"].x) for k in ("accepted", "pardoned", "rejected") if f"r ({k})" in t)
    assert shown == len(drafts) == sum(len(s.drafts) for s in res.steps) > 0
    for d in drafts:  # every pardoned ratio lies inside its band, every accepted one at or above U
        if d.kind == "pardoned":
            assert max(d.u - d.tolerance, 0) <= d.ratio < d.u
    h = by_name(figure(viz.accept_length_spec, res.steps, 4))
    assert sum(h["no pardon"].y) + sum(h["with a pardon"].y) == len(res.steps)
    assert sum(x * (a + b) for x, a, b in zip(h["no pardon"].x, h["no pardon"].y, h["with a pardon"].y)) == res.stats.accepted
    conf = by_name(figure(viz.confidence_spec, res.events))
    assert len(conf["max P_target"].y) == res.stats.new_tokens
    from ears_core.serve.summary import summary_markdown, summary_rows
    md = summary_markdown(summary_rows(res.stats, baseline_tps=res.stats.tokens_per_s / 2))
    assert "| speedup, measured | 2.00× |" in md and f"{res.stats.pardoned} pardoned" in md
    assert "end-of-sequence" not in md and "(ended at the end-of-sequence token)" in summary_markdown(
        summary_rows(res.stats, stop="eos"))
    assert not math.isnan(res.stats.mean_distortion)


def test_price_and_rounds_figures():
    from ears_core.policy.costs import PriceCurve, break_even_acceptance

    curve = PriceCurve([30.0, 31.8, 33.6, 48.0], 1.5, 0.5)
    fig = viz.price_figure(curve)
    steps_trace, _, bars = fig.data
    assert list(steps_trace.y) == pytest.approx([1.0, 1.06, 1.12, 1.6])
    assert list(bars.x) == [1, 2, 3] and list(bars.y) == pytest.approx([break_even_acceptance(curve, k) for k in (1, 2, 3)])
    assert 0 < bars.y[0] < bars.y[2] < 1  # the dearer pass needs more acceptance
    recs = [StepRecord(0, 2, 1, 0, 2, 1.0, 2.0, expected=1.6), StepRecord(1, 0, 0, 0, 1, 0.0, 2.0, expected=1.0)]
    t = by_name(viz.rounds_figure(recs))
    assert list(t["k drafts sent"].y) == [2, 0] and list(t["expected E(k)"].y) == [1.6, 1.0]
    assert list(t["emitted"].y) == [2, 1]


def test_the_beta_in_force_is_drawn_for_the_budget_rule(records):
    events, _ = records
    plain = by_name(figure(viz.confidence_spec, events))
    assert "β in force" not in plain
    beta = by_name(figure(viz.confidence_spec, events, show_beta=True))["β in force"]
    assert list(beta.y) == pytest.approx([0.01 / 0.1, 0.06 / 0.6, 0.03 / 0.3, None])  # tolerance / (1 - max P)


def test_the_apps_fast_json_draws_the_same_figure_as_the_validated_one():
    # The app sends specs as JSON without plotly's validation: the JSON must hold what the
    # validated figure holds (same traces, data and layout), and infinities must become null.
    import json

    import plotly.graph_objects as go

    from ears_core.events import DraftRecord, StepRecord

    drafts = [DraftRecord(position=0, token_id=5, kind="accepted", p=0.4, q=0.0, ratio=float("inf"), u=0.3,
                          tolerance=0.05, max_p=0.6)]
    steps = [StepRecord(step=0, drafted=1, accepted=1, pardoned=0, emitted=2, draft_ms=1.0, target_ms=30.0,
                        drafts=drafts)]
    for spec in (viz.ratio_spec(steps), viz.throughput_spec({"EARS": [(0.5, 4), (1.0, 9)]}),
                 viz.accept_length_spec(steps, 4)):
        fast = json.loads(viz.spec_json(spec))
        slow = json.loads(go.Figure(spec).to_json())
        assert fast["data"] == slow["data"]
        assert fast["layout"] == slow["layout"]
    assert json.loads(viz.spec_json(viz.ratio_spec(steps)))["data"][2]["customdata"][0][0] is None


def fixed_tree():
    """root -> 0 (rank 0, accepted) -> 2 (rank 0, pardoned) -> 4 (rank 0, rejected): resampled after it;
    root -> 1 (rank 1, never tried: 0 stood); 0 -> 3 (rank 1, never tried: 2 stood)."""
    from ears_core.decode.tree import TreeRecord

    return TreeRecord(step=5, start=12, tokens=[10, 11, 20, 21, 30], parents=[-1, -1, 0, 0, 2], depths=[1, 1, 2, 2, 3],
                      ranks=[0, 1, 0, 1, 0], scores=[0.6, 0.3, 0.3, 0.12, 0.15], priorities=[0.6, 0.3, 0.3, 0.12, 0.15],
                      kinds=["accepted", "", "pardoned", "", "rejected"], path=[0, 2], next_token=31,
                      next_kind="resampled")


def test_tree_figure_lays_out_by_depth_and_colours_nodes_as_the_stream():
    rec = fixed_tree()
    depth, row = viz.tree_layout(rec.parents, rec.ranks, rec.path)
    # entries: root, nodes 0..4, the emitted token; leaves take rows 0, 1, 2, 3 in depth-first rank order
    assert depth == [0, 1, 1, 2, 2, 3, 3]
    assert row == [2.125, 1.25, 3.0, 0.5, 2.0, 0.0, 1.0]
    labels = ["a", "b", "c", "d", "e"]
    fig = figure(viz.tree_spec, rec, labels, root_label="R", next_label="N")
    t = by_name(fig)
    assert list(t) == ["other branches", "accepted path", "root", "accepted", "pardoned", "rejected", "untested",
                       "resampled"]
    points = {name: list(zip(tr.x, tr.y, tr.text)) for name, tr in t.items() if tr.mode == "markers+text"}
    assert points == {"root": [(0, -2.125, "R")], "accepted": [(1, -1.25, "a")], "pardoned": [(2, -0.5, "c")],
                      "rejected": [(3, -0.0, "e")], "untested": [(1, -3.0, "b"), (2, -2.0, "d")],
                      "resampled": [(3, -1.0, "N")]}
    colours = {name: tr.marker.color for name, tr in t.items() if tr.mode == "markers+text"}
    assert colours == {"root": "#111827", "accepted": viz.KIND_COLOURS["accepted"],
                       "pardoned": viz.KIND_COLOURS["pardoned"], "rejected": viz.KIND_COLOURS["rejected"],
                       "untested": viz.KIND_COLOURS["untested"], "resampled": viz.KIND_COLOURS["resampled"]}
    assert list(t["resampled"].marker.symbol) == ["diamond"] and list(t["accepted"].marker.symbol) == ["circle"]
    # the path (root -> a -> c -> the emitted token) is drawn thick; every other edge thin
    path = t["accepted path"]
    assert list(path.x) == [0, 1, None, 1, 2, None, 2, 3, None] and path.line.width > t["other branches"].line.width
    assert list(path.y) == [-2.125, -1.25, None, -1.25, -0.5, None, -0.5, -1.0, None]
    assert len(t["other branches"].x) == 3 * 3  # root -> b, a -> d, c -> e
    assert "Round 5: 5 nodes, 2 stood" in fig.layout.title.text
    # a dict (the app's state) draws the same; without labels, token ids
    same = by_name(figure(viz.tree_spec, rec.to_dict(), labels, "R", "N"))
    assert [tr.to_plotly_json() for tr in same.values()] == [tr.to_plotly_json() for tr in t.values()]
    plain = by_name(figure(viz.tree_spec, rec.to_dict()))
    assert plain["accepted"].text == ("10",) and plain["resampled"].text == ("31",) and plain["root"].text == ("root",)


def test_an_empty_tree_is_the_root_and_the_target_token():
    from ears_core.decode.tree import TreeRecord

    rec = TreeRecord(0, 0, [], [], [], [], [], [], [], [], 7, "target")
    t = by_name(figure(viz.tree_spec, rec))
    assert list(t["target"].x) == [1] and list(t["root"].x) == [0] and list(t["accepted path"].x) == [0, 1, None]
