"""Events/s of speculative vs autoregressive event sampling with the shipped neural TPP.

    .venv/bin/python scripts/bench_tpp.py                 # l in 1 2 4 8 16, markdown table on stdout
    .venv/bin/python scripts/bench_tpp.py --events 3000 --repeats 5 --json docs/tpp_bench.json

Both samplers draw the same number of events from the same model, on one CPU thread, interleaved
round by round (autoregressive, then every l) so that load from other processes hits all of them
alike; each figure is the median over ``--repeats`` rounds with different seeds. Acceptance rate =
kept proposals / proposal positions evaluated (positions up to and including the first rejection);
mean accepted per step = kept proposals per step; ratio = speculative events/s / autoregressive.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from ears_core.tpp.model import load_model
from ears_core.tpp.sampler import autoregressive_sample, speculative_sample


def run(events: int, repeats: int, ls: list[int]) -> dict:
    model = load_model()
    ar, spec = [], {l: [] for l in ls}
    speculative_sample(model, l=4, n_events=200, seed=999)  # warm-up
    autoregressive_sample(model, n_events=200, seed=999)
    for r in range(repeats):
        ar.append(autoregressive_sample(model, n_events=events, seed=r).events_per_second)
        for l in ls:
            spec[l].append(speculative_sample(model, l=l, n_events=events, seed=r).stats())
    ar_eps = statistics.median(ar)
    rows = []
    for l in ls:
        med = lambda k: statistics.median(s[k] for s in spec[l])  # noqa: E731
        rows.append(dict(l=l, spec_events_per_s=med("events_per_s"), ar_events_per_s=ar_eps,
                         ratio=med("events_per_s") / ar_eps, acceptance_rate=med("acceptance_rate"),
                         mean_accepted_per_step=med("mean_accepted_per_step"),
                         events_per_step=med("events_per_step"), max_mass_outside=max(s["max_mass_outside"] for s in spec[l])))
    return dict(events=events, repeats=repeats, device="cpu", threads=torch.get_num_threads(),
                cpu=platform.processor() or platform.machine(), cores=os.cpu_count(), rows=rows)


def markdown(res: dict) -> str:
    out = ["| l | speculative events/s | autoregressive events/s | ratio | acceptance rate | mean accepted / step | events / step |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        out.append(f"| {r['l']} | {r['spec_events_per_s']:.0f} | {r['ar_events_per_s']:.0f} | {r['ratio']:.2f}x | "
                   f"{r['acceptance_rate']:.3f} | {r['mean_accepted_per_step']:.2f} | {r['events_per_step']:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--l", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    res = run(args.events, args.repeats, args.l)
    print(markdown(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
