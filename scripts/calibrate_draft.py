"""The embedded head's calibration: its confidence before a draw -> the chance the draft stands.

Runs the embedded pair with a fixed K on the draft data's validation prompts (the rows of
``assets/draft_data/prompts.jsonl`` whose index is a multiple of ``--val-mod``, which
scripts/train_draft.py never trains on; never the held-out ``assets/prompts.json``), records (confidence, stood) for every verified draft
position, and writes ``assets/embedded_draft/calibration.json``: per sampling mode ("greedy" for
T = 0, "sampled" for T > 0) the counts per confidence bin, which the draft-length policy starts from
(``costs.Calibration``) and keeps learning: per draft depth 1 .. k (``costs.DepthCalibration``: a
depth-d draft is counted only when drafts 1 .. d-1 stood, so it measures the conditional acceptance
E(k) multiplies) for the chain, and pooled over depths 1-2. A second pass drafts fixed trees
(``--tree-nodes`` nodes, depth k) on the same prompts and records, for every later sibling (rank
>= 1) whose parent stood, its slot probability and whether it stood: the "siblings" table
(depth 1, depths >= 2) that the tree budget reads beside the rank-0 tables
(``tree_policy.TreeCalibration``). Also prints a reliability table (confidence bin vs observed
acceptance) per depth for the card.

    python scripts/calibrate_draft.py [--prompts 32] [--tokens 48] [--k 4] [--tree-nodes 8]
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from ears_core import load_pair
from ears_core.policy.costs import Calibration, DepthCalibration, DraftPolicy, PriceCurve
from ears_core.decode.api import stream
from ears_core.serve.session import RunConfig, Session
from ears_core.decode.api import tree_stream
from ears_core.policy.tree_budget import TreeBudget, TreeCalibration

ROOT = Path(__file__).resolve().parent.parent
BINS = 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tree-nodes", type=int, default=8, help="nodes of the trees the siblings table is measured on")
    ap.add_argument("--val-mod", type=int, default=20, help="prompts with index %% this == 0: train_draft's validation set")
    ap.add_argument("--out", type=Path, default=ROOT / "assets" / "embedded_draft" / "calibration.json")
    a = ap.parse_args()
    rows = [json.loads(line) for line in (ROOT / "assets" / "draft_data" / "prompts.jsonl").read_text().splitlines()]
    rows = [r for i, r in enumerate(rows) if i % a.val_mod == 0]  # never trained on
    prompts = [r["prompt"] for r in random.Random(0).sample(rows, a.prompts)]
    session = Session(load_pair())
    out: dict[str, dict] = {}
    for mode, temperature in (("greedy", 0.0), ("sampled", 0.9)):
        cal = DepthCalibration([Calibration(bins=BINS, prior_weight=0.0) for _ in range(a.k)])  # the loop records
        # always K drafts, each position's confidence recorded: a policy that always keeps going
        policy = DraftPolicy(PriceCurve([1.0] * (a.k + 1), 0.0), a.k, fixed=True)
        for i, prompt in enumerate(prompts):
            cfg = RunConfig(rule="standard", params={}, temperature=temperature, k=a.k, max_new_tokens=a.tokens,
                            seed=i)
            rule, t = cfg.rule_and_temperature()
            gen = stream(session.pair.target, session.pair.new_drafter(), session.encode(prompt), rule=rule,
                         k=a.k, tokenizer=session.pair.tokenizer, vocab_size=session.pair.vocab_size,
                         policy=policy, calibration=cal, **cfg.sampling_kwargs(t))
            with torch.inference_mode():
                gen.result()
        pooled = [[sum(t.stood[b] for t in cal.tables[:2]) for b in range(BINS)],
                  [sum(t.seen[b] for t in cal.tables[:2]) for b in range(BINS)]]
        sib = siblings_table(session, prompts, temperature, a)
        out[mode] = {"bins": BINS, "stood": pooled[0], "seen": pooled[1],
                     "depths": [{"stood": t.stood, "seen": t.seen} for t in cal.tables],
                     "siblings": {"bins": BINS, "depths": [{"stood": t.stood, "seen": t.seen} for t in sib.tables]}}
        print(f"\n{mode} (T = {temperature}): confidence bin, then drafts seen / acceptance at depth 1 .. {a.k}")
        print_table(cal.tables)
        print("  all        " + "  ".join(f"{int(sum(t.seen)):5d} {sum(t.stood) / max(1, sum(t.seen)):.3f}"
                                           for t in cal.tables))
        print(f"  siblings (rank >= 1, parent stood), {a.tree_nodes}-node trees: depth 1 / depths >= 2")
        print_table(sib.tables)
    choice = getattr(session.pair.draft, "kernel_choice", None)  # the head's variant as loaded (head_kernels.py)
    out["made_with"] = dict(prompts=a.prompts, tokens=a.tokens, k=a.k, tree_nodes=a.tree_nodes,
                            source=f"assets/draft_data/prompts.jsonl, index % {a.val_mod} == 0",
                            target=getattr(session.pair.target, "ears_kernels", "") or type(session.pair.target).__name__,
                            draft_variant=choice.variant.label if choice is not None else "as loaded")
    a.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


def print_table(tables: list[Calibration]) -> None:
    """One row per confidence bin: drafts seen and the acceptance observed, one column per table."""
    for b in range(BINS):
        cells = [f"{int(t.seen[b]):5d} {t.stood[b] / t.seen[b]:.3f}" if t.seen[b] else f"{0:5d}   -  " for t in tables]
        print(f"  [{b / BINS:.1f}, {(b + 1) / BINS:.1f})  " + "  ".join(cells))


def siblings_table(session: Session, prompts: list[str], temperature: float, a: argparse.Namespace) -> DepthCalibration:
    """Fixed trees of ``a.tree_nodes`` nodes on ``prompts``: every later sibling whose parent stood,
    as ``TreeBudget.observe_round`` learns it (depth 1 and depths >= 2)."""
    sib = DepthCalibration([Calibration(bins=BINS, prior_weight=0.0) for _ in range(2)])
    first = DepthCalibration([Calibration(bins=BINS, prior_weight=0.0) for _ in range(a.k)])  # not kept
    learner = TreeBudget(PriceCurve([1.0], 0.0), a.tree_nodes, TreeCalibration(first, sib))
    for i, prompt in enumerate(prompts):
        cfg = RunConfig(rule="standard", params={}, temperature=temperature, k=a.k, max_new_tokens=a.tokens, seed=i)
        rule, t = cfg.rule_and_temperature()
        gen = tree_stream(session.pair.target, session.pair.new_drafter(), session.encode(prompt), rule=rule,
                          budget=a.tree_nodes, depth=a.k, tokenizer=session.pair.tokenizer,
                          vocab_size=session.pair.vocab_size, **cfg.sampling_kwargs(t))
        with torch.inference_mode():
            gen.result()
        for record in gen.trees:
            learner.observe_round(record)
    return sib


if __name__ == "__main__":
    main()
