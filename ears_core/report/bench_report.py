"""The benchmark's aggregation and outputs: pooled rows per section and config, runs.csv,
summary.json, a self-contained plotly report.html (and PNGs), and the text table.

Terms are those of ``bench``. Pooling is over runs, never a mean of per-run ratios: tokens/s is
total tokens / total seconds, the acceptance rate is total drafts that stood / total drafted, the
distortion is total exact TV / total tokens. A confidence interval is Wilson's at 95 %.
tokens/s and "vs target" are on the decode clock (``decode_s``); "tok/s wall" and "vs target wall" on
each run's wall clock (``wall_s``), TTFT the mean time to first token. A config whose wall clock reads
more than ``CLOCKS_DIFFER`` above its decode clock gets a ``clock_note`` saying where the time went.
(Runs written before the two clocks were kept apart have ``wall_s`` only, and it was the decode clock.)
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from scipy.stats import binomtest

from ears_core.report.bench_plan import Config, Job, final_answer
from ears_core.metrics import round_theory

__all__ = ["pool", "write_all", "reaggregate", "format_table", "wilson", "tree_section_figure", "k_of"]

RUN_FIELDS = ["method", "label", "temperature", "k", "beta", "params", "draft_length", "draft_shape", "tree_budget",
              "sections", "prompt_id", "task", "seed",
              "max_new_tokens", "new_tokens", "wall_s", "decode_s", "ttft_s", "setup_s", "tokens_per_s", "steps", "drafted", "accepted", "pardoned",
              "draft_ms", "target_ms", "total_distortion", "logprob", "expected", "answer", "correct", "text"]


def k_of(row: dict[str, Any]) -> int:
    """A row's K (drafts per round at most), from a row written now ("k") or before the rename ("gamma")."""
    return int(row["k"] if "k" in row else row["gamma"])


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return (ci.low, ci.high)


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


CLOCKS_DIFFER = 0.05  # the wall clock this far above the decode clock: the pooled row says why


def _decode_s(r: dict[str, Any]) -> float:
    return r["decode_s"] if r.get("decode_s") is not None else r["wall_s"]


