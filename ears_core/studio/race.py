"""The Race tab: two registered rules and target-only decoding on one prompt and seed.

Terms
-----
racers       rule A and rule B, any two rules of the registry (EARS and the ordinary rule by
             default), with the shared parameter sliders, then target-only decoding. They run one
             after another, each in its own thread on its own decode clock (``live``); the table
             gives each one's wall clock and time to first token beside it.
same draws   every run derives its uniform draws from (seed, position), so A and B make the same
             decisions until the first position where their rules disagree: the first divergence
             (outlined in both), e.g. a pardon of EARS that the ordinary rule refused.
budget       the three runs share ``Settings.timeout_s`` seconds of decoding; a run that reaches it
             keeps its tokens and ends the race with the timeout message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import gradio as gr

from ears_core.report import viz
from ears_core.serve.pair_slot import PairSlot
from ears_core.serve.session import RunConfig

from .api import named, race_params
from .controls import DEFAULT_RULE, rule_choices, run_config, run_name
from .errors import check_request, fail, message, timeout_note
from .live import Runs, frames, plot, snapshot
from .pairs import LOADING

RULE_B = "standard"


def _table(names: Sequence[str], results: Sequence[Any], contended: Sequence[bool]) -> list[str]:
    base_tps = results[-1].stats.tokens_per_s
    lines = ["| run | tokens/s | speedup | tokens/s, wall clock | time to first token | acceptance | pardons | "
             "mean distortion |", "|---|---|---|---|---|---|---|---|"]
    for name, res, busy in zip(names, results, contended):
        s = res.stats
        acc = "–" if s.acceptance_rate is None else f"{s.acceptance_rate:.2f}"
        speed = f"{s.tokens_per_s / base_tps:.2f}×" if base_tps else "–"
        wall = "–" if s.wall_tokens_per_s is None else f"{s.wall_tokens_per_s:.1f}"
        ttft = "–" if s.ttft_s is None else f"{s.ttft_s:.2f} s"
        lines.append(f"| {name} | {s.tokens_per_s:.1f}{' (contended)' if busy else ''} | {speed} | {wall} | {ttft} | "
                     f"{acc} | {s.pardoned} | {s.mean_distortion:.4f} |")
    if any(contended):
        lines.append("\n*contended*: another decode or job held the cores meanwhile, so these speeds are not clean figures.")
    return lines


def make_race(slot: PairSlot, names: Sequence[str]) -> Callable:
    """The ``/race`` callback; ``names`` are the parameter sliders' names (beta first), its
    parameters ``api.race_params``."""

    def race(a: dict[str, Any]):
        """The race; any failure, even mid-run, becomes a short message."""
        runs = Runs()
        given = [n for n in names if a[n] is not None]  # a parameter left out takes the rule's default
        try:
            yield from _race(slot, runs, a, given)
        except Exception as exc:
            yield gr.skip(), gr.skip(), gr.skip(), fail(exc), gr.skip()
        finally:
            runs.stop_all()

    return named(race, race_params(names, DEFAULT_RULE, RULE_B))


def _race(slot: PairSlot, runs: Runs, a: dict[str, Any], given: list[str]):
    """Rule A, rule B, then target-only on one prompt and seed (module terms), drawn while they decode."""
    settings = slot.settings
    empty = viz.tokens_html([])
    try:
        req = check_request(a["prompt"], a["temperature"], a["k"], a["max_new"], a["seed"],
                            max_new_tokens=settings.max_new_tokens, max_prompt_chars=settings.max_prompt_chars)
        # K drafts every round for both rules: the same draws at the same positions, so their first
        # difference is where the rules decided differently (a policy would verify different positions)
        cfgs = [run_config(r, req, given, [a[n] for n in given], "fixed") for r in (a["rule_a"], a["rule_b"])]
        base_cfg = RunConfig(rule=RULE_B, params={}, temperature=req.temperature, k=req.k,
                             max_new_tokens=req.max_new, seed=req.seed)
        if slot.loaded is None:  # the pair is still loading (a server's start, a switch): wait for it
            yield empty, empty, empty, f"*{LOADING}*", gr.skip()
        session = slot.session()
        ids = session.encode(req.prompt)
    except Exception as exc:
        yield empty, empty, empty, fail(exc), gr.skip()
        return
    labels = [run_name(c) for c in cfgs]
    if labels[0] == labels[1]:
        labels = [f"A: {labels[0]}", f"B: {labels[1]}"]
    labels.append("target-only")
    html, curves, results, contended = [empty] * 3, {}, [], []
    budget = slot.decode_budget_s()  # after the session: a ZeroGPU worker's start-up counts against it
    for i, name in enumerate(labels):
        left = max(budget - sum(r.stats.decode_s for r in results), 0.0)
        tracked = session.speculative(ids, cfgs[i], left) if i < 2 else session.baseline(ids, base_cfg, left)
        run = runs.start(tracked)
        for _ in frames(run):
            events, _, samples = snapshot(run)
            html[i] = viz.tokens_html(events, cursor=True)
            yield *html, f"*racing: {name}…*", plot(viz.throughput_spec({**curves, name: samples}))
        res = run.result()
        html[i], curves[name] = viz.tokens_html(res.events), list(run.gen.samples)
        if res.timed_out:
            yield *html, message(timeout_note(budget) + f" (during {name})"), plot(viz.throughput_spec(curves))
            return
        results.append(res)
        contended.append(run.contended)
    if not any(contended):
        session.remember_baseline(ids, base_cfg, run)  # the target-only run is a clean baseline
    yield *_finish(labels, results, contended), plot(viz.throughput_spec(curves))


def _finish(labels: Sequence[str], results: Sequence[Any], contended: Sequence[bool]) -> tuple[str, str, str, str]:
    """The race's end: A's and B's tokens with their first divergence outlined, target-only's, and the table
    with a sentence on where A and B first differ."""
    a, b = results[0].events, results[1].events
    div = viz.first_divergence(a, b)
    lines = _table(labels, results, contended)
    if div is None:
        lines.append(f"\n{labels[0]} and {labels[1]} emitted the same tokens.")
    else:
        lines.append(f"\nFirst divergence at position {div} (outlined): {labels[0]} emitted a **{a[div].kind}** "
                     f"token {a[div].text!r} where {labels[1]} emitted {b[div].text!r}.")
    return (viz.tokens_html(a, mark_position=div), viz.tokens_html(b, mark_position=div),
            viz.tokens_html(results[2].events), "\n".join(lines))


@dataclass
class RaceTab:
    go: gr.Button
    stop: gr.Button
    rule_a: gr.Dropdown
    rule_b: gr.Dropdown
    html: list[gr.HTML]
    summary: gr.Markdown
    plot: gr.Plot


def build() -> RaceTab:
    """The tab's components; call inside ``gr.Tabs()``. The handlers are wired by ``build_app``."""
    with gr.Tab("Race"):
        gr.Markdown("Two rules and target-only decoding on the same prompt and seed, with the same random draws: "
                    "the first token where the two rules differ is where their decisions part (for EARS against "
                    "the ordinary rule, a pardon). The parameter sliders above apply to both rules.")
        with gr.Row():
            rule_a = gr.Dropdown(rule_choices(), value=DEFAULT_RULE, label="rule A", elem_id="race_rule_a",
                                 allow_custom_value=True)
            rule_b = gr.Dropdown(rule_choices(), value=RULE_B, label="rule B", elem_id="race_rule_b",
                                 allow_custom_value=True)
        with gr.Row():
            go = gr.Button("Race", variant="primary", elem_id="race")
            stop = gr.Button("Stop", variant="stop")
        with gr.Row():
            html = [gr.HTML(viz.tokens_html([]), label=n, elem_id=f"race_{i}")
                    for i, n in enumerate(("rule A", "rule B", "target-only"))]
        summary = gr.Markdown("", elem_id="race_summary")
        plot = gr.Plot(label="throughput (decode clock)")
    return RaceTab(go, stop, rule_a, rule_b, html, summary, plot)
