"""The terminal demo: stream one answer coloured by how each token was decided, then the metrics
and the target-only speed on the same prompt.

    python -m ears_core.generate --prompt "Write a haiku about rain" --rule ears --beta 0.1

Colours (like llama.cpp's --color): accepted green, pardoned bold magenta, resampled yellow,
bonus cyan, target-only plain.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import torch

from .decoding import autoregressive, stream
from .drafters import NGramDrafter
from .metrics import GenerationStats
from .rules import rule_from_name

COLOURS = {"accepted": "\033[32m", "pardoned": "\033[1;35m", "resampled": "\033[33m", "bonus": "\033[36m", "target": ""}
RESET = "\033[0m"
DEFAULT_PROMPT = "Explain in three sentences why the sky is blue."


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ears_core.generate",
        description="Speculative decoding with EARS in the terminal: tokens coloured by kind "
        "(accepted green, pardoned magenta, resampled yellow, bonus cyan), then the metrics.",
    )
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message (the chat template is applied)")
    p.add_argument("--rule", default="ears", choices=["ears", "standard", "ordinary", "greedy", "ears-entropy", "typical"],
                   help="acceptance rule: ears (with --beta), standard/ordinary (lossless), greedy, ears-entropy (with --beta), typical (Medusa)")
    p.add_argument("--beta", type=float, default=0.1, help="EARS tolerance scale, >= 0 (0 = ordinary rule)")
    p.add_argument("--temperature", type=float, default=0.9, help=">= 0; 0 is greedy decoding")
    p.add_argument("--gamma", "-K", type=int, default=4, help="draft tokens per round (K), >= 1")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens to generate, >= 1")
    p.add_argument("--seed", type=int, default=0, help="seed of the counter-based random draws")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (draft and target alike)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus mass in (0, 1] (draft and target alike)")
    p.add_argument("--target", default="embedded", help="'embedded', a Hugging Face id or a local folder")
    p.add_argument("--draft", default="auto",
                   help="'auto' (the embedded draft if trained, else n-gram prompt lookup), 'ngram', "
                   "'embedded', a Hugging Face id or a local folder")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--no-chat", action="store_true", help="encode the prompt as plain text, without the chat template")
    p.add_argument("--no-baseline", action="store_true", help="skip the target-only run on the same prompt")
    p.add_argument("--no-color", action="store_true", help="plain text (also when NO_COLOR is set)")
    return p


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def print_stats(s: GenerationStats, base_tps: float | None, out=None) -> None:
    out = out or sys.stdout
    print("", file=out)
    print(f"rule                 {s.method}", file=out)
    print(f"tokens / rounds      {s.new_tokens} / {s.steps}", file=out)
    print(f"acceptance rate      {_fmt(s.acceptance_rate)}  (stood / drafted = {s.accepted} / {s.drafted})", file=out)
    print(f"mean accept length   {s.mean_accept_length:.2f} tokens per round", file=out)
    print(f"pardon rate          {_fmt(s.pardon_rate)}", file=out)
    print(f"mean distortion (TV) {s.mean_distortion:.4f} per token", file=out)
    print(f"speculative          {s.tokens_per_s:.1f} tokens/s", file=out)
    if base_tps:
        print(f"target-only          {base_tps:.1f} tokens/s  -> speedup {s.tokens_per_s / base_tps:.2f}x", file=out)
    if s.theory_speedup is not None:
        print(f"theory               E = {s.theory_tokens_per_step:.2f} tokens/round, S = {s.theory_speedup:.2f}x "
              f"(cost ratio c = {s.cost_ratio:.3f})", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .models import ModelLoadError, embedded_draft_available, encode_prompt, load_pair

    colour = not args.no_color and "NO_COLOR" not in os.environ and sys.stdout.isatty()
    try:
        rule = rule_from_name(args.rule, args.beta)
        draft_spec = args.draft
        if draft_spec == "auto":
            draft_spec = "embedded" if args.target == "embedded" and embedded_draft_available() else "ngram"
        pair = load_pair(args.target, None if draft_spec == "ngram" else draft_spec, device=args.device)
        draft = pair.draft if pair.draft is not None else NGramDrafter(pair.vocab_size)
        ids = encode_prompt(pair.tokenizer, args.prompt, chat=not args.no_chat, device=pair.device)
        kw = dict(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed,
                  top_k=args.top_k, top_p=args.top_p, tokenizer=pair.tokenizer, vocab_size=pair.vocab_size)
        gen = stream(pair.target, draft, ids, rule=rule, gamma=args.gamma, **kw)
    except (ValueError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[{pair.name}; draft: {'n-gram prompt lookup' if isinstance(draft, NGramDrafter) else draft_spec}; "
          f"{pair.device}]", file=sys.stderr)
    if colour:
        print(" ".join(f"{c}{k}{RESET}" for k, c in COLOURS.items() if c), file=sys.stderr)
    for ev in gen:
        text = ev.text
        print(f"{COLOURS[ev.kind]}{text}{RESET}" if colour and text else text, end="", flush=True)
    res = gen.result()
    base_tps = None
    if not args.no_baseline:
        base_tps = autoregressive(pair.target, ids, **kw).stats.tokens_per_s
    print_stats(res.stats, base_tps)
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
