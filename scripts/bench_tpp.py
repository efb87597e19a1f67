"""Events/s of speculative vs autoregressive event sampling with the shipped neural TPP.

    .venv/bin/python scripts/bench_tpp.py                 # l in 1 2 4 8 16, markdown table on stdout
    .venv/bin/python scripts/bench_tpp.py --events 3000 --repeats 5 --json docs/tpp_bench.json
    .venv/bin/python scripts/bench_tpp.py --tolerance          # the optional EARS-style tolerance, beyond the seed
    .venv/bin/python scripts/bench_tpp.py --model assets/tpp/renewal --json docs/tpp_bench_renewal.json

Both samplers draw the same number of events from the same model, on one CPU thread, interleaved
round by round (autoregressive, then every l) so that load from other processes hits all of them
alike; each figure is the median over ``--repeats`` rounds with different seeds. Acceptance rate =
kept proposals / proposal positions evaluated (positions up to and including the first rejection);
mean accepted per step = kept proposals per step (= events per step: a step emits its kept proposals;
a rejected position is drawn at the start of the next step); ratio = speculative events/s / autoregressive;
``--from-json`` reprints a saved table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from ears_core.tpp.model import ASSET_DIR, load_model
from ears_core.tpp.sampler import SpecConfig, autoregressive_sample, speculative_sample


def run(events: int, repeats: int, ls: list[int], folder: Path = ASSET_DIR) -> dict:
    model = load_model(folder)
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
    return dict(model=str(folder.relative_to(folder.parents[1])) if folder.is_absolute() else str(folder),
                events=events, repeats=repeats, device="cpu", threads=torch.get_num_threads(),
                cpu=platform.processor() or platform.machine(), cores=os.cpu_count(), rows=rows)


def markdown(res: dict) -> str:
    out = ["| l | speculative events/s | autoregressive events/s | ratio | acceptance rate | mean accepted / step "
           "| ms / step | ms / autoregressive event |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        out.append(f"| {r['l']} | {r['spec_events_per_s']:.0f} | {r['ar_events_per_s']:.0f} | {r['ratio']:.2f}x | "
                   f"{r['acceptance_rate']:.3f} | {r['mean_accepted_per_step']:.2f} | "
                   f"{1e3 * r['events_per_step'] / r['spec_events_per_s']:.2f} | {1e3 / r['ar_events_per_s']:.2f} |")
    return "\n".join(out)


def tolerance(betas: list[float], l: int = 4, n_seq: int = 400, n_events: int = 8) -> str:
    """Speed, acceptance and distortion of the EARS-style tolerance against the exact autoregressive sampler.
    Distortion: KS distance (and p-value) of pooled log inter-event times of events 2..n, and total variation
    of pooled type frequencies, from n_seq sequences each; beta = 0 gives the noise floor of the comparison."""
    model = load_model()
    for beta in betas:  # warm-up: the first runs of a process are slower
        speculative_sample(model, l=l, n_events=200, seed=999, cfg=SpecConfig(beta=beta))
    autoregressive_sample(model, n_events=200, seed=999)
    ar = [autoregressive_sample(model, n_events=n_events, seed=100_000 + i) for i in range(n_seq)]
    ar_gaps = np.log([t for r in ar for t in r.taus[1:]])
    ar_types = np.bincount([x for r in ar for x in r.types], minlength=3) / (n_seq * n_events)
    ar_eps = n_seq * n_events / sum(r.seconds for r in ar)
    out = ["| beta | events/s | ratio to autoregressive | acceptance rate | mean accepted / step | KS distance (p) | type TV |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for beta in betas:
        runs = [speculative_sample(model, l=l, n_events=n_events, seed=i, cfg=SpecConfig(beta=beta)) for i in range(n_seq)]
        steps = [s for r in runs for s in r.steps]
        evaluated = sum(min(s.num_accepted + 1, l) for s in steps)
        acc = sum(s.num_accepted for s in steps)
        eps = n_seq * n_events / sum(r.seconds for r in runs)
        ks = stats.ks_2samp(np.log([t for r in runs for t in r.taus[1:]]), ar_gaps)
        types = np.bincount([x for r in runs for x in r.types], minlength=3) / (n_seq * n_events)
        out.append(f"| {beta} | {eps:.0f} | {eps / ar_eps:.2f}x | {acc / evaluated:.3f} | {acc / len(steps):.2f} | "
                   f"{ks.statistic:.3f} ({ks.pvalue:.2g}) | {0.5 * np.abs(types - ar_types).sum():.3f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--l", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--model", type=Path, default=ASSET_DIR, help="weights folder (assets/tpp/renewal: renewal model)")
    ap.add_argument("--from-json", type=Path, default=None, help="reprint the table of a saved --json run")
    ap.add_argument("--tolerance", action="store_true", help="measure the optional EARS-style tolerance instead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.from_json:
        print(markdown(json.loads(args.from_json.read_text())))
        return
    if args.tolerance:
        print(tolerance([0.0, 0.1, 0.3, 0.5]))
        return
    res = run(args.events, args.repeats, args.l, args.model)
    print(markdown(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
