"""Step 3 of the embedded draft: held-out acceptance and speed on this machine.

For each held-out prompt (assets/prompts.json, never used in training) it runs, interleaved:
target-only decoding, and speculative decoding with the embedded draft at T = 0 (greedy rule)
and T = 0.9 (ordinary rule, EARS beta = 0.1). Acceptance is pooled over prompts (stood /
drafted); speed is total tokens / total decode time per method, as a ratio to target-only at the
same temperature. Greedy speculative output is checked against target-only greedy output.

    python scripts/eval_draft.py [--prompts 12] [--max-new-tokens 64] [--k 4] [--json out.json]
    python scripts/eval_draft.py --draft /tmp/head-500k --no-speed     # a trained head, before shipping it

Reported per speculative method: acceptance (stood / drafted), first-draft acceptance (rounds
whose first draft stood / rounds that drafted), mean tokens per round, and with speed on, tokens/s
against target-only (run alone on the machine for that); first-draft acceptance and tokens per round
are also given per task type (`by_task`: creative, qa, math), to show which kind of text drafts worst.
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

from ears_core import EARSRule, GreedyRule, StandardRule, autoregressive, generate  # noqa: E402
from ears_core.model.loading.hub import encode_prompt  # noqa: E402
from ears_core.deprecated import add_renamed_option  # noqa: E402
from ears_core.pair import load_pair  # noqa: E402


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12, help="how many held-out prompts (spread over the tasks)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", "-K", type=int, default=4, help="drafts per round at most (K)")
    add_renamed_option(ap, "--gamma", "--k", "k", int)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (T = 0.9 texts differ by seed: "
                    "average two or more seeds to compare heads there)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--draft", default="auto", help="draft spec: 'auto' (the shipped head) or a folder holding a head")
    ap.add_argument("--quick", action="store_true", help="only greedy at T=0 and the ordinary rule at T=0.9 "
                    "(implies --no-speed): the saturation curve's measure")
    ap.add_argument("--no-speed", action="store_true", help="skip target-only at T=0.9 (acceptance figures only; "
                    "target-only at T = 0 still runs, for the greedy check)")
    return ap.parse_args()


def add_run(t: dict[str, float], r) -> None:
    """Add one generation's counts to a method's totals ``t``."""
    s = r.stats
    t["tokens"] += s.new_tokens
    t["seconds"] += s.decode_s
    t["drafted"] += s.drafted
    t["stood"] += s.accepted
    t["pardoned"] += s.pardoned
    t["distortion"] += s.total_distortion
    t["draft_ms"] += s.draft_ms
    t["target_ms"] += s.target_ms
    t["steps"] += s.steps
    t["rounds_drafting"] += sum(1 for st in r.steps if st.drafted > 0)
    t["first_stood"] += sum(1 for st in r.steps if st.drafted > 0 and st.accepted > 0)


def add_task_run(pt: dict[str, float], r) -> None:
    """The same counts per task type: which kind of text the head drafts worst."""
    pt["rounds_drafting"] += sum(1 for st in r.steps if st.drafted > 0)
    pt["first_stood"] += sum(1 for st in r.steps if st.drafted > 0 and st.accepted > 0)
    pt["tokens"] += r.stats.new_tokens
    pt["steps"] += r.stats.steps


def report_row(t: dict[str, float], base: dict[str, float] | None, by_task: dict | None) -> dict:
    """A method's figures from its totals; ``base``: the target-only totals at its temperature."""
    tps = t["tokens"] / t["seconds"]
    row = {"tokens_per_s": round(tps, 2)}
    if base:
        row["ratio_to_target_only"] = round(tps / (base["tokens"] / base["seconds"]), 3)
    if t["drafted"]:
        row.update(acceptance=round(t["stood"] / t["drafted"], 3),
                   first_draft_acceptance=round(t["first_stood"] / max(1, t["rounds_drafting"]), 3),
                   pardon_rate=round(t["pardoned"] / t["drafted"], 4),
                   mean_accept_length=round(t["tokens"] / t["steps"], 3),
                   mean_distortion=round(t["distortion"] / t["tokens"], 4),
                   cost_ratio=round((t["draft_ms"] / t["drafted"]) / (t["target_ms"] / t["steps"]), 4))
    if by_task is not None:
        row["by_task"] = {task: {"first_draft_acceptance": round(c["first_stood"] / max(1, c["rounds_drafting"]), 3),
                                 "mean_accept_length": round(c["tokens"] / max(1, c["steps"]), 3)}
                          for task, c in sorted(by_task.items())}
    return row


def main() -> None:
    args = parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(2)
    pair = load_pair("embedded", args.draft, device="cpu")
    prompts = held_out_prompts()
    by_task = defaultdict(list)
    for p in prompts:
        by_task[p["task"]].append(p["prompt"])
    chosen = [x for group in zip(*by_task.values()) for x in group][: args.prompts]
    kw = dict(max_new_tokens=args.max_new_tokens, vocab_size=pair.vocab_size, seed=args.seed)
    methods = {
        "target T=0": (None, 0.0), "greedy spec T=0": (GreedyRule(), 0.0),
        "target T=0.9": (None, 0.9), "ordinary spec T=0.9": (StandardRule(), 0.9), "EARS 0.1 T=0.9": (EARSRule(0.1), 0.9),
    }
    if args.no_speed:
        del methods["target T=0.9"]
    if args.quick:  # the draft's quality only: greedy and the ordinary rule
        for name in ("target T=0.9", "EARS 0.1 T=0.9"):
            methods.pop(name, None)
    tot = {m: defaultdict(float) for m in methods}
    per_task = {m: defaultdict(lambda: defaultdict(float)) for m in methods if methods[m][0] is not None}
    autoregressive(pair.target, encode_prompt(pair.tokenizer, "Hello"), temperature=0, **kw)  # warm-up
    mismatches = 0
    task_of = {p["prompt"]: p["task"] for p in prompts}
    for i, text in enumerate(chosen):
        ids = encode_prompt(pair.tokenizer, text)
        outs = {}
        for name, (rule, temp) in methods.items():
            if rule is None:
                r = autoregressive(pair.target, ids, temperature=temp, **kw)
            else:
                r = generate(pair.target, pair.draft.fresh(), ids, rule=rule, k=args.k, temperature=temp, **kw)
            outs[name] = r
            add_run(tot[name], r)
            if name in per_task:
                add_task_run(per_task[name][task_of[text]], r)
        mismatches += outs["greedy spec T=0"].token_ids != outs["target T=0"].token_ids
        print(f"[{i + 1}/{len(chosen)}] greedy acceptance so far "
              f"{tot['greedy spec T=0']['stood'] / max(1, tot['greedy spec T=0']['drafted']):.3f}", flush=True)
    report = {}
    for name, t in tot.items():
        base = tot.get("target T=0" if name.endswith("T=0") else "target T=0.9")
        row = report_row(t, base, per_task[name] if name in per_task else None)
        report[name] = row
        print(f"{name:22s} {row}")
    report["greedy_mismatches"] = mismatches
    report["prompts"] = len(chosen)
    report["draft"] = args.draft
    report["settings"] = {"k": args.k, "max_new_tokens": args.max_new_tokens, "seed": args.seed}
    print(f"greedy speculative == target greedy on {len(chosen) - mismatches}/{len(chosen)} prompts")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
