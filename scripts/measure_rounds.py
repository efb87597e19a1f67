"""Where a round's time goes, by its number of drafts k, on the embedded pair (issue 14's policy).

Held-out prompts of ``assets/prompts.json``, fixed K = 1..4 and the policy at one temperature, in a
rotated order per prompt, then target-only. For every k seen: the rounds' mean draft time, verify
pass, per-round overhead and whole round, in ms and in target-only steps measured in the same run,
beside the price curve the policy reads (the profile and the session's running prices). Run it alone.

    python scripts/measure_rounds.py [--prompts 6] [--tokens 64] [--temperature 0]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from ears_core import load_pair
from ears_core.report.bench_plan import load_prompts, spread
from ears_core.policy.costs import describe
from ears_core.serve.session import RunConfig, Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    session = Session(load_pair())
    session.warm_up()
    profile = describe(session.prices)
    modes = [("fixed", k) for k in (1, 2, 3, 4)] + [("policy", 4)]
    rounds: dict[str, dict[int, list[tuple[float, float, float]]]] = defaultdict(lambda: defaultdict(list))
    tps: dict[str, list[float]] = defaultdict(list)
    step_ms: list[float] = []
    prompts = spread(load_prompts(Path(__file__).resolve().parents[1] / "assets" / "prompts.json"), a.prompts)
    for p, item in enumerate(prompts):
        ids = session.encode(item["prompt"])
        order = modes[p % len(modes):] + modes[: p % len(modes)]
        for mode, k in order:
            run = session.speculative(ids, RunConfig(rule="standard", params={}, temperature=a.temperature, k=k,
                                                     max_new_tokens=a.tokens, seed=p, draft_length=mode,
                                                     draft_shape="chain"))
            for _ in run:
                pass
            name = f"{mode} K={k}"
            tps[name].append(run.gen.stats().tokens_per_s)
            for s in run.gen.steps:
                rounds[name][s.drafted].append((s.draft_ms, s.target_ms, s.overhead_ms))
        base = session.baseline(ids, RunConfig(rule="standard", params={}, temperature=a.temperature,
                                               max_new_tokens=a.tokens, seed=p))
        for _ in base:
            pass
        step_ms.extend(s.target_ms for s in base.gen.steps)
        tps["target"].append(base.gen.stats().tokens_per_s)
    step = statistics.median(step_ms)
    table = {}
    for name, by_k in rounds.items():
        for k, rows in sorted(by_k.items()):
            d, v, o = (statistics.mean(r[i] for r in rows) for i in range(3))
            table[f"{name} k={k}"] = {"rounds": len(rows), "draft_ms": round(d, 2), "verify_ms": round(v, 2),
                                      "overhead_ms": round(o, 2), "round_steps": round((d + v + o) / step, 3),
                                      "verify_steps": round(v / step, 3)}
    out = {"profile": profile, "running": describe(session.prices), "target_step_ms": round(step, 2),
           "tokens_per_s": {n: round(statistics.mean(x), 2) for n, x in tps.items()},
           "ratio": {n: round(statistics.mean(x) / statistics.mean(tps["target"]), 3) for n, x in tps.items()},
           "rounds": table}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
