"""How often the embedded head's first draft stands with a wider draft vocabulary, and with its output rows in int4
or bfloat16: fixed K = 1, greedy, on the lean target (not a test; no timing, so it may run beside other jobs).

Terms
-----
draft vocabulary  the head's ``vocab_ids`` (draft/eagle.py): the tokens it can propose. The shipped head has
                  6,144; a wider one adds the next most frequent tokens of the draft data's answers
                  (``assets/draft_data/answers``), scored by the same rows of the target's output head. The
                  head is not retrained: its predicted feature is scored against more rows.
rows              the head's rows of the output head on the int4 kernel (the int4 variant, the default beside
                  the lean target) or in bfloat16 (``EARS_DRAFT_DTYPE=int4-layers``); its layers are int4 in both.

    python scripts/draft_vocab_widths.py [--prompts 12] [--tokens 64] [--widths 6144,8192,12288,16384,24576] [--out F.json]
"""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import torch

from ears_core import GreedyRule, generate, load_pair
from ears_core.draft.eagle import DraftHead, EagleDrafter

ROOT = Path(__file__).resolve().parent.parent


def token_order(vocab: int) -> list[int]:
    """Token ids, most frequent first in the draft data's answers."""
    counts = np.zeros(vocab, np.int64)
    for shard in sorted((ROOT / "assets" / "draft_data" / "answers").glob("*.npz")):
        counts += np.bincount(np.load(shard)["tokens"].astype(np.int64), minlength=vocab)[:vocab]
    return np.argsort(-counts, kind="stable").tolist()


def widened(head: DraftHead, order: list[int], width: int) -> DraftHead:
    """A copy of ``head`` whose draft vocabulary is its own plus the most frequent other tokens, ``width`` in all."""
    wide = copy.deepcopy(head)
    own = set(head.vocab_ids.tolist())
    extra = [t for t in order if t not in own][: max(0, width - len(own))]
    wide.vocab_ids = torch.tensor(sorted(own | set(extra)), dtype=torch.long)
    return wide


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--widths", default="6144,8192,12288,16384,24576")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    pair = load_pair()
    head = DraftHead.load(ROOT / "assets" / "embedded_draft", dtype=torch.bfloat16)
    order = token_order(pair.vocab_size)
    prompts = [p["prompt"] for p in json.loads((ROOT / "assets" / "prompts.json").read_text())["prompts"][: a.prompts]]
    rows = []
    for width in (int(w) for w in a.widths.split(",")):
        for int4_rows in (True, False):
            drafter = EagleDrafter(widened(head, order, width), pair.target, pair.vocab_size)
            drafter.quantize_kernels(rows=int4_rows)
            stood = drafted = 0
            for prompt in prompts:
                out = generate(pair.target, drafter, pair.encode(prompt), rule=GreedyRule(), temperature=0.0,
                               max_new_tokens=a.tokens, k=1)
                stood, drafted = stood + out.stats.accepted, drafted + out.stats.drafted
            rows.append({"width": len(drafter.vocab_ids), "rows": "int4" if int4_rows else "bfloat16",
                         "first_draft_stands": round(stood / max(drafted, 1), 4), "stood": stood, "drafted": drafted})
            print(rows[-1], flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"prompts": len(prompts), "tokens": a.tokens, "k": 1, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
