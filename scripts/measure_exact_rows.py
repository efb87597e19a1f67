"""What exact rows cost and what they buy on this CPU (model/kernels/exact_rows.py; a measurement, not a test).

Loads the embedded target in bfloat16 (exact attention and the row cap, as ``load_pair`` sets them), then,
on the same weights and kernels, with PyTorch's own attention (SDPA) and with exact attention in turn:
  - whether a pass over w tokens gives bit for bit the logits of w one-token passes (w = 2, 9, 17, 40);
  - the price of a pass over m = 1..9 new tokens on a cache of each ``--contexts`` length, interleaved
    between the two attentions (the median of ``--repeats``), as ms for m = 1 and steps for the rest.

    python scripts/measure_exact_rows.py [--contexts 128,400] [--repeats 15] [--threads 2]

Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from transformers import DynamicCache

from ears_core import load_pair
from ears_core.model.kernels.exact_rows import CHECKED_WIDTHS, EXACT_ATTENTION, rows_agree

WIDTHS = range(1, 10)


def _prices(model: torch.nn.Module, ctx: int, repeats: int, attentions: list[str]) -> dict[str, list[float]]:
    """Median ms of a pass over m new tokens on a ``ctx``-token cache, per attention, interleaved."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 5000, (1, ctx + max(WIDTHS)), generator=gen)  # (1, ctx + 9)
    caches, times = {}, {a: {m: [] for m in WIDTHS} for a in attentions}
    with torch.inference_mode():
        for attn in attentions:
            model.set_attn_implementation(attn)
            caches[attn] = DynamicCache(config=model.config)
            model(ids[:, :ctx], past_key_values=caches[attn], use_cache=True)
        for _ in range(repeats):
            for attn in attentions:
                model.set_attn_implementation(attn)
                for m in WIDTHS:
                    t0 = time.perf_counter()
                    model(ids[:, ctx:ctx + m], past_key_values=caches[attn], use_cache=True, logits_to_keep=m)
                    times[attn][m].append(time.perf_counter() - t0)
                    caches[attn].crop(-m)
    return {a: [statistics.median(times[a][m][2:]) * 1000 for m in WIDTHS] for a in attentions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="128,400")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    pair = load_pair("embedded", None, dtype="bfloat16")
    model = pair.target
    print(f"{platform.processor() or platform.machine()}, {a.threads} threads, torch {torch.__version__}; "
          f"rows exact at load: {pair.rows_exact}, row cap {getattr(model, 'ears_row_cap', None)}")
    attentions = ["sdpa", EXACT_ATTENTION]
    for attn in attentions:
        model.set_attn_implementation(attn)
        agree = {w: rows_agree(model, (w,)) for w in CHECKED_WIDTHS}
        print(f"{attn:>13}: rows agree with one-token passes for w = "
              + ", ".join(f"{w}: {'yes' if ok else 'no'}" for w, ok in agree.items()))
    for ctx in (int(c) for c in a.contexts.split(",")):
        for attn, ms in _prices(model, ctx, a.repeats, attentions).items():
            print(f"{attn:>13}, {ctx}-token cache: step {ms[0]:.1f} ms, V(m) in steps for m = 1..9: "
                  + " ".join(f"{v / ms[0]:.2f}" for v in ms))
    model.set_attn_implementation(EXACT_ATTENTION)


if __name__ == "__main__":
    main()
