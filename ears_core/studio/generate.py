"""The Generate tab: one request decoded apart from the page, drawn at a steady frame rate.

Terms
-----
request    the shared controls' values (``controls``): prompt, rule and its parameters, temperature,
           K, length, seed, and whether to measure the target-only baseline.
speed      tokens/s on the Generation's own decode clock, for the speculative run and for the
           baseline alike (``live``: each decodes in its own thread while the page redraws); beside
           it the wall clock from the moment the request arrived, and the time to first token
           (serve/summary.py: where the two clocks differ, the summary says why).
baseline   target-only decoding of the same request, measured right after the speculative run
           (its decode budget is what the speculative run left of ``Settings.timeout_s``), or
           the session's cached figure; cached only when no part of the request overlapped
           another decode (``contended``) and it was not cut by the deadline.
outputs    ``OUT``: what ``/generate`` returns, in order (the ``state`` holds the run record for
           the export and the theory tab, and the ``tree_panel`` shows or hides the tree's column:
           neither is part of the API).
tree run   with the tree box ticked each round drafts a tree (``session``: draft shape "tree");
           beside the tokens the plot draws a round's tree (``viz.tree_spec``): the latest one
           while decoding, then any round chosen with the round slider (``/tree_round``, from the
           run record's ``trees``, each with its tokens' text). The panel of plot and slider shows
           for tree runs only: a chain run hides it (as the page does before any run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import gradio as gr

from ears_core.report import viz
from ears_core.serve.pair_slot import PairSlot
from ears_core.serve.summary import export_run, run_record, summary_markdown, summary_rows

from .api import generate_params, named
from .controls import run_config
from .errors import check_request, fail, message, public_name, timeout_note
from .live import Runs, frames, plot, snapshot, steady_samples
from .pairs import LOADING

OUT = ("tokens", "message", "summary", "conf", "ratio", "tput", "hist", "details", "state",
       "theory", "theory_k", "theory_c", "tree", "tree_round", "tree_panel")


def pack(**kw: Any) -> tuple:
    """The outputs in ``OUT`` order; the ones not given stay as they are."""
    return tuple(kw.get(name, gr.skip()) for name in OUT)


def charts(events: Sequence[Any], steps: Sequence[Any], k: int, runs: dict[str, Any],
           show_beta: bool = False) -> dict[str, Any]:
    return dict(conf=plot(viz.confidence_spec(events, show_beta)), ratio=plot(viz.ratio_spec(steps)),
                hist=plot(viz.accept_length_spec(steps, k)), tput=plot(viz.throughput_spec(runs)))


def labelled(rec: Any, events: Sequence[Any], ids: Any, tokenizer: Any) -> dict[str, Any]:
    """A ``TreeRecord`` as a dict with the text of its tokens (``labels``), of the root (the last
    committed token before the round) and of the token emitted after the path."""
    def piece(t: int | None) -> str:
        return "…" if t is None else tokenizer.decode([t]) if tokenizer is not None else str(t)

    root = int(ids[0, -1]) if rec.start == 0 else events[rec.start - 1].token_id if rec.start <= len(events) else None
    return {**rec.to_dict(), "labels": [piece(t) for t in rec.tokens], "root_label": piece(root),
            "next_label": piece(rec.next_token)}


def tree_plot(tree: dict[str, Any] | None) -> Any:
    return plot(viz.tree_spec(tree)) if tree else None


def show_round(state: dict | None, i: Any) -> Any:
    """``/tree_round``: the tree of round ``i`` of the last run (nothing for a chain run)."""
    trees = (state or {}).get("trees") or []
    return tree_plot(trees[min(max(int(i or 0), 0), len(trees) - 1)]) if trees else None


def outcome(res: Any, cfg: Any, prompt: str, session: Any, base_tps: float | None,
            contended: bool, trees: Sequence[dict[str, Any]] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, details) of a finished run: the run record (plus the theory tab's measured point)
    and the raw metrics the page shows. ``trees``: a tree run's rounds (``labelled``)."""
    record = run_record(res, cfg, prompt=prompt, model=public_name(session.pair.name), device=session.device_label,
                        baseline_tps=base_tps, contended=contended)
    record["trees"] = list(trees)
    st = res.stats
    chain = cfg.draft_shape == "chain"  # the theory tab's E(a, K) is a chain's
    measured = None if st.acceptance_rate is None or not chain else (st.acceptance_rate, st.mean_accept_length,
                                                                      record["speedup"])
    details = {k: record[k] for k in ("stats", "baseline_tokens_per_s", "speedup", "contended", "timed_out", "stop",
                                          "text")}
    details.update({k: record["settings"][k] for k in ("model", "device", "rule", "draft_shape")},
                   kinds=[e.kind for e in res.events])
    return {**record, "measured": measured}, details


