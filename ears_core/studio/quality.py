"""The Quality tab: what EARS costs in right answers, beside its speed.

Terms
-----
shipped    the bench's quality section as run for the docs: the last (by name) ``bench_*quality*.json``
           in ``docs/results/`` that holds the section (``SHIPPED``):
           accuracy against speedup for every rule over its knob, distortion as colour, the EARS
           paper's point for reference (``report.quality_figure``). Absent: the tab says how to make it.
live sweep target-only, the ordinary rule and EARS at one or two betas on up to ``MAX_QUESTIONS``
           questions (one seed, T = ``TEMPERATURE``) on the pair in memory, drawn over the shipped
           figure as they finish (open markers). A progress bar counts the runs.
limits     the sweep shares the server's ``Settings.timeout_s`` seconds of decoding (a run that reaches
           it ends the sweep, keeping the runs so far); each answer is at most ``MAX_NEW`` tokens (and
           within ``Settings.max_new_tokens``); at most ``MAX_QUESTIONS`` questions and ``MAX_BETAS`` betas.
           It runs in the decode queue group, so it never times another request's decode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import gradio as gr
import plotly.graph_objects as go

from ears_core.quality.questions import load_questions
from ears_core.quality.runs import Decoding, Setting, sweep
from ears_core.quality.summary import PAPER, pool
from ears_core.report.quality_figure import frontier_spec
from ears_core.rules import BETA
from ears_core.serve.pair_slot import PairSlot

from .errors import InputError, fail, message
from .live import plot
from .pairs import LOADING

SHIPPED = Path(__file__).resolve().parents[2] / "docs" / "results"  # a file, or a folder to search (module terms)
PATTERN = "bench_*quality*.json"
MAX_QUESTIONS, MAX_BETAS, MAX_NEW, TEMPERATURE, K = 20, 2, 16, 0.9, 4
BETAS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
ABSENT = ("No shipped quality results yet: `python -m ears_core.bench --sections quality` writes quality.json; "
          f"copy it into docs/results/ as {PATTERN.replace('*quality*', '<machine>_quality')}. The live sweep below "
          "works without it.")


def load_shipped(path: Path | None = None) -> dict[str, Any] | None:
    """The shipped quality summary from ``path`` (a file, or a folder: its last ``PATTERN`` file that
    holds the section), or None when there is none or it is unreadable."""
    path = Path(path or SHIPPED)
    for file in (sorted(path.glob(PATTERN), reverse=True) if path.is_dir() else [path]):
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("section") == "quality" and data.get("rows"):
            return data
    return None


def shipped_note(summary: dict[str, Any] | None) -> str:
    """The line above the figure: where the shipped figures come from, or how to make them."""
    if summary is None:
        return f"*{ABSENT}*"
    q, d = summary["questions"], summary["decoding"]
    beta = summary.get("first_beta_outside_ordinary")
    return (f"Shipped: **{summary.get('target', '?')}** with draft {summary.get('draft', '?')}, {q['count']} questions "
            f"x {summary['seeds']} seeds at T = {d['temperature']:g}, {d['max_new_tokens']} new tokens; categories left "
            f"out (the target fails them at T = 0): {', '.join(q['left_out']) or 'none'}. First EARS beta whose "
            f"accuracy leaves the ordinary rule's interval: **{'none' if beta is None else f'{beta:g}'}**.")


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of pooled rows (``quality.summary.pool``)."""
    lines = ["| setting | accuracy [95 %] | speedup | acceptance | pardons | distortion |", "|---|---|---|---|---|---|"]
    for r in rows:
        ci = r.get("accuracy_ci") or [None, None]
        acc = "" if r.get("accuracy") is None else f"{r['accuracy']:.2f}" + (
            "" if None in ci else f" [{ci[0]:.2f}, {ci[1]:.2f}]")
        cells = [r["setting"], acc] + ["" if r.get(k) is None else f.format(r[k]) for k, f in
                                       (("speedup", "{:.2f}×"), ("acceptance", "{:.3f}"), ("pardon_rate", "{:.3f}"),
                                        ("distortion", "{:.4f}"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def progress_html(done: int, total: int, note: str = "") -> str:
    pct = 0 if total == 0 else round(100 * done / total)
    return (f"<div id='quality_bar' style='background:#e5e7eb;border-radius:4px;height:12px'>"
            f"<div style='width:{pct}%;background:#e6007e;height:12px;border-radius:4px'></div></div>"
            f"<p>{done} / {total} runs {note}</p>")


def _check(n_questions: Any, betas: Any) -> tuple[int, list[float]]:
    try:
        n = int(n_questions)
    except (TypeError, ValueError):
        raise InputError(f"questions must be a whole number, got {n_questions!r}.") from None
    if not 1 <= n <= MAX_QUESTIONS:
        raise InputError(f"questions must be between 1 and {MAX_QUESTIONS}, got {n}.")
    chosen = sorted({float(b) for b in (betas or [])})
    if not 1 <= len(chosen) <= MAX_BETAS or any(not BETA.low < b <= BETA.high for b in chosen):
        raise InputError(f"pick one or two betas between {BETA.low:g} and {BETA.high:g} (0 is the ordinary rule, "
                         "which always runs).")
    return n, chosen


def make_sweep(slot: PairSlot, shipped: dict[str, Any] | None) -> Callable[..., Iterator[Any]]:
    """The ``/quality_sweep`` callback: yields (progress HTML, figure, live table) as runs finish."""
    base = shipped["rows"] if shipped else []

    def quality_sweep(questions: int = 12, betas: Sequence[float] = (0.3,)) -> Iterator[Any]:
        """A live sweep (module terms) on the pair in memory."""
        try:
            yield from _sweep(questions, betas)
        except Exception as exc:  # any failure, even mid-run, becomes a short message
            yield fail(exc), gr.skip(), gr.skip()

    def _sweep(n_questions: Any, betas: Any) -> Iterator[Any]:
        n, chosen = _check(n_questions, betas)
        if slot.loaded is None:
            yield f"*{LOADING}*", gr.skip(), gr.skip()
        session, qset = slot.session(), load_questions()
        questions = qset.select(n)
        settings = [Setting("target"), Setting("standard"), *(Setting("ears", (("beta", b),), "beta") for b in chosen)]
        decoding = Decoding(TEMPERATURE, K, min(MAX_NEW, slot.settings.max_new_tokens))
        total, records, budget = len(questions) * len(settings), [], slot.decode_budget_s()
        yield progress_html(0, total, "(starting)"), gr.skip(), ""
        t0 = time.perf_counter()
        for rec in sweep(session, qset, questions, settings, decoding, budget_s=budget, background=True):
            records.append(rec)
            rows = pool(settings, records)
            spec = frontier_spec(base, PAPER, live=rows)
            if rec.timed_out:
                yield message(f"Stopped after {budget:g} s: this server allows {budget:g} s of decoding per request "
                              f"({len(records)} of {total} runs done). Pick fewer questions or one beta, or run the "
                              "app yourself."), plot(spec), table(rows)
                return
            left = (time.perf_counter() - t0) / len(records) * (total - len(records))
            note = f"— done in {time.perf_counter() - t0:.0f} s" if len(records) == total else f"(~{left:.0f} s left)"
            yield progress_html(len(records), total, note), plot(spec), table(rows)

    return quality_sweep


@dataclass
class QualityTab:
    go: gr.Button
    stop: gr.Button
    questions: gr.Slider
    betas: gr.CheckboxGroup
    progress: gr.HTML
    plot: gr.Plot
    live: gr.Markdown
    shipped: dict[str, Any] | None


def build(path: Path | None = None) -> QualityTab:
    """The tab's components; call inside ``gr.Tabs()``. The handler is wired by ``build_app`` (``wire``)."""
    shipped = load_shipped(path)
    spec = frontier_spec(shipped["rows"] if shipped else [], PAPER if shipped else None,
                         title=None if shipped else "No shipped results: run a live sweep")
    with gr.Tab("Quality"):
        gr.Markdown("Does EARS make the answers worse? Short questions with known answers (capitals, arithmetic, "
                    "units, opposites, facts, ...), each method on the same questions and seeds at T = 0.9: "
                    "**accuracy** (a 95 % bootstrap interval over questions) against **speedup** over target-only, "
                    "each rule a curve over its knob, the colour its exact **distortion** (TV distance per token). "
                    "The grey band is target-only's interval; the × is the EARS paper's trade (+18 % speed, "
                    "−0.84 % GSM8K accuracy) placed relative to the ordinary rule.")
        gr.Markdown(shipped_note(shipped), elem_id="quality_shipped")
        fig = gr.Plot(go.Figure(spec), label="accuracy against speedup", elem_id="quality_plot")
        if shipped:
            gr.Markdown(table(shipped["rows"]), elem_id="quality_table")
        gr.Markdown(f"**Live sweep on this machine**: target-only, the ordinary rule and EARS at the betas you pick, "
                    f"one seed, at most {MAX_QUESTIONS} questions, drawn over the figure "
                    "with open markers. Intervals from so few questions are wide: read the trend, not the digits.")
        with gr.Row():
            questions = gr.Slider(1, MAX_QUESTIONS, value=12, step=1, label="questions", elem_id="quality_questions")
            betas = gr.CheckboxGroup(list(BETAS), value=[0.3], label=f"EARS beta (at most {MAX_BETAS})",
                                     elem_id="quality_betas")
        with gr.Row():
            go_btn = gr.Button("Run live sweep", variant="primary", elem_id="quality_run")
            stop = gr.Button("Stop", variant="stop")
        progress = gr.HTML(progress_html(0, 0, "(not started)"), elem_id="quality_progress")
        live = gr.Markdown("", elem_id="quality_live")
    return QualityTab(go_btn, stop, questions, betas, progress, fig, live, shipped)


def wire(tab: QualityTab, slot: PairSlot, gpu_call: Callable[[Callable, str], Callable] | None = None,
         **decode: Any) -> None:
    """Connect the Run and Stop buttons; ``decode``: the decode queue group's keyword arguments;
    ``gpu_call``: ``build_app``'s (the sweep decodes)."""
    handler = make_sweep(slot, tab.shipped)
    event = tab.go.click(gpu_call(handler, "quality_sweep") if gpu_call else handler, [tab.questions, tab.betas],
                         [tab.progress, tab.plot, tab.live], api_name="quality_sweep", **decode)
    tab.stop.click(None, cancels=[event])
