"""A finished run for people and files: the summary table and the run record.

Terms
-----
summary     ``summary_rows()``: the one list of (metric, value) the app renders as a table
            (``summary_markdown``) and the CLI prints as text (``summary_text``).
record      ``run_record()``: one run as plain data (settings, metrics, baseline, events, rounds):
            what the app shows as raw metrics and ``export_run()`` writes as CSV and JSON.
clocks      speeds and speedups are on the decode clock (time inside the decoder); beside them the
            rows give the wall clock a user waits and the time to first token. Where the wall clock
            reads more than ``CLOCKS_DIFFER`` above the decode clock, ``clock_note`` says where the
            difference went (metrics.clock_parts: e.g. a price curve measured on the request's path).
"""
from __future__ import annotations

import csv
import json
import os
import tempfile
from dataclasses import asdict
from typing import Any, Sequence

from ears_core.metrics import GenerationStats, clock_parts
from ears_core.serve.session import RunConfig

__all__ = ["summary_rows", "summary_markdown", "summary_text", "run_record", "export_run", "clock_rows", "clock_note",
           "CLOCKS_DIFFER"]

CLOCKS_DIFFER = 0.05  # the wall clock this far above the decode clock: the summary says why


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def summary_rows(stats: GenerationStats, baseline_tps: float | None = None, *, contended: bool = False,
                 baseline_note: str = "", shape: str = "chain", baseline_wall_tps: float | None = None,
                 stop: str = "length") -> list[tuple[str, str]]:
    """(metric, value) rows: rates, lengths, distortion, speed, speedup measured vs theory, and the
    clocks (``clock_rows``). ``shape``: the run's draft shape; a tree's rows say so and give its mean
    nodes per round. ``baseline_wall_tps``: target-only tokens/s on the wall clock. ``stop``: why the run
    ended (``GenerationResult.stop``)."""
    speedup = stats.tokens_per_s / baseline_tps if baseline_tps else None
    label = " (contended: another decode or job held the cores meanwhile)" if contended else ""
    tree, rounds = shape == "tree", max(stats.steps, 1)
    what = "nodes" if tree else "drafts"
    rows = [
        ("rule", stats.method),
        ("draft shape", f"tree: {stats.drafted / rounds:.2f} nodes per round (mean), the accepted path verified in "
         "one pass" if tree else f"chain: {stats.drafted / rounds:.2f} drafts per round (mean)"),
        ("tokens / rounds", f"{stats.new_tokens} / {stats.steps}"
         + (" (ended at the end-of-sequence token)" if stop == "eos" else "")),
        ("acceptance rate", f"{_fmt(stats.acceptance_rate)} ({stats.accepted} of {stats.drafted} {what} stood)"),
        ("mean accepted per round", f"{stats.accepted / rounds:.2f} drafted tokens stood per round"),
        ("mean acceptance length", f"{stats.mean_accept_length:.2f} tokens per round"),
        ("pardon rate", f"{_fmt(stats.pardon_rate)} ({stats.pardoned} pardoned)"),
        ("mean exact distortion (TV)", f"{stats.mean_distortion:.4f} per token"),
        ("throughput", f"{stats.tokens_per_s:.1f} tokens/s on the decode clock{label}"),
        ("target-only", "not measured" if not baseline_tps else f"{baseline_tps:.1f} tokens/s{baseline_note}"),
        ("speedup, measured", "–" if speedup is None else f"{speedup:.2f}×{label}"),
        ("speedup, theory S = E/(kc+1)", "– (a chain's formula; this run drafted a tree)" if tree else
         "–" if stats.theory_speedup is None else
         f"{stats.theory_speedup:.2f}× (E = {stats.theory_tokens_per_step:.2f}, c = {stats.cost_ratio:.3f})"),
    ]
    return rows + clock_rows(stats, baseline_wall_tps)


