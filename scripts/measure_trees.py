"""Do bigger draft trees pay on this machine? Tree budgets and depths through the Session, against target-only.

Held-out prompts of assets/prompts.json, ``--tokens`` new tokens each, at T = 0 (greedy) and the ordinary
rule at T = 0.9: target-only decoding, then the tree configs of ``--trees`` on the same prompt and seed.
Each config is ``[policy|fixed]:NODES:DEPTH`` (policy: the cost model sizes each round's tree up to NODES
nodes; fixed: NODES nodes every round). The session prices verify passes up to the widest tree (K up to
16 here, where the app stops at 8), so the cost model reads measured prices, not extrapolated ones.
Prints tokens/s, the ratio to target-only and tokens a round per config; ``--json F`` writes them.
Run it alone on the machine.

    python scripts/measure_trees.py [--prompts 8] [--tokens 96] [--trees policy:8:4,policy:16:4,policy:16:6,fixed:12:4]
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

import ears_core.serve.session as session_module
from ears_core import load_pair
from ears_core.policy.costs import describe
from ears_core.serve.session import MAX_TREE_NODES, RunConfig, Session

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = (("greedy", 0.0), ("standard", 0.9))


def parse_tree(spec: str) -> dict:
    mode, nodes, depth = spec.split(":")
    if mode not in ("policy", "fixed"):
        raise ValueError(f"tree config {spec!r}: the mode must be policy or fixed")
    return dict(draft_length=mode, draft_shape="tree", tree_budget=int(nodes), k=int(depth))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--trees", default="policy:8:4,policy:16:4,policy:16:6,fixed:12:4")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    configs = {spec: parse_tree(spec) for spec in a.trees.split(",")}
    session_module.MAX_K = MAX_TREE_NODES  # verify passes priced up to MAX_TREE_NODES + 1 tokens
    session = Session(load_pair())
    session.warm_up()
    print(describe(session.prices), flush=True)
    prompts = json.loads((ROOT / "assets" / "prompts.json").read_text())["prompts"][: a.prompts]
    result = {"machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}",
              "price_curve_start": describe(session.prices), "prompts": len(prompts), "tokens": a.tokens, "settings": {}}
    for rule, temp in SETTINGS:
        totals = {name: [0, 0.0, 0] for name in ["target-only", *configs]}  # tokens, seconds, rounds
        for i, p in enumerate(prompts):
            ids = session.encode(p["prompt"])
            for name in totals:
                cfg = RunConfig(rule=rule, params={}, temperature=temp, max_new_tokens=a.tokens, seed=i,
                                **configs.get(name, {}))
                run = session.baseline(ids, cfg) if name == "target-only" else session.speculative(ids, cfg)
                for _ in run:
                    pass
                s = run.stats()
                totals[name] = [totals[name][0] + s.new_tokens, totals[name][1] + s.decode_s, totals[name][2] + s.steps]
        base = totals["target-only"][0] / totals["target-only"][1]
        rows = {name: {"tokens_per_s": n / sec, "ratio": n / sec / base, "tokens_per_round": n / max(r, 1)}
                for name, (n, sec, r) in totals.items()}
        result["settings"][f"{rule} T={temp}"] = rows
        for name, row in rows.items():
            print(f"T = {temp} {name:16} {row['tokens_per_s']:6.1f} tokens/s {row['ratio']:5.2f}x "
                  f"{row['tokens_per_round']:.2f} a round", flush=True)
    result["price_curve_end"] = describe(session.prices)
    print(result["price_curve_end"])
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
