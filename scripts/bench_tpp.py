"""Events/s of the two exact speculative samplers against autoregressive sampling of the same transformer target.

    .venv/bin/python scripts/bench_tpp.py --json docs/results/tpp_bench.json        # every process, 1,000 events
    .venv/bin/python scripts/bench_tpp.py --process hawkes --events 200 --repeats 1  # a quick look
    .venv/bin/python scripts/bench_tpp.py --from-json docs/results/tpp_bench.json   # reprint a saved table

For each process (assets/tpp/<process>/{target,draft}), one sequence of ``--events`` events per sampler and
repeat, on one CPU thread, interleaved within each repeat (autoregressive, self-proposal with the cost model,
draft model with the cost model, then the draft model at each ``--fixed`` length) so that load from other
processes hits them alike. Each row reports the median over repeats of: events/s, the ratio to the
autoregressive run of the same repeat, acceptance (drafts kept / drafts evaluated, up to and including the
first rejection), events per speculative round, the share of autoregressive fallback rounds and the draft
lengths the cost model chose. The cost model's one-off price measurement runs before the timed runs and is
reported apart (``calibration_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from ears_core.tpp.processes import PROCESSES
from ears_core.model.kernels.cpu_forms import cpu_model
from ears_core.tpp.run import prices_for, sample
from ears_core.tpp.transformer import load_pair


def bench_process(name: str, events: int, repeats: int, fixed: list[int]) -> dict:
    target, draft = load_pair(name)
    t0 = time.perf_counter()
    prices = {m: prices_for(m, target, draft) for m in ("self", "draft")}
    calibration = time.perf_counter() - t0
    settings = [("autoregressive", None), ("self", None), ("draft", None), *[("draft", g) for g in fixed]]
    for method, length in settings:  # warm-up
        sample(target, draft, method=method, length=length, n_events=50, seed=999)
    runs: dict = {s: [] for s in settings}
    for r in range(repeats):
        for method, length in settings:
            runs[(method, length)].append(sample(target, draft, method=method, length=length, n_events=events, seed=r))
    ar_eps = [run.events_per_second for run in runs[("autoregressive", None)]]
    rows = []
    for (method, length), rs in runs.items():
        st = [run.stats() for run in rs]
        med = lambda k: statistics.median(s[k] for s in st)  # noqa: E731
        lengths: dict = {}
        for s in st:
            for k, v in s["lengths"].items():
                lengths[k] = lengths.get(k, 0) + v
        rows.append(dict(process=name, sampler=method, length="cost model" if length is None else length,
                         events_per_s=med("events_per_s"),
                         ratio=statistics.median(run.events_per_second / a for run, a in zip(rs, ar_eps)),
                         acceptance=med("acceptance"), events_per_round=med("events_per_round"),
                         ar_fallback_share=statistics.median(s["ar_rounds"] / s["rounds"] for s in st),
                         lengths_used={str(k): v for k, v in lengths.items()}))
    return dict(rows=rows, calibration_s=round(calibration, 2),
                prices_ms={m: dict(ar=round(p.ar * 1e3, 3), rounds={str(k): round(v * 1e3, 3) for k, v in p.rounds.items()})
                           for m, p in prices.items()},
                target_layers=target.cfg.layers, draft_layers=draft.cfg.layers)


def markdown(res: dict) -> str:
    out = [f"Machine: {res['cpu']} ({res['cores']} cores), 1 torch thread, {res['events']} events per run, "
           f"median of {res['repeats']} interleaved repeats.", "",
           "| process | sampler | draft length | events/s | ratio vs autoregressive | acceptance | events / round "
           "| autoregressive fallback | lengths used |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for p in res["processes"].values():
        for r in p["rows"]:
            f = lambda v, d=2: "" if v != v else f"{v:.{d}f}"  # noqa: E731  (nan -> blank)
            used = ", ".join(f"{'ar' if k == '0' else k}: {v}" for k, v in r["lengths_used"].items())
            out.append(f"| {r['process']} | {r['sampler']} | {r['length'] if r['sampler'] != 'autoregressive' else ''} "
                       f"| {r['events_per_s']:.0f} | {r['ratio']:.2f}x | {f(r['acceptance'], 3)} | "
                       f"{f(r['events_per_round'])} | {r['ar_fallback_share']:.0%} | {used} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--process", choices=[*PROCESSES, "all"], default="all")
    ap.add_argument("--events", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fixed", type=int, nargs="*", default=[4, 8], help="fixed draft lengths to run as well")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--from-json", type=Path)
    args = ap.parse_args()
    if args.from_json:
        print(markdown(json.loads(args.from_json.read_text())))
        return
    if args.events < 1 or args.repeats < 1 or any(g < 1 for g in args.fixed):
        raise SystemExit("--events, --repeats and every --fixed length must be >= 1")
    torch.set_num_threads(1)
    names = list(PROCESSES) if args.process == "all" else [args.process]
    res = dict(cpu=cpu_model(), cores=os.cpu_count(), threads=1, torch=torch.__version__, events=args.events,
               repeats=args.repeats, processes={})
    for name in names:
        res["processes"][name] = bench_process(name, args.events, args.repeats, args.fixed)
        print(markdown({**res, "processes": {name: res["processes"][name]}}), flush=True)
    print()
    print(markdown(res))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