def clock_rows(stats: GenerationStats, baseline_wall_tps: float | None = None) -> list[tuple[str, str]]:
    """The wall clock beside the decode clock: time to first token, the whole run, the speedup on the
    wall clock (given target-only's), and where they differ by more than ``CLOCKS_DIFFER``, why."""
    if stats.wall_s is None:
        return []
    rows = []
    if stats.ttft_s is not None and stats.first_token_decode_s is not None:
        rows.append(("time to first token", f"{stats.ttft_s:.2f} s on the wall clock ({stats.first_token_decode_s:.2f} s "
                     "of it decoding: the prefill and the first round)"))
    wall_tps = stats.wall_tokens_per_s
    rows.append(("wall clock", f"{stats.wall_s:.2f} s, {_fmt(wall_tps, '.1f')} tokens/s (decode clock: "
                 f"{stats.decode_s:.2f} s, {stats.tokens_per_s:.1f} tokens/s)"))
    if baseline_wall_tps and wall_tps:
        rows.append(("speedup, wall clock", f"{wall_tps / baseline_wall_tps:.2f}× (target-only: "
                     f"{baseline_wall_tps:.1f} tokens/s on the wall clock)"))
    note = clock_note(stats)
    if note:
        rows.append(("wall vs decode clock", note))
    return rows


def clock_note(stats: GenerationStats) -> str:
    """Why the wall clock reads more than ``CLOCKS_DIFFER`` above the decode clock ("" where it does not)."""
    if stats.wall_s is None or stats.wall_s - stats.decode_s <= CLOCKS_DIFFER * stats.decode_s:
        return ""
    parts = [f"{label}: {sec:.2f} s" for label, sec in clock_parts(stats) if sec >= 0.0005]
    more = (stats.wall_s - stats.decode_s) / stats.decode_s * 100 if stats.decode_s > 0 else float("inf")
    return f"the wall clock reads {more:.0f} % more; " + "; ".join(parts)


def summary_markdown(rows: Sequence[tuple[str, str]]) -> str:
    return "| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def summary_text(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run_record(result: Any, cfg: RunConfig, *, prompt: str, model: str, device: str,
               baseline_tps: float | None = None, contended: bool = False, trees: Sequence[Any] = ()
               ) -> dict[str, Any]:
    """One finished (or timed-out) run as plain data: ``result`` is a ``GenerationResult``;
    ``trees`` a tree run's ``TreeRecord`` per round."""
    stats = result.stats
    rule, temperature = cfg.rule_and_temperature()
    settings = {"prompt": prompt, "rule": rule.describe(), **cfg.params, "temperature": temperature,
                "K": cfg.k, "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "top_k": cfg.top_k,
                "top_p": cfg.top_p, "draft_length": cfg.draft_length, "draft_shape": cfg.draft_shape,
                "model": model, "device": device}
    if cfg.draft_shape == "tree":
        settings.update(tree_budget=cfg.tree_budget, tree_width=cfg.tree_width)
    return {"settings": settings, "stats": stats.to_dict(), "baseline_tokens_per_s": baseline_tps,
            "speedup": stats.tokens_per_s / baseline_tps if baseline_tps else None,
            "contended": contended, "timed_out": result.timed_out, "stop": result.stop, "text": result.text,
            "events": [e.to_dict() for e in result.events], "steps": [s.to_dict() for s in result.steps],
            "trees": [t.to_dict() for t in trees]}


def export_run(run: dict[str, Any], folder: str | os.PathLike | None = None) -> tuple[str, str]:
    """Write a run (``{"events": [TokenEvent dicts], ...}``) as CSV (one row per token) and JSON
    (everything) into ``folder`` (a new temporary folder by default); return both paths."""
    folder = str(folder) if folder is not None else tempfile.mkdtemp(prefix="ears_run_")
    csv_path, json_path = os.path.join(folder, "ears_events.csv"), os.path.join(folder, "ears_run.json")
    events = run.get("events") or []
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(events[0].keys()) if events else ["position"])
        writer.writeheader()
        writer.writerows(events)
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(run, f, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
    return csv_path, json_path
