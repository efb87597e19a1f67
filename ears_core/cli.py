"""The terminal demo: stream one answer coloured by how each token was decided, then the metrics
and the target-only speed on the same prompt.

    python -m ears_core.generate --prompt "Write a haiku about rain" --rule ears --beta 0.1
    python -m ears_core.generate --tree --tree-budget 8 -K 4     # a tree of drafts per round
    python -m ears_core.generate --chain                          # a chain (default: auto, see session)

Colours (like llama.cpp's --color): accepted green, pardoned bold magenta, resampled yellow,
bonus cyan, target-only plain. The rules and their parameter flags come from the registry in
``rules`` (``RULES``); the pair, the run and the summary from ``session``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

import torch

from ears_core.deprecated import add_renamed_option
from ears_core.rules import RULES
from ears_core.serve.session import DRAFT_LENGTHS, DRAFT_SHAPES, MAX_K, MAX_TREE_NODES, RunConfig, Session
from ears_core.serve.summary import summary_rows, summary_text

COLOURS = {"accepted": "\033[32m", "pardoned": "\033[1;35m", "resampled": "\033[33m", "bonus": "\033[36m", "target": ""}
RESET = "\033[0m"
DEFAULT_PROMPT = "Explain in three sentences why the sky is blue."


def rule_params() -> dict[str, tuple[float, str]]:
    """Every parameter any registered rule takes: name -> (default of its first rule, help)."""
    out: dict[str, tuple[float, str]] = {}
    for spec in RULES.values():
        for p in spec.params:
            out.setdefault(p.name, (p.default, f"{p.help} ({spec.name}; default {p.default:g}; the app offers "
                                               f"{p.low:g}-{p.high:g})"))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ears_core.generate",
        description="Speculative decoding with EARS in the terminal: tokens coloured by kind "
        "(accepted green, pardoned magenta, resampled yellow, bonus cyan), then the metrics.",
    )
    names = [n for spec in RULES.values() for n in (spec.name, *spec.aliases)]
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message (the chat template is applied)")
    p.add_argument("--rule", default="ears", choices=names,
                   help="acceptance rule: " + "; ".join(f"{s.name}: {s.label}" for s in RULES.values()))
    for name, (_, text) in rule_params().items():
        p.add_argument(f"--{name}", type=float, default=None, help=text)
    p.add_argument("--temperature", type=float, default=0.9, help=">= 0; 0 is greedy decoding")
    p.add_argument("--k", "-K", type=int, default=4, help=f"draft tokens per round at most (K), 1-{MAX_K}")
    add_renamed_option(p, "--gamma", "--k", "k", int)
    p.add_argument("--draft-length", choices=DRAFT_LENGTHS, default="policy",
                   help="policy: each round drafts what this machine's measured prices say pays (0..K); "
                   "fixed: always K; threshold: stop when the draft's confidence falls below 0.35")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--shape", choices=DRAFT_SHAPES, default="auto",
                       help="tree: draft a tree each round (depth K, verified in one target pass); with --draft-length "
                       "policy the cost model sizes each tree, with fixed it has --tree-budget nodes; chain: K drafts "
                       "in a row; auto (default): a tree when the draft length is policy, the draft can branch and the "
                       "rule is lossless (greedy at T = 0, the ordinary rule at T > 0), else a chain")
    shape.add_argument("--tree", action="store_true", help="the same as --shape tree")
    shape.add_argument("--chain", action="store_true", help="the same as --shape chain")
    p.add_argument("--tree-budget", type=int, default=8, help="a tree's nodes per round (at most: policy; exactly: "
                   f"fixed), 1-{MAX_TREE_NODES}")
    p.add_argument("--tree-width", type=int, default=None, help="a tree node's children at most (default: no limit)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens to generate, >= 1")
    p.add_argument("--seed", type=int, default=0, help="seed of the counter-based random draws")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (draft and target alike)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus mass in (0, 1] (draft and target alike)")
    p.add_argument("--target", default="embedded", help="'embedded', a Hugging Face id or a local folder")
    p.add_argument("--draft", default="auto",
                   help="'auto' (the target's default: the embedded head for the embedded target, a preset's "
                   "draft, else n-gram), 'ngram', 'embedded', a Hugging Face id or a local folder")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--no-chat", action="store_true", help="encode the prompt as plain text, without the chat template")
    p.add_argument("--no-baseline", action="store_true", help="skip the target-only run on the same prompt")
    p.add_argument("--no-color", action="store_true", help="plain text (also when NO_COLOR is set)")
    return p


def config_from_args(args: argparse.Namespace) -> RunConfig:
    params = {name: getattr(args, name) for name in rule_params() if getattr(args, name) is not None}
    return RunConfig(rule=args.rule, params=params, temperature=args.temperature, k=args.k,
                     max_new_tokens=args.max_new_tokens, seed=args.seed, top_k=args.top_k, top_p=args.top_p,
                     draft_length=args.draft_length, draft_shape="tree" if args.tree else "chain" if args.chain else args.shape,
                     tree_budget=args.tree_budget, tree_width=args.tree_width).validate()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ears_core.model.loading.hub import ModelLoadError
    from ears_core.pair import load_pair

    colour = not args.no_color and "NO_COLOR" not in os.environ and sys.stdout.isatty()
    try:
        cfg = config_from_args(args)
        cfg.rule_and_temperature()  # a bad parameter fails before the models load
        session = Session(load_pair(args.target, args.draft, device=args.device))
        since = time.perf_counter()  # the request's wall clock (a first-use price measurement is on it)
        cfg = session.resolved(cfg)  # "auto" -> tree or chain, printed below
        ids = session.encode(args.prompt, chat=not args.no_chat)
        run = session.speculative(ids, cfg, since=since)
    except (ValueError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    shape = f"; a tree of depth {cfg.k}, {cfg.tree_budget} nodes" if cfg.draft_shape == "tree" else ""
    print(f"[{session.pair.name}; {session.pair.device}; draft length: {cfg.draft_length}{shape}]", file=sys.stderr)
    if cfg.draft_length == "policy":
        print(f"[this machine: {session.profile_text()}]", file=sys.stderr)
    if colour:
        print(" ".join(f"{c}{k}{RESET}" for k, c in COLOURS.items() if c), file=sys.stderr)
    with torch.inference_mode():
        for ev in run:
            print(f"{COLOURS[ev.kind]}{ev.text}{RESET}" if colour and ev.text else ev.text, end="", flush=True)
        result = run.gen.result()
        stats = result.stats
        base_tps = base_wall = None
        if not args.no_baseline:
            base = session.baseline(ids, cfg)
            for _ in base:
                pass
            base_tps, base_wall = base.gen.stats().tokens_per_s, base.gen.stats().wall_tokens_per_s
    print("\n\n" + summary_text(summary_rows(stats, base_tps, shape=cfg.draft_shape, baseline_wall_tps=base_wall,
                                                   stop=result.stop)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
