"""Step 1 of the embedded draft: the target's own answers to the training prompts.

Batched sampling with left padding (much cheaper per token than batch-1 decoding on a CPU).
Writes one shard per batch to $EARS_CACHE/draft_data/answers-NNNN.json: for each prompt the
token ids of the chat-formatted prompt and of the answer, so an interrupted run keeps its shards
and a rerun skips them. 70% of answers are sampled at T = 0.9, 30% are greedy.

    python scripts/make_draft_data.py [--batch 24] [--max-new-tokens 160]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_prompts import training_prompts  # noqa: E402

from ears_core.models import cache_root, encode_prompt, load_pair  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--out", default=None, help="default: $EARS_CACHE/draft_data")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    out = Path(args.out) if args.out else cache_root() / "draft_data"
    out.mkdir(parents=True, exist_ok=True)
    pair = load_pair("embedded", device="cpu")
    tok, model = pair.tokenizer, pair.target
    eos = tok.eos_token_id
    prompts = training_prompts()
    t0, total = time.perf_counter(), 0
    for bi, start in enumerate(range(0, len(prompts), args.batch)):
        shard = out / f"answers-{bi:04d}.json"
        if shard.exists():
            continue
        batch = prompts[start : start + args.batch]
        ids = [encode_prompt(tok, p)[0].tolist() for p in batch]
        width = max(map(len, ids))
        inp = torch.tensor([[eos] * (width - len(x)) + x for x in ids])  # (B, W) left padded
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        greedy = bi % 10 >= 7
        gen = model.generate(inp, attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=not greedy,
                             temperature=0.9 if not greedy else None, top_p=None, top_k=None, pad_token_id=eos)
        rows = []
        for p, x, g in zip(batch, ids, gen[:, width:].tolist()):
            ans = g[: g.index(eos) + 1] if eos in g else g
            rows.append({"prompt": p, "prompt_ids": x, "answer_ids": ans, "greedy": greedy})
            total += len(ans)
        shard.write_text(json.dumps(rows))
        el = time.perf_counter() - t0
        print(f"shard {bi}: {len(rows)} answers, {total} tokens so far, {total / el:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
