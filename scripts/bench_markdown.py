"""Markdown tables from a bench summary (``python -m ears_core.bench`` writes ``summary.json``).

The docs carry their figures in marked blocks, each naming the summary it was rendered from and
the view::

    <!-- FIGURES: from docs/results/bench_xeon_policy_tree.json view=policy -->
    | ... the table ... |
    <!-- /FIGURES -->

Views: ``headline`` (the README's table: target-only, the chain policy, the best fixed K and the
cost-model tree per setting; needs the policy and tree sections), ``machine`` (one line: prompts,
tokens and the price curve the run was measured on), ``policy`` and ``tree`` (one row per setting),
and ``main``, ``sweep``, ``k``, ``fidelity``, ``frontier`` (one row per config). The quality section
writes a file of its own (``quality.json``, copied to ``docs/results/bench_<machine>_quality.json``): views
``quality`` (one row per rule and knob) and ``quality_notes`` (what was run, the lossless check, the
first EARS beta outside the ordinary rule's interval); ``greedy`` reads scripts/quality_greedy.py's
file (the target's greedy accuracy per category, and the categories left out).

    python scripts/bench_markdown.py SUMMARY.json [--view policy]      # print tables
    python scripts/bench_markdown.py --update README.md docs/benchmarks.md
    python scripts/bench_markdown.py --update README.md docs/benchmarks.md --from docs/results/NEW.json
    python scripts/bench_markdown.py --check README.md docs/benchmarks.md   # exit 1 if a block is stale

A block ``from (none)`` waits for a summary that holds its section (``--from`` fills it).

``--update`` re-renders every block from the file it names; with ``--from``, every block whose
section the new summary holds is re-pointed to it first (copy a fresh ``bench_out/summary.json``
into ``docs/results/`` under a name that says what it measures, then run this).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- FIGURES: from (?P<file>\S+) view=(?P<view>\w+) -->\n)(?P<body>.*?)(<!-- /FIGURES -->)", re.S)
NONE = "(none)"  # a block that waits for a run of its section: `from (none)`
NEEDS = {"headline": ("policy", "tree"), "machine": (), "policy": ("policy",), "tree": ("tree",), "main": ("main",),
         "sweep": ("sweep",), "k": ("k",), "fidelity": ("fidelity",), "frontier": ("frontier",),
         "quality": ("quality",), "quality_notes": ("quality",), "greedy": ("greedy",)}
# Files that are not bench summaries, and the view "section" each serves.
OWN = {"quality": lambda s: s.get("section") == "quality", "greedy": lambda s: "replies" in s and "by_category" in s}


def holds(summary: dict[str, Any], section: str) -> bool:
    """Whether a file holds a section: a bench summary's section, or a file of its own (``OWN``)."""
    return section in summary.get("sections", {}) or (section in OWN and OWN[section](summary))


def serves(summary: dict[str, Any], view: str) -> bool:
    """Whether a file can render a view: it holds every section the view needs, and a view of the
    bench summary (even one that needs none, ``machine``) needs a bench summary."""
    needs = NEEDS[view]
    own = bool(needs) and all(sec in OWN for sec in needs)
    return all(holds(summary, sec) for sec in needs) and (own or "sections" in summary)


# ------------------------------------------------------------------------------------- helpers


def _x(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}x"


def _f(v: float | None, nd: int = 2) -> str:
    return "" if v is None else f"{v:.{nd}f}"


def _ci(row: dict[str, Any], key: str) -> str:
    v, ci = row.get(key), row.get(f"{key}_ci")
    if v is None:
        return ""
    return f"{v:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and None not in ci else "")