def profile_note(session: Any, cfg: Any) -> str:
    """Which machine profile the draft-length policy used (its price curve), for the summary."""
    if cfg.draft_length != "policy":
        return ""
    return f"\n\n*this machine's profile: {session.profile_text()}*"


def theory_outputs(stats: Any, k: int, measured: Any) -> dict[str, Any]:
    """The theory tab at the run's K and measured cost ratio (left as it is when no draft was made,
    and after a tree run: the tab's theory is a chain's)."""
    if stats.cost_ratio is None or measured is None:
        return {}
    return dict(theory=viz.theory_figure(k, stats.cost_ratio, measured), theory_k=k,
                theory_c=round(min(stats.cost_ratio, 1.0), 3))


LOAD_WAIT = "waiting for the model pair to load"  # a Generation.waits label
CHART_EVERY = 3  # frames between chart redraws while decoding


def make_generate(slot: PairSlot, names: Sequence[str]) -> Callable:
    """The ``/generate`` callback; ``names`` are the parameter sliders' names (beta first), its
    parameters ``api.generate_params(names)``."""

    def generate(a: dict[str, Any]):
        """Decode one request; any failure, even mid-run, becomes a short message."""
        runs = Runs()
        given = [n for n in names if a[n] is not None]  # a parameter left out takes the rule's default
        try:
            yield from _generate(slot, runs, a, given)
        except Exception as exc:
            yield pack(message=fail(exc))
        finally:  # Stop, a closed page or an error: no decode outlives its request
            runs.stop_all()

    return named(generate, generate_params(names))