def _clocks(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled wall-clock fields: seconds, tokens/s, mean time to first token, and the note (module doc)."""
    wall, dec = sum(r["wall_s"] for r in rs), sum(_decode_s(r) for r in rs)
    ttft = [r["ttft_s"] for r in rs if r.get("ttft_s") is not None]
    setup = sum(r.get("setup_s") or 0.0 for r in rs)
    note = None
    if dec > 0 and wall - dec > CLOCKS_DIFFER * dec:
        note = (f"wall clock {(wall - dec) / dec * 100:.0f} % above the decode clock: {setup:.2f} s setting runs up "
                f"before their first decode step (the policy, the drafter), {max(wall - dec - setup, 0.0):.2f} s "
                "between tokens outside the decoder")
    return dict(wall_seconds=_r(wall, 2), wall_tokens_per_s=_r(sum(r["new_tokens"] for r in rs) / wall, 2) if wall > 0
                else None, ttft_s=_r(sum(ttft) / len(ttft), 3) if ttft else None, clock_note=note)


def pool(jobs: list[Any], rows: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
    """One pooled row per config over the given jobs, with ratios to target-only at the same T."""
    groups: dict[Any, list[Any]] = defaultdict(list)
    for j in jobs:
        groups[j.config].append(j)
    base = {c.temperature: c for c in groups if c.method == "target"}
    target_answer = {(j.prompt_id, j.seed): rows[j]["answer"] for j in jobs if j.config.method == "target"}
    out = []
    for cfg, js in groups.items():
        rs = [rows[j] for j in js]
        tot = {k: sum(r[k] for r in rs) for k in ("new_tokens", "steps", "drafted", "accepted", "pardoned",
                                                  "draft_ms", "target_ms", "total_distortion")}
        tot["decode_s"] = sum(_decode_s(r) for r in rs)
        tps = tot["new_tokens"] / tot["decode_s"] if tot["decode_s"] > 0 else math.nan
        row: dict[str, Any] = dict(config=cfg.key, method=cfg.method, label=cfg.label, temperature=cfg.temperature,
                                   k=cfg.k, beta=cfg.beta, draft=cfg.draft, shape=cfg.shape,
                                   runs=len(rs), tokens=tot["new_tokens"],
                                   seconds=_r(tot["decode_s"], 2), tokens_per_s=_r(tps, 2), **_clocks(rs))
        b = base.get(cfg.temperature)
        if b is not None:
            bt = sum(rows[j]["new_tokens"] for j in groups[b]) / max(1e-9, sum(_decode_s(rows[j]) for j in groups[b]))
            row["ratio"] = _r(tps / bt, 3)
            bw = _clocks([rows[j] for j in groups[b]])["wall_tokens_per_s"]
            row["wall_ratio"] = _r(row["wall_tokens_per_s"] / bw, 3) if bw and row["wall_tokens_per_s"] else None
            t_step = sum(rows[j]["target_ms"] for j in groups[b]) / max(1, sum(rows[j]["steps"] for j in groups[b]))
        else:
            row["ratio"], row["wall_ratio"], t_step = None, None, None
        lps = [r["logprob"] for r in rs if not math.isnan(r["logprob"])]
        row["logprob"] = _r(sum(lps) / len(lps)) if lps else None
        if tot["drafted"]:
            a = tot["accepted"] / tot["drafted"]
            k_eff, c, e, theory_s = round_theory(tot["accepted"], tot["drafted"], tot["steps"], tot["draft_ms"],
                                                 tot["target_ms"])
            t_round_draft, t_verify = tot["draft_ms"] / tot["steps"], tot["target_ms"] / tot["steps"]
            row.update(acceptance=_r(a), drafts_per_round=_r(k_eff, 3), pardon_rate=_r(tot["pardoned"] / tot["drafted"]),
                       accept_length=_r(tot["new_tokens"] / max(1, tot["steps"]), 3),
                       accepted_per_round=_r(tot["accepted"] / max(1, tot["steps"]), 3),
                       distortion=_r(tot["total_distortion"] / max(1, tot["new_tokens"]), 5), cost_ratio=_r(c),
                       theory_E=_r(e, 3), theory_S=_r(theory_s, 3),
                       verify_steps=_r(t_verify / t_step, 3) if t_step else None,
                       cost_model_S=_r(e * t_step / (t_round_draft + t_verify), 3) if t_step else None)
            if cfg.shape == "tree":  # E(a, k) is a chain's formula: not a tree's theory
                row.update(theory_E=None, theory_S=None, cost_model_S=None)
        if any(r["correct"] is not None for r in rs):
            n_ok = sum(bool(r["correct"]) for r in rs)
            agree = [r["answer"] == target_answer.get((j.prompt_id, j.seed)) for j, r in zip(js, rs)
                     if (j.prompt_id, j.seed) in target_answer]
            row.update(accuracy=_r(n_ok / len(rs), 3), accuracy_ci=[_r(x, 3) for x in wilson(n_ok, len(rs))],
                       agreement=_r(sum(agree) / len(agree), 3) if agree else None,
                       agreement_ci=[_r(x, 3) for x in wilson(sum(agree), len(agree))] if agree else None)
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------- files


def write_all(s: Any, prompts: list[dict[str, Any]], rows: dict[Any, dict[str, Any]],
              by_section: dict[str, list[Any]], meta: dict[str, Any]) -> dict[str, Any]:
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    sections_of: dict[Any, list[str]] = defaultdict(list)
    for sec, jobs in by_section.items():
        for j in jobs:
            sections_of[j].append(sec)
    with open(out / "runs.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=RUN_FIELDS)
        w.writeheader()
        for j, r in rows.items():
            p = prompts[j.prompt_id]
            w.writerow(dict(method=j.config.method, label=j.config.label, temperature=j.config.temperature,
                            k=j.config.k, beta=j.config.beta, sections=" ".join(sections_of[j]),
                            params=";".join(f"{k}={v:g}" for k, v in j.config.params), draft_length=j.config.draft,
                            draft_shape=j.config.shape, tree_budget=j.config.budget,
                            prompt_id=j.prompt_id, task=p.get("task"), seed=j.seed, max_new_tokens=j.max_new_tokens,
                            tokens_per_s=round(r["new_tokens"] / _decode_s(r), 3) if _decode_s(r) else None,
                            expected=p.get("answer"), **{k: r[k] for k in RUN_FIELDS if k in r}))
    summary = dict(meta, sections={sec: pool(jobs, rows) for sec, jobs in by_section.items()})
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    figs = figures(summary)
    write_html(out / "report.html", summary, figs)
    if s.images:
        write_pngs(figs, out)
    return summary


def write_pngs(figs: dict[str, go.Figure], out: Path, chromium: str = "/usr/bin/chromium") -> None:
    """Each figure as <name>.png, drawn by plotly.js in headless chromium through playwright (the
    browser the tests use; no extra image-export package)."""
    from playwright.sync_api import sync_playwright
    from plotly.offline import get_plotlyjs

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu",
                                                                      "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 960, "height": 480})
        # plotly.js (3.5 MB) parsed once for all the figures, not once a figure: half the time of a bench's images
        page.set_content(f'<html><head><meta charset="utf-8"><script>{get_plotlyjs()}</script></head><body>'
                         '<div id="fig" style="width:940px;height:460px"></div></body></html>')
        for name, fig in figs.items():
            page.evaluate("spec => Plotly.newPlot('fig', spec.data, spec.layout)", json.loads(fig.to_json()))
            page.wait_for_selector("#fig .main-svg")
            page.locator("#fig").screenshot(path=str(Path(out) / f"{name}.png"))
        browser.close()


def reaggregate(out: Path, images: bool = False) -> dict[str, Any]:
    """Rebuild summary.json and report.html from a finished run's runs.csv and summary.json (the
    pooling or the answer extraction may have changed since): nothing is decoded again."""
    from types import SimpleNamespace

    out = Path(out)
    old = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    rows: dict[Any, dict[str, Any]] = {}
    by_section: dict[str, list[Any]] = defaultdict(list)
    prompts: dict[int, dict[str, Any]] = {}
    with open(out / "runs.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            params = tuple((k, float(v)) for k, _, v in (x.partition("=") for x in (r.get("params") or "").split(";") if x))
            cfg = Config(r["method"], float(r["temperature"]), k_of(r), float(r["beta"]), params,
                         r.get("draft_length") or "policy", r.get("draft_shape") or "chain", int(r.get("tree_budget") or 0))
            job = Job(cfg, int(r["prompt_id"]), int(r["seed"]), int(r["max_new_tokens"]))
            expected = r["expected"] or None
            answer = final_answer(r["text"]) if expected else None
            rows[job] = dict({k: float(r[k]) for k in ("wall_s", "draft_ms", "target_ms", "total_distortion", "logprob")},
                             **{k: float(r[k]) if r.get(k) else None for k in ("decode_s", "ttft_s", "setup_s")},
                             **{k: int(r[k]) for k in ("new_tokens", "steps", "drafted", "accepted", "pardoned")},
                             text=r["text"], answer=answer,
                             correct=None if expected is None else answer == final_answer(expected))
            prompts[job.prompt_id] = dict(task=r["task"], answer=expected)
            for sec in r["sections"].split():
                by_section[sec].append(job)
    settings = SimpleNamespace(out=out, images=images)
    meta = {k: v for k, v in old.items() if k != "sections"}
    return write_all(settings, prompts, rows, dict(by_section), meta)


COLUMNS = [("config", "config", "{}"), ("tokens_per_s", "tok/s", "{:.1f}"), ("ratio", "vs target", "{:.2f}x"),
           ("wall_tokens_per_s", "tok/s wall", "{:.1f}"), ("wall_ratio", "vs target wall", "{:.2f}x"),
           ("ttft_s", "TTFT s", "{:.3f}"),
           ("acceptance", "accept", "{:.3f}"), ("drafts_per_round", "drafts/round", "{:.2f}"),
           ("accept_length", "tok/round", "{:.2f}"), ("accepted_per_round", "acc/round", "{:.2f}"),
           ("pardon_rate", "pardon", "{:.3f}"), ("distortion", "distortion", "{:.4f}"),
           ("cost_ratio", "c", "{:.3f}"), ("theory_S", "theory S", "{:.2f}x"),
           ("cost_model_S", "cost-model S", "{:.2f}x"), ("logprob", "log-prob", "{:.3f}"),
           ("accuracy", "math exact", "{:.2f}"), ("agreement", "= target", "{:.2f}")]


def _cells(row: dict[str, Any], cols: list[tuple[str, str, str]]) -> list[str]:
    out = []
    for key, _, fmt in cols:
        v = row.get(key)
        cell = "" if v is None else fmt.format(v)
        ci = row.get(f"{key}_ci")
        if ci and None not in ci:
            cell += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
        out.append(cell)
    return out


def _cols(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [c for c in COLUMNS if any(r.get(c[0]) is not None for r in rows)]


def format_table(summary: dict[str, Any]) -> str:
    """Fixed-width text tables, one per section."""
    parts = [f"target {summary['target']}, draft {summary['draft']}, {summary['machine']['device']}"]
    for when in ("start", "end"):  # every speed figure below was measured on this price curve
        if summary["machine"].get(f"prices_at_{when}"):
            parts.append(f"prices at the {when}: {summary['machine'][f'prices_at_{when}']}")
    if summary["machine"].get("stolen_share") is not None:  # a high share: a noisy run (timing.py, stolen)
        parts.append(f"the hypervisor took {summary['machine']['stolen_share']:.1%} of the CPU time the runs wanted")
    for sec, rows in summary["sections"].items():
        cols = _cols(rows)
        body = [[h for _, h, _ in cols]] + [_cells(r, cols) for r in rows]
        widths = [max(len(line[i]) for line in body) for i in range(len(cols))]
        parts.append(f"\n[{sec}]")
        parts += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
                  for line in body]
        parts += [f"  {r['config']}: {r['clock_note']}" for r in rows if r.get("clock_note")]
    return "\n".join(parts)


def write_html(path: Path, summary: dict[str, Any], figs: dict[str, go.Figure]) -> None:
    head = (f"<h1>EARS Studio benchmark</h1><p>target <b>{summary['target']}</b>, draft <b>{summary['draft']}</b>, "
            f"device {summary['machine']['device']}, torch {summary['machine']['torch']}, "
            f"{summary['machine']['threads']} threads; {summary['wall_s']} s of runs.</p>")
    if summary.get("assisted"):
        head += f"<p>assisted = {summary['assisted']}</p>"
    body = []
    for i, (name, fig) in enumerate(figs.items()):
        body.append(fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False, div_id=name))
    tables = []
    for sec, rows in summary["sections"].items():
        cols = _cols(rows)
        th = "".join(f"<th>{h}</th>" for _, h, _ in cols)
        trs = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in _cells(r, cols)) + "</tr>" for r in rows)
        notes = "".join(f"<p>{r['config']}: {r['clock_note']}</p>" for r in rows if r.get("clock_note"))
        tables.append(f"<h2>{sec}</h2><table><tr>{th}</tr>{trs}</table>{notes}")
    style = ("<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style>")
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>EARS benchmark</title>{style}</head>"
                    f"<body>{head}{''.join(body)}{''.join(tables)}</body></html>", encoding="utf-8")


# -------------------------------------------------------------------------------------- figures


def figures(summary: dict[str, Any]) -> dict[str, go.Figure]:
    """The report's figures, one per section the summary holds, in the report's order."""
    secs = summary["sections"]
    makers = (("main", "speed", _speed_figure), ("sweep", "frontier", _sweep_figure), ("k", "k", _k_figure),
              ("frontier", "lossy", _lossy_figure), ("tree", "tree", tree_section_figure),
              ("fidelity", "fidelity", _fidelity_figure))
    return {name: make(secs[sec]) for sec, name, make in makers if sec in secs}


def _speed_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """The main section: each method's speed against target-only, measured, with theory and the cost model."""
    rows = [r for r in rows if r["method"] != "target"]
    fig = go.Figure(go.Bar(x=[r["label"] for r in rows], y=[r["ratio"] for r in rows], name="measured"))
    for key, sym in (("theory_S", "diamond"), ("cost_model_S", "x")):
        fig.add_scatter(x=[r["label"] for r in rows], y=[r.get(key) for r in rows], mode="markers",
                        marker=dict(symbol=sym, size=11), name=key.replace("_", " "))
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title="Speed against target-only decoding (same run, interleaved)",
                      yaxis_title="tokens/s ratio")
    return fig


