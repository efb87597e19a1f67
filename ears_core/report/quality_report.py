"""The quality section's files and table: quality.json, quality_runs.csv, quality.html (and quality.png).

Terms are those of ``quality.section`` and ``quality.summary``. ``quality.json`` is the file the docs
and the app's Quality tab read (copy it to ``docs/results/bench_<machine>_quality.json``); ``quality_runs.csv``
holds every run's reply and the answer read from it, to check the scorer by eye.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Sequence

import plotly.graph_objects as go

from ears_core.quality.runs import Record
from ears_core.report.quality_figure import frontier_spec

__all__ = ["write_quality", "format_quality", "quality_figure", "FILES"]

FILES = ("quality.json", "quality_runs.csv", "quality.html")


def quality_figure(summary: dict[str, Any]) -> go.Figure:
    return go.Figure(frontier_spec(summary["rows"], summary.get("paper")))


def write_quality(out: Path, summary: dict[str, Any], records: Sequence[Record], images: bool = False) -> list[Path]:
    """Write the section's files into ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FILES]
    paths[0].write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    with open(paths[1], "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in fields(Record)])
        w.writeheader()
        for r in records:
            w.writerow(asdict(r))
    fig = quality_figure(summary)
    table = format_quality(summary).replace("&", "&amp;").replace("<", "&lt;")
    paths[2].write_text("<!doctype html><html><head><meta charset='utf-8'><title>EARS quality</title></head><body>"
                        + fig.to_html(full_html=False, include_plotlyjs="inline", div_id="quality")
                        + f"<pre>{table}</pre></body></html>", encoding="utf-8")
    if images:
        from ears_core.report.bench_report import write_pngs

        write_pngs({"quality": fig}, out)
        paths.append(out / "quality.png")
    return paths


def _cell(v: Any, fmt: str) -> str:
    return "" if v is None else fmt.format(v)


def _ci(row: dict[str, Any], key: str, fmt: str = "{:.3f}") -> str:
    v, ci = row.get(key), row.get(f"{key}_ci") or [None, None]
    if v is None:
        return ""
    return fmt.format(v) + ("" if None in ci else f" [{fmt.format(ci[0])}, {fmt.format(ci[1])}]")


def format_quality(summary: dict[str, Any]) -> str:
    """A fixed-width table: one line per setting, then the checks."""
    head = ["setting", "accuracy [95 %]", "vs target-only [95 %]", "vs ordinary [95 %]", "speedup", "accept", "pardon",
            "distortion"]
    body = [[r["setting"], _ci(r, "accuracy"), _ci(r, "delta", "{:+.3f}"), _ci(r, "delta_ordinary", "{:+.3f}"),
             _cell(r.get("speedup"), "{:.2f}x"),
             _cell(r.get("acceptance"), "{:.3f}"), _cell(r.get("pardon_rate"), "{:.3f}"),
             _cell(r.get("distortion"), "{:.4f}")] for r in summary["rows"]]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             for line in [head, *body]]
    d, q = summary["decoding"], summary["questions"]
    lines.insert(0, f"[quality] {q['count']} questions x {summary['seeds']} seeds, T = {d['temperature']:g}, "
                    f"K = {d['k']}, {d['max_new_tokens']} new tokens; left out: {', '.join(q['left_out']) or 'none'}")
    if summary.get("greedy"):
        lines.append(f"greedy target-only (T = 0) on the same questions: {summary['greedy']['accuracy']:.3f}")
    ref = summary.get("reference")
    if ref:
        greedy = f"greedy {ref['greedy']['accuracy']:.3f}, " if ref.get("greedy") else ""
        lines.append(f"{ref['target']} on the same questions and seeds: {greedy}target-only "
                     f"{ref['target_only']['accuracy']:.3f}")
    lines.append(f"ordinary inside target-only's interval: {summary.get('ordinary_inside_target')}; first EARS beta "
                 f"outside the ordinary rule's interval: {summary.get('first_beta_outside_ordinary')}")
    return "\n".join(lines)