def _generate(slot: PairSlot, runs: Runs, a: dict[str, Any], given: list[str]):
    """One request (module terms): checked, decoded while drawn, its baseline, then the summary."""
    settings, since = slot.settings, time.perf_counter()  # the request's wall clock starts here
    try:
        req = check_request(a["prompt"], a["temperature"], a["k"], a["max_new"], a["seed"],
                            max_new_tokens=settings.max_new_tokens, max_prompt_chars=settings.max_prompt_chars)
        cfg = run_config(a["rule_name"], req, given, [a[n] for n in given], a["draft_length"], a["shape"],
                         a["tree_budget"])
        loading = slot.loaded is None
        if loading:  # the pair is still loading (a server's start, a switch): wait for it
            yield pack(message="", summary=f"*{LOADING}*")
        session = slot.session()
        limit_s = slot.decode_budget_s()  # after the session: a ZeroGPU worker's start-up counts against it
        waits = {LOAD_WAIT: time.perf_counter() - since} if loading else {}
        cfg = session.resolved(cfg)  # "auto" -> tree or chain, so the page names what ran
        ids = session.encode(req.prompt)
    except Exception as exc:  # bad input, model load failure: show it, keep serving
        yield pack(message=fail(exc))
        return
    shape = cfg.draft_shape
    yield pack(tokens=viz.tokens_html([], cursor=True), message="", summary="*generating…*", tree=None,
               tree_panel=gr.Column(visible=shape == "tree"))
    res, run, rounds, tree_out = yield from _decode(runs, session, ids, cfg, limit_s, since, waits)
    note = message(timeout_note(limit_s)) if res.timed_out else ""
    contended, curves = run.contended, {run.gen.method: list(run.gen.samples)}
    budget = cfg.rule == "ears-budget"  # the beta in force changes per round: draw it
    yield pack(tokens=viz.tokens_html(res.events), **charts(res.events, res.steps, cfg.k, curves, budget),
               summary=summary_markdown(summary_rows(res.stats, contended=contended, shape=shape, stop=res.stop)),
               **tree_out)
    base_tps, base_wall, base_note = None, None, ""
    if a["with_baseline"] and not res.timed_out:
        base_tps, base_wall, base_note, contended, cut = yield from _baseline(runs, session, ids, cfg, res, curves,
                                                                              contended, limit_s)
        if cut:
            note = message(timeout_note(limit_s) + " (during the target-only baseline)")
    state, details = outcome(res, cfg, req.prompt, session, base_tps, contended, rounds)
    rows = summary_rows(res.stats, base_tps, contended=contended, baseline_note=base_note, shape=shape,
                        baseline_wall_tps=base_wall, stop=res.stop)
    drawn = f"; a tree of depth {cfg.k}, {cfg.tree_budget} nodes" if shape == "tree" else ""
    yield pack(tokens=viz.tokens_html(res.events), message=note, tput=plot(viz.throughput_spec(curves)),
               summary=summary_markdown(rows) + f"\n\n*model: {details['model']} on {details['device']}; "
               f"draft length: {cfg.draft_length}{drawn}*" + profile_note(session, cfg),
               details=details, state=state, **theory_outputs(res.stats, cfg.k, state["measured"]), **tree_out)


def _decode(runs: Runs, session: Any, ids: Any, cfg: Any, timeout_s: float, since: float, waits: dict[str, float]):
    """The speculative run, drawn while it decodes: the tokens every frame, the charts (heavy to build and
    send) and a tree run's latest tree every ``CHART_EVERY`` frames. Its wall clock starts at ``since``
    (the request's arrival); ``waits``: what held the request before it, labelled.
    Returns (its result, the run, its rounds' trees (``labelled``), the tree outputs of the page)."""
    tracked = session.speculative(ids, cfg, deadline_s=timeout_s, since=since)
    tracked.gen.waits.update(waits)
    run = runs.start(tracked)
    label = run.gen.method
    budget = cfg.rule == "ears-budget"  # the beta in force changes per round: draw it
    trees = getattr(run.gen, "trees", None)  # a tree run's rounds (grows while it decodes)
    tok = session.pair.tokenizer
    for i, _ in enumerate(frames(run)):
        events, steps, samples = snapshot(run)
        figs = (charts(events, steps, cfg.k, {label: samples}, budget) if i % CHART_EVERY == CHART_EVERY - 1
                else {})
        if figs and trees:
            figs["tree"] = tree_plot(labelled(trees[-1], events, ids, tok))
        yield pack(tokens=viz.tokens_html(events, cursor=True), **figs)
    res = run.result()
    rounds = [labelled(t, res.events, ids, tok) for t in trees or []]
    last = len(rounds) - 1  # the slider then picks any round (``show_round``)
    tree_out = dict(tree=tree_plot(rounds[-1]), tree_round=gr.Slider(maximum=max(last, 1), value=last)
                    ) if rounds else dict(tree=None)
    return res, run, rounds, tree_out


