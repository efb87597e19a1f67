"""Step 1 of the embedded draft: the target's own answers to the training prompts, with the
target's last hidden state (after the final norm) at every position, captured while sampling.

A hand-written batched sampling loop (left padding, explicit position ids) so that the features
come for free with generation instead of a second teacher-forced pass: on 2 CPU cores a batch of
32 runs at ~80 tokens/s. One shard per batch in $EARS_CACHE/draft_data/shard-NNNN.pt holding,
per answer, the token ids (prompt + answer), the prompt length and the features (float16).
An interrupted run keeps its shards; a rerun skips them. 70% sampled at T = 0.9, 30% greedy.

    python scripts/make_draft_data.py [--batch 32] [--max-new-tokens 128] [--minutes 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_prompts import training_prompts  # noqa: E402

from ears_core.model.embedded import cache_root  # noqa: E402
from ears_core.model.hub import encode_prompt  # noqa: E402
from ears_core.pair import load_pair  # noqa: E402
from ears_core.sampling import SamplingConfig, logits_to_probs  # noqa: E402


@torch.inference_mode()
def sample_batch(model, prompts_ids: list[list[int]], eos: int, max_new: int, temperature: float, gen: torch.Generator):
    b, width = len(prompts_ids), max(map(len, prompts_ids))
    inp = torch.tensor([[eos] * (width - len(x)) + x for x in prompts_ids])  # (B, W) left padded
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts_ids])  # (B, W)
    pos = (mask.cumsum(1) - 1).clamp(min=0)  # (B, W)
    cache = DynamicCache(config=model.config)
    out = model(inp, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                output_hidden_states=True, logits_to_keep=1)
    feats = [out.hidden_states[-1].half()]  # (B, W, d)
    cfg = SamplingConfig(temperature)
    toks, done = [], torch.zeros(b, dtype=torch.bool)
    next_pos = pos[:, -1:] + 1  # (B, 1)
    for _ in range(max_new):
        probs = logits_to_probs(out.logits[:, -1], cfg)  # (B, V)
        tok = torch.multinomial(probs, 1, generator=gen) if temperature > 0 else probs.argmax(-1, keepdim=True)
        tok = torch.where(done.unsqueeze(1), torch.full_like(tok, eos), tok)  # (B, 1)
        toks.append(tok)
        done |= tok[:, 0] == eos
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype)], dim=1)
        out = model(tok, attention_mask=mask, position_ids=next_pos, past_key_values=cache, use_cache=True,
                    output_hidden_states=True)
        feats.append(out.hidden_states[-1].half())  # (B, 1, d): the feature at the token just fed
        next_pos = next_pos + 1
    gen_toks = torch.cat(toks, dim=1)  # (B, N)
    allf = torch.cat(feats, dim=1)  # (B, W + N - 1, d)
    rows = []
    for i, x in enumerate(prompts_ids):
        ans = gen_toks[i].tolist()
        ans = ans[: ans.index(eos) + 1] if eos in ans else ans
        seq = x + ans
        f = allf[i, width - len(x) : width - len(x) + len(seq) - 1]  # features of all but the last token
        rows.append({"ids": torch.tensor(seq, dtype=torch.int32), "prompt_len": len(x), "feats": f.clone()})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--minutes", type=float, default=20.0, help="stop starting new batches after this long")
    ap.add_argument("--out", default=None, help="default: $EARS_CACHE/draft_data")
    args = ap.parse_args()
    out = Path(args.out) if args.out else cache_root() / "draft_data"
    out.mkdir(parents=True, exist_ok=True)
    pair = load_pair("embedded", device="cpu")
    tok, model = pair.tokenizer, pair.target
    prompts = training_prompts()
    t0, total = time.perf_counter(), 0
    for bi, start in enumerate(range(0, len(prompts), args.batch)):
        shard = out / f"shard-{bi:04d}.pt"
        if shard.exists():
            continue
        if time.perf_counter() - t0 > args.minutes * 60:
            break
        batch = prompts[start : start + args.batch]
        temperature = 0.0 if bi % 10 >= 7 else 0.9
        gen = torch.Generator().manual_seed(bi)
        rows = sample_batch(model, [encode_prompt(tok, p)[0].tolist() for p in batch], tok.eos_token_id,
                            args.max_new_tokens, temperature, gen)
        torch.save({"rows": rows, "temperature": temperature, "prompts": batch}, shard)
        total += sum(len(r["ids"]) - r["prompt_len"] for r in rows)
        el = time.perf_counter() - t0
        print(f"shard {bi}: {len(rows)} answers, {total} answer tokens, {total / el:.0f} tokens/s, {el / 60:.1f} min",
              flush=True)


if __name__ == "__main__":
    main()