def _table(head: list[str], rows: list[list[str]]) -> str:
    keep = [i for i in range(len(head)) if i == 0 or any(r[i] for r in rows)]  # drop empty columns
    lines = ["| " + " | ".join(head[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    lines += ["| " + " | ".join(r[i] for i in keep) + " |" for r in rows]
    return "\n".join(lines)


def _draft(r: dict[str, Any]) -> str:
    return r.get("draft") or "policy"


def _shape(r: dict[str, Any]) -> str:
    return r.get("shape") or "chain"


def _rule(r: dict[str, Any]) -> str:
    """The rule and its parameters, without the draft length or shape: 'ordinary', 'ears 0.1'."""
    return re.sub(r"\s*(\[\w+\]|tree\(\d+\))", "", r["label"]).strip()


def _setting(r: dict[str, Any]) -> str:
    t = r["temperature"]
    return "T = 0 (greedy)" if t == 0 else f"T = {t:g}, {'EARS ' + _rule(r)[5:] if r['method'] == 'ears' else _rule(r)}"


def _settings(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Speculative rows grouped by (temperature, rule), in the summary's order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["method"] not in ("target", "assisted"):
            out.setdefault(_setting(r), []).append(r)
    return out


def _target(rows: list[dict[str, Any]], t: float) -> dict[str, Any] | None:
    return next((r for r in rows if r["method"] == "target" and r["temperature"] == t), None)


def k_of(row: dict[str, Any]) -> int:
    """A row's K (drafts per round at most): "k" in summaries written now, "gamma" in those written before the
    rename (docs/results keeps both kinds)."""
    return int(row["k"] if "k" in row else row["gamma"])


def _pick(rows: list[dict[str, Any]], draft: str, shape: str = "chain", k: int | None = None) -> dict[str, Any] | None:
    return next((r for r in rows if _draft(r) == draft and _shape(r) == shape and (k is None or k_of(r) == k)),
                None)


def _bold_best(cells: list[str], values: list[float | None]) -> list[str]:
    """Bold every cell whose value, as shown (two decimals), is the row's best."""
    shown = [None if v is None else round(v, 2) for v in values]
    best = max((v for v in shown if v is not None), default=None)
    return [f"**{c}**" if v is not None and v == best else c for c, v in zip(cells, shown)]


# --------------------------------------------------------------------------------------- views


def view_machine(s: dict[str, Any]) -> str:
    st, m = s["settings"], s["machine"]
    secs = [k for k in s["sections"]]
    prompts = st["prompts"] if {"main", "policy", "tree"} & set(secs) else st["sweep_prompts"]
    tokens = st["policy_tokens"] if {"policy", "tree"} & set(secs) else st["max_new_tokens"]
    line = (f"{prompts} prompts x {tokens} new tokens, {m['threads']} threads, torch {m['torch']} on {m['device']}; "
            f"sections {', '.join(secs)}; {s['wall_s'] / 60:.0f} min of runs.")
    curve = m.get("prices_at_start")
    if curve:
        line += f" Price curve at the start: {curve}."
    return line


def view_headline(s: dict[str, Any]) -> str:
    pol, tree = s["sections"]["policy"], s["sections"]["tree"]
    head = ["setting", "target-only", "chain policy", "best fixed K", "cost-model tree", "tokens a round (policy)"]
    rows = []
    for name, rs in _settings(pol).items():
        t = rs[0]["temperature"]
        base, chain = _target(pol, t), _pick(rs, "policy")
        fixed = [r for r in rs if _draft(r) == "fixed"]
        best = max(fixed, key=lambda r: r["ratio"] or 0, default=None)
        tr = _pick([r for r in tree if _setting(r) == name], "policy", "tree")
        values = [chain and chain["ratio"], best and best["ratio"], tr and tr["ratio"]]
        cells = [_x(values[0]), f"{_x(values[1])} (K = {k_of(best)})" if best else "", _x(values[2])]
        rows.append([name, f"{base['tokens_per_s']:.1f} tokens/s" if base else "", *_bold_best(cells, values),
                     _f(chain and chain.get("accept_length"))])
    return _table(head, rows)


def view_policy(s: dict[str, Any]) -> str:
    pol = s["sections"]["policy"]
    ks = sorted({k_of(r) for r in pol if _draft(r) == "fixed"})
    head = ["setting", "target-only tokens/s", "chain policy", *[f"fixed K = {k}" for k in ks], "threshold",
            "policy: drafts / tokens a round"]
    rows = []
    for name, rs in _settings(pol).items():
        base, chain = _target(pol, rs[0]["temperature"]), _pick(rs, "policy")
        picked = [chain, *[_pick(rs, "fixed", k=k) for k in ks], _pick(rs, "threshold")]
        values = [r and r["ratio"] for r in picked]
        extra = f"{chain['drafts_per_round']:.2f} / {chain['accept_length']:.2f}" if chain else ""
        rows.append([name, _f(base and base["tokens_per_s"], 1), *_bold_best([_x(v) for v in values], values), extra])
    return _table(head, rows)


def view_tree(s: dict[str, Any]) -> str:
    tree = s["sections"]["tree"]
    ns = sorted({k_of(r) for r in tree if _draft(r) == "fixed"})
    head = ["setting"]
    for n in ns:
        head += [f"accepted a round: chain K = {n} / tree of {n}", f"speed: chain K = {n} / tree of {n}"]
    head += ["chain policy", "cost-model tree", "tree: nodes / tokens a round"]
    rows = []
    for name, rs in _settings(tree).items():
        row = [name]
        for n in ns:
            c, t = _pick(rs, "fixed", "chain", n), _pick(rs, "fixed", "tree", n)
            row += [f"{_f(c and c.get('accepted_per_round'))} / {_f(t and t.get('accepted_per_round'))}",
                    f"{_x(c and c['ratio'])} / {_x(t and t['ratio'])}"]
        c, t = _pick(rs, "policy", "chain"), _pick(rs, "policy", "tree")
        row += _bold_best([_x(c and c["ratio"]), _x(t and t["ratio"])], [c and c["ratio"], t and t["ratio"]])
        row.append(f"{t['drafts_per_round']:.2f} / {t['accept_length']:.2f}" if t else "")
        rows.append(row)
    return _table(head, rows)


Column = tuple[str, Callable[[dict[str, Any]], str]]
LABEL: Column = ("config", lambda r: {"target": "target-only", "assisted": "transformers' assisted"}.get(r["method"], r["label"]))
TPS: Column = ("tokens/s", lambda r: _f(r.get("tokens_per_s"), 1))
RATIO: Column = ("vs target-only", lambda r: _x(r.get("ratio")))
ACCEPT: Column = ("acceptance", lambda r: _f(r.get("acceptance"), 3))
ROUND: Column = ("tokens a round", lambda r: _f(r.get("accept_length")))
PARDON: Column = ("pardons", lambda r: _f(r.get("pardon_rate"), 3))
DIST: Column = ("distortion (TV a token)", lambda r: _f(r.get("distortion"), 4))
LOGP: Column = ("log-prob", lambda r: _f(r.get("logprob"), 3))
COLUMNS: dict[str, list[Column]] = {
    "main": [LABEL, TPS, RATIO, ACCEPT, ROUND, PARDON, DIST, ("theory S", lambda r: _x(r.get("theory_S"))),
             ("cost-model S", lambda r: _x(r.get("cost_model_S"))), LOGP],
    "sweep": [("T", lambda r: f"{r['temperature']:g}"), LABEL, ACCEPT, PARDON, DIST, RATIO, LOGP],
    "k": [("K", lambda r: str(k_of(r))), LABEL, ACCEPT, ROUND, RATIO],
    "fidelity": [LABEL, ("math exact [95 % CI]", lambda r: _ci(r, "accuracy")),
                 ("same answer as target-only [95 % CI]", lambda r: _ci(r, "agreement")), LOGP],
    "frontier": [LABEL, ACCEPT, ROUND, DIST, RATIO],
}


def view_rows(s: dict[str, Any], section: str) -> str:
    cols = COLUMNS[section]
    rows = s["sections"][section]
    if section == "sweep":
        rows = sorted(rows, key=lambda r: (r["temperature"], r["method"] != "target", r["beta"]))
    elif section == "k":
        rows = sorted(rows, key=lambda r: (k_of(r), r["label"]))
    return _table([h for h, _ in cols], [[f(r) for _, f in cols] for r in rows])


def view_quality(s: dict[str, Any]) -> str:
    head = ["setting", "accuracy [95 % CI]", "vs target-only [95 % CI]", "vs ordinary [95 % CI]", "speedup",
            "acceptance", "pardons", "distortion (TV a token)"]
    rows = [[r["setting"], _ci(r, "accuracy"), _signed_ci(r, "delta"), _signed_ci(r, "delta_ordinary"), _x(r.get("speedup")),
             _f(r.get("acceptance"), 3), _f(r.get("pardon_rate"), 3), _f(r.get("distortion"), 4)] for r in s["rows"]]
    return _table(head, rows)


def _signed_ci(row: dict[str, Any], key: str) -> str:
    v, ci = row.get(key), row.get(f"{key}_ci")
    if v is None:
        return ""
    return f"{v:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci and None not in ci else "")


def view_quality_notes(s: dict[str, Any]) -> str:
    q, d, rows = s["questions"], s["decoding"], s["rows"]
    ears = sorted((r for r in rows if r["method"] == "ears" and r.get("value") is not None), key=lambda r: r["value"])
    pts = "; ".join(f"beta {r['value']:g}: {r['accuracy']:.2f} at {_x(r.get('speedup'))}" for r in ears)
    first = s.get("first_beta_outside_ordinary")
    greedy = f" Greedy target-only on the same questions: {s['greedy']['accuracy']:.2f}." if s.get("greedy") else ""
    return (f"{q['count']} questions from {len(q['kept'])} categories ({', '.join(q['kept'])}; left out: "
            f"{', '.join(q['left_out']) or 'none'}) x {s['seeds']} seeds at T = {d['temperature']:g}, K = {d['k']}, {d['max_new_tokens']} new tokens, "
            f"{d['draft_length']} draft length; {s['wall_s'] / 60:.0f} min of runs on {s['machine']['device']} "
            f"({s['machine']['threads']} threads).{greedy} The ordinary rule inside target-only's interval: "
            f"{'yes' if s.get('ordinary_inside_target') else 'no'}. EARS: {pts or 'not run'}. The first beta whose "
            f"accuracy leaves the ordinary rule's interval: {'none' if first is None else f'{first:g}'}.")


def view_greedy(s: dict[str, Any]) -> str:
    rows = [[c, f"{v['right']} / {v['runs']}", _f(v["accuracy"]), "left out" if c in s["left_out"] else "yes"]
            for c, v in s["by_category"].items()]
    rows.append(["all", f"{sum(v['right'] for v in s['by_category'].values())} / {s['questions']}", _f(s["accuracy"]), ""])
    return _table(["category", "right at T = 0", "accuracy", "scored"], rows)


def render(summary: dict[str, Any], view: str) -> str:
    missing = [sec for sec in NEEDS[view] if not holds(summary, sec)]
    if missing:
        raise ValueError(f"view {view} needs the section(s) {', '.join(missing)}, which this summary lacks")
    fn = {"machine": view_machine, "headline": view_headline, "policy": view_policy, "tree": view_tree,
          "quality": view_quality, "quality_notes": view_quality_notes, "greedy": view_greedy}.get(view)
    return fn(summary) if fn else view_rows(summary, view)


# ------------------------------------------------------------------------------------ the docs


def load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    return json.loads((p if p.is_absolute() else ROOT / p).read_text(encoding="utf-8"))


def updated(text: str, source: str | None = None) -> str:
    """The text with every FIGURES block rendered again (re-pointed to ``source`` where it has the section)."""
    new = load(source) if source else None

    def one(m: re.Match[str]) -> str:
        file, view = m["file"], m["view"]
        if new is not None and serves(new, view):
            file = source
        body = render(load(file), view) if file != NONE else "*No summary in docs/results/ holds this section yet.*"
        return f"<!-- FIGURES: from {file} view={view} -->\n{body}\n<!-- /FIGURES -->"

    return BLOCK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", nargs="?", help="a summary.json to print tables from")
    p.add_argument("--view", action="append", choices=sorted(NEEDS), help="views to print (default: every one it has)")
    p.add_argument("--update", nargs="+", metavar="DOC", help="re-render the FIGURES blocks of these files in place")
    p.add_argument("--check", nargs="+", metavar="DOC", help="exit 1 if a FIGURES block differs from its summary")
    p.add_argument("--from", dest="source", help="with --update: point every block it can serve to this summary")
    a = p.parse_args(argv)
    if a.summary:
        s = load(a.summary)
        views = a.view or [v for v in NEEDS if serves(s, v)]
        for v in views:
            print(f"### {v}\n\n{render(s, v)}\n")
    for doc in a.update or ():
        path = Path(doc)
        path.write_text(updated(path.read_text(encoding="utf-8"), a.source), encoding="utf-8")
    stale = [doc for doc in a.check or () if updated(Path(doc).read_text(encoding="utf-8")) != Path(doc).read_text(encoding="utf-8")]
    for doc in stale:
        print(f"{doc}: a FIGURES block differs from its summary; run --update {doc}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
