"""A saved draft head with a smaller output vocabulary: the N tokens of its trained vocabulary that occur
most often in the draft store's answers (end of sequence always kept). No training: the head predicts the
target's next feature, and the vocabulary only says which rows of the target's output head score it, so
the cut head drafts as before wherever the token it would draft stays in the vocabulary, and each draft
step multiplies fewer rows.

    python scripts/recut_vocab.py --draft assets/embedded_draft --vocab 3072 --out /tmp/head-3072
    python scripts/measure_speedup.py --dtypes bfloat16 --drafts auto,/tmp/head-3072   # does it pay?
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_data import DATA, answers_dir, shard_paths  # noqa: E402

VOCAB = 49152  # the embedded target's vocabulary
EOS = 2  # the embedded tokenizer's end of sequence (<|im_end|>)


def answer_counts(store: Path) -> torch.Tensor:
    """(V,) how often each token id occurs in the store's answers."""
    counts = np.zeros(VOCAB, dtype=np.int64)
    for path in shard_paths(answers_dir(store)):
        with np.load(path, allow_pickle=False) as z:
            counts += np.bincount(z["tokens"].astype(np.int64), minlength=VOCAB)
    return torch.from_numpy(counts)


def recut(draft: Path, n: int, out: Path, store: Path = DATA) -> dict:
    """Write ``draft`` with the ``n`` most frequent answer tokens as its vocabulary into ``out``."""
    state = load_file(str(draft / "head.safetensors"))
    old = state["vocab_ids"]
    if not 2 <= n < len(old):
        raise SystemExit(f"--vocab must be at least 2 and below the head's {len(old)} tokens, got {n}")
    counts = answer_counts(store)
    top = old[counts[old.long()].argsort(descending=True)[:n]].long()
    ids = torch.unique(torch.cat([top, torch.tensor([EOS])]))
    out.mkdir(parents=True, exist_ok=True)
    for name in ("head.json", "calibration.json"):
        if (draft / name).exists():
            shutil.copy(draft / name, out / name)
    state["vocab_ids"] = ids.to(old.dtype)
    save_file(state, str(out / "head.safetensors"))
    share = lambda v: round(float(counts[v.long()].sum() / counts.sum()), 4)  # noqa: E731
    return {"vocab": len(ids), "covers": share(ids), "was": len(old), "was_covers": share(old)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="assets/embedded_draft", type=Path)
    ap.add_argument("--vocab", type=int, required=True, help="tokens in the new vocabulary (end of sequence added)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    print(json.dumps(recut(a.draft, a.vocab, a.out)))


if __name__ == "__main__":
    main()
