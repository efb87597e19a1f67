"""Issue 16's first target as counts, not timings: tokens a round with a tree of N nodes against a
chain of K = N drafts, the same verify price (N + 1 tokens in each target pass), on held-out prompts.

Terms
-----
tokens a round   emitted tokens / rounds over all prompts (and seeds) of one setting: the mean
                 accepted length, bonus or resampled token included.
ratio            tree's tokens a round / the chain's, per budget N and setting.
setting          greedy at T = 0 (fixed siblings: the draft's N best), the ordinary rule at T = 0.9
                 and EARS beta = 0.1 at T = 0.9 (sampled siblings). At T = 0.9 the text differs
                 between configs, so several seeds are pooled there (``--seeds``).

Nothing here is timed, so it may run beside other work (not beside a timing: it takes the cores).

    python scripts/tree_counts.py [--prompts 30] [--budgets 8,16] [--tokens 64] [--seeds 2] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_prompts import held_out_prompts  # noqa: E402

from ears_core import EARSRule, GreedyRule, StandardRule, generate  # noqa: E402
from ears_core.report.bench_plan import spread  # noqa: E402
from ears_core.model.hub import encode_prompt  # noqa: E402
from ears_core.pair import load_pair  # noqa: E402
from ears_core.decode.api import tree_stream  # noqa: E402

SETTINGS = {"greedy T=0": (GreedyRule, {}, 0.0), "ordinary T=0.9": (StandardRule, {}, 0.9),
            "EARS 0.1 T=0.9": (EARSRule, {"beta": 0.1}, 0.9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--budgets", default="8,16", help="tree budgets N, each against a chain of K = N drafts")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=2, help="seeds pooled at T > 0 (T = 0 uses one)")
    ap.add_argument("--draft", default="auto")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    pair = load_pair("embedded", a.draft, device="cpu")
    chosen = [p["prompt"] for p in spread(held_out_prompts(), a.prompts)]  # the tasks in turn, as the bench
    budgets = [int(x) for x in a.budgets.split(",")]
    counts: dict[tuple[str, int, str], list[int]] = defaultdict(lambda: [0, 0])  # (setting, N, shape) -> tokens, rounds
    for i, text in enumerate(chosen):
        ids = encode_prompt(pair.tokenizer, text)
        for name, (make, params, temp) in SETTINGS.items():
            for seed in range(1 if temp == 0 else a.seeds):
                kw = dict(temperature=temp, max_new_tokens=a.tokens, seed=seed, vocab_size=pair.vocab_size)
                for n in budgets:
                    chain = generate(pair.target, pair.new_drafter(), ids, rule=make(**params), k=n, **kw)
                    tree = tree_stream(pair.target, pair.new_drafter(), ids, rule=make(**params), budget=n, depth=n,
                                       **kw).result()
                    for shape, r in (("chain", chain), ("tree", tree)):
                        c = counts[(name, n, shape)]
                        c[0] += r.stats.new_tokens
                        c[1] += r.stats.steps
        print(f"[{i + 1}/{len(chosen)}]", flush=True)
    report = {}
    for name in SETTINGS:
        for n in budgets:
            ch, tr = counts[(name, n, "chain")], counts[(name, n, "tree")]
            chain_tpr, tree_tpr = ch[0] / max(ch[1], 1), tr[0] / max(tr[1], 1)
            report[f"{name} N={n}"] = {"chain_tokens_a_round": round(chain_tpr, 3), "tree_tokens_a_round": round(tree_tpr, 3),
                                       "ratio": round(tree_tpr / chain_tpr, 3), "chain_rounds": ch[1], "tree_rounds": tr[1]}
            print(f"{name:>16} N={n:>2}: tree {tree_tpr:.3f} / chain {chain_tpr:.3f} = {tree_tpr / chain_tpr:.3f}x")
    report["settings"] = {"prompts": len(chosen), "budgets": budgets, "tokens": a.tokens, "seeds": a.seeds, "draft": a.draft}
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