def _baseline(runs: Runs, session: Any, ids: Any, cfg: Any, res: Any, curves: dict[str, Any], contended: bool,
              timeout_s: float):
    """The request's target-only figure: the session's cached one, else measured now in what the
    speculative run left of the time limit (drawn while it decodes; ``curves`` gains its samples) and
    cached when clean. Returns (tokens/s, tokens/s on the wall clock, the summary's note on it, contended,
    cut by the time limit)."""
    cached = session.cached_baseline(ids, cfg)
    if cached is not None:
        curves["target-only (cached)"] = steady_samples(cached)
        return cached.tokens_per_s, cached.wall_tokens_per_s, " (cached)", contended, False
    base = runs.start(session.baseline(ids, cfg, deadline_s=max(timeout_s - res.stats.decode_s, 0.0)))
    waiting = summary_markdown(summary_rows(res.stats, contended=contended, shape=cfg.draft_shape, stop=res.stop)) + \
        "\n\n*measuring target-only…*"
    for _ in frames(base):
        yield pack(tput=plot(viz.throughput_spec({**curves, "target-only": snapshot(base)[2]})), summary=waiting)
    bres = base.result()
    contended = contended or base.contended
    curves["target-only"] = list(base.gen.samples)
    tps, wall = bres.stats.tokens_per_s, bres.stats.wall_tokens_per_s
    if bres.timed_out:  # a partial baseline still measures tokens/s, but is not cached
        return tps, wall, " (cut by the time limit; not cached)", contended, True
    if contended:
        return tps, wall, " (contended; not cached)", contended, False
    session.remember_baseline(ids, cfg, base)
    return tps, wall, "", contended, False


def export(state: dict | None) -> tuple[Any, Any, str]:
    """``/export``: the last run as CSV (one row per token) and JSON, in a fresh temporary folder."""
    if not state or not state.get("events"):
        return None, None, message("Nothing to export yet: generate first.")
    run = {k: v for k, v in state.items() if k != "measured"}
    csv_path, json_path = export_run(run)
    return csv_path, json_path, ""


@dataclass
class GenerateTab:
    go: gr.Button
    stop: gr.Button
    message: gr.Markdown
    tokens: gr.HTML
    tree: gr.Plot
    tree_round: gr.Slider
    tree_panel: gr.Column
    conf: gr.Plot
    ratio: gr.Plot
    tput: gr.Plot
    hist: gr.Plot
    summary: gr.Markdown
    export: gr.Button
    csv_file: gr.File
    json_file: gr.File
    details: gr.JSON


def build() -> GenerateTab:
    """The tab's components; call inside ``gr.Tabs()``. The handlers are wired by ``build_app``."""
    with gr.Tab("Generate"):
        with gr.Row():
            go = gr.Button("Generate", variant="primary", elem_id="generate")
            stop = gr.Button("Stop", variant="stop", elem_id="stop")
        msg = gr.Markdown("", elem_id="message")
        gr.HTML(viz.legend_html())
        with gr.Row():
            with gr.Column(scale=3):
                tokens = gr.HTML(viz.tokens_html([]), elem_id="tokens")
            with gr.Column(scale=2, visible=False, elem_id="tree_panel") as tree_panel:
                tree = gr.Plot(label="a round's tree (tree runs)", elem_id="tree_plot")
                tree_round = gr.Slider(0, 1, value=0, step=1, label="round", elem_id="tree_round")
        with gr.Row():
            conf = gr.Plot(label="max P and tolerance", elem_id="conf_plot")
            ratio = gr.Plot(label="ratio vs U", elem_id="ratio_plot")
        with gr.Row():
            tput = gr.Plot(label="throughput (decode clock)", elem_id="tput_plot")
            hist = gr.Plot(label="accepted per round", elem_id="hist_plot")
        summary = gr.Markdown("", elem_id="summary")
        with gr.Accordion("Export and raw metrics", open=False):
            export_btn = gr.Button("Export events (CSV + JSON)", elem_id="export")
            with gr.Row():
                csv_file, json_file = gr.File(label="CSV"), gr.File(label="JSON")
            details = gr.JSON(label="metrics of the last run", elem_id="details")
    return GenerateTab(go, stop, msg, tokens, tree, tree_round, tree_panel, conf, ratio, tput, hist, summary, export_btn, csv_file,
                       json_file, details)