def _sweep_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """The sweep section: acceptance and speed against distortion, one curve per temperature over beta."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance vs distortion", "speed vs distortion"))
    palette = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3"]
    for n, t in enumerate(sorted({r["temperature"] for r in rows})):
        colour = dict(color=palette[n % len(palette)])
        pts = sorted((r for r in rows if r["temperature"] == t and r["method"] != "target"), key=lambda r: r["beta"])
        xs, lab = [r["distortion"] for r in pts], [f"β={r['beta']:g}" for r in pts]
        fig.add_scatter(x=xs, y=[r["acceptance"] for r in pts], text=lab, mode="lines+markers",
                        name=f"T={t:g}", legendgroup=str(t), line=colour, row=1, col=1)
        fig.add_scatter(x=xs, y=[r["ratio"] for r in pts], text=lab, mode="lines+markers", name=f"T={t:g}",
                        legendgroup=str(t), showlegend=False, line=colour, row=1, col=2)
    return _against_distortion(fig, "mean exact distortion (TV per token)",
                               "beta x temperature: the speed-distortion frontier (beta 0 = ordinary)")


def _against_distortion(fig: go.Figure, x_title: str, title: str) -> go.Figure:
    """The axes of a two-panel figure of acceptance (left) and speed (right) against distortion."""
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text="acceptance rate", row=1, col=1)
    fig.update_yaxes(title_text="tokens/s vs target-only", row=1, col=2)
    fig.update_layout(title=title)
    return fig


def _k_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """The k section: speed and tokens per round against K, measured beside the cost model and E(a, K)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s vs target-only", "tokens per round"))
    for m, col in (("ordinary", "#636efa"), ("ears", "#ef553b")):
        pts = sorted((r for r in rows if r["method"] == m), key=k_of)
        if not pts:
            continue
        ks, name, line = [k_of(r) for r in pts], pts[0]["label"], dict(color=col)
        fig.add_scatter(x=ks, y=[r["ratio"] for r in pts], mode="lines+markers", name=f"{name} measured",
                        line=line, row=1, col=1)
        fig.add_scatter(x=ks, y=[r.get("cost_model_S") for r in pts], mode="lines", line=dict(line, dash="dash"),
                        name=f"{name} cost model", row=1, col=1)
        fig.add_scatter(x=ks, y=[r["accept_length"] for r in pts], mode="lines+markers", name=f"{name} measured",
                        showlegend=False, line=line, row=1, col=2)
        fig.add_scatter(x=ks, y=[r["theory_E"] for r in pts], mode="lines", line=dict(line, dash="dot"),
                        name=f"{name} E(a, K)", row=1, col=2)
    fig.update_xaxes(title_text="K")
    fig.update_layout(title="Draft length K")
    return fig


