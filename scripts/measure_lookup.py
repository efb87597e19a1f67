"""How much an n-gram lookup drafter could add on the held-out prompts (a measurement, not a test).

Decodes each held-out prompt of assets/prompts.json greedily with the target alone, then replays the text
round by round as prompt lookup would draft it (``ngram_lookup``, ``NGramDrafter``'s rule: the latest
earlier occurrence of the longest tail of n = ``--max-ngram`` .. ``--min-ngram`` committed tokens, and the
up to k tokens that followed it). A round emits the drafts that match the target's own next tokens plus one. Reported per
(minimum n, k): the share of rounds with a match, and tokens a round over those rounds and over all.
A hybrid drafter that takes a lookup's drafts only where it matches can gain at most the matched rounds'
tokens over what the head keeps there.

    python scripts/measure_lookup.py [--prompts 16] [--tokens 96] [--max-ngram 4]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ears_core import autoregressive, load_pair
from ears_core.draft.drafters import ngram_lookup

ROOT = Path(__file__).resolve().parent.parent


def replay(prompt: list[int], text: list[int], k: int, max_n: int, min_n: int) -> tuple[int, int, int, int]:
    """(rounds, tokens, rounds with a match, tokens in those rounds) for greedy ``text`` after ``prompt``."""
    seq, t = prompt + text, len(prompt)
    rounds = tokens = hit_rounds = hit_tokens = 0
    while t < len(seq):
        drafts, _ = ngram_lookup(seq[:t], k, max_n, min_n)
        n = 0
        while n < len(drafts) and t + n < len(seq) and drafts[n] == seq[t + n]:
            n += 1
        rounds, tokens, t = rounds + 1, tokens + n + 1, t + n + 1
        if drafts:
            hit_rounds, hit_tokens = hit_rounds + 1, hit_tokens + n + 1
    return rounds, tokens, hit_rounds, hit_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--max-ngram", type=int, default=4)
    a = ap.parse_args()
    pair = load_pair("embedded", None)
    texts = []
    for p in json.loads((ROOT / "assets" / "prompts.json").read_text())["prompts"][: a.prompts]:
        ids = pair.encode(p["prompt"])
        out = autoregressive(pair.target, ids, temperature=0.0, max_new_tokens=a.tokens, vocab_size=pair.vocab_size)
        texts.append((ids[0].tolist(), out.token_ids))
    print(f"{len(texts)} held-out prompts x {a.tokens} greedy tokens, target {pair.dtype}, torch {torch.__version__}")
    for min_n in range(1, a.max_ngram):
        for k in (4, 8):
            r, t, hr, ht = (sum(x) for x in zip(*(replay(p, s, k, a.max_ngram, min_n) for p, s in texts)))
            print(f"n >= {min_n}, k = {k}: a match in {hr / r:.0%} of rounds, {ht / max(hr, 1):.2f} tokens a round "
                  f"there, {t / r:.2f} over all rounds")


if __name__ == "__main__":
    main()