def _lossy_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """The frontier section: one curve per lossy rule, ordered by distortion; the ordinary rule at 0."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance vs distortion", "speed vs distortion"))
    palette = ["#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880"]
    rows = [r for r in rows if r["method"] != "target" and r.get("distortion") is not None]
    for n, m in enumerate(dict.fromkeys(r["method"] for r in rows)):
        pts = sorted((r for r in rows if r["method"] == m), key=lambda r: (r["distortion"], r["acceptance"]))
        lossless = m == "ordinary"
        style = dict(mode="markers", marker=dict(symbol="star", size=13, color="#636efa")) if lossless else dict(
            mode="lines+markers", line=dict(color=palette[n % len(palette)]))
        for col, key in ((1, "acceptance"), (2, "ratio")):
            fig.add_scatter(x=[r["distortion"] for r in pts], y=[r.get(key) for r in pts], text=[r["label"] for r in pts],
                            name=m, legendgroup=m, showlegend=col == 1, row=1, col=col, **style)
    return _against_distortion(fig, "mean exact distortion, TV per token (FLy: its approximation)",
                               "Lossy rules, same prompts and seeds: acceptance and speed vs distortion")


def _fidelity_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """The fidelity section: math exact match and agreement with target-only, with Wilson intervals."""
    fig = go.Figure()
    for key, name in (("accuracy", "exact match with the answer key"), ("agreement", "same answer as target-only")):
        pts = [r for r in rows if r.get(key) is not None]
        fig.add_bar(x=[r["label"] for r in pts], y=[r[key] for r in pts], name=name,
                    error_y=dict(type="data", symmetric=False,
                                 array=[r[f"{key}_ci"][1] - r[key] for r in pts],
                                 arrayminus=[r[key] - r[f"{key}_ci"][0] for r in pts]))
    fig.update_layout(title="Math final answers (Wilson 95% intervals)", yaxis_range=[0, 1], barmode="group")
    return fig


def tree_section_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """The tree section: mean accepted tokens per round of a chain (K = N) and a tree (N nodes) at
    the same verify price, and tokens/s against target-only of the chain's policy and the tree
    sized by the cost model; one bar group per rule and temperature."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accepted per round at the same verify price",
                                                        "tokens/s vs target-only, each with the cost model"))
    spec = [r for r in rows if r["method"] != "target"]
    for shape, colour in (("chain", "#636efa"), ("tree", "#e6007e")):
        fixed = [r for r in spec if r.get("shape", "chain") == shape and r.get("draft") == "fixed"]
        fig.add_bar(x=[f"{r['method']} N={k_of(r)} T={r['temperature']:g}" for r in fixed],
                    y=[r.get("accepted_per_round") for r in fixed], name=f"{shape}, fixed", marker_color=colour,
                    row=1, col=1)
        auto = [r for r in spec if r.get("shape", "chain") == shape and r.get("draft") == "policy"]
        fig.add_bar(x=[f"{r['method']} T={r['temperature']:g}" for r in auto], y=[r.get("ratio") for r in auto],
                    name=f"{shape}, cost model", marker_color=colour, opacity=0.6, row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=2)
    fig.update_layout(title="Chain against tree (seed 002)", barmode="group")
    return fig
