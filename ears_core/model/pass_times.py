"""How long a target's forward pass over m new tokens takes on this machine: what the price curve
(policy/costs.py) and the kernel choice (packed_linear.py) are measured from.

Terms
-----
pass over m   one forward of m new tokens on a KV cache of ``cache_len`` random tokens, keeping the
              logits of all m (a verify pass over m - 1 drafts and the token before them).
fastest       each m is timed ``repeats`` times, interleaved over m after one warm-up round, and the
              fastest kept: another job on the cores only ever adds time.
piece         ``piece()`` (optional) gives a context manager that each forward pass runs in: a measurement
              made in the background runs pass by pass and stops where ``piece()`` raises
              (serve/between.py). The exception goes to the caller and nothing is returned.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import torch

__all__ = ["measure_pass_ms"]


@torch.inference_mode()
def measure_pass_ms(target: torch.nn.Module, *, max_m: int = 9, cache_len: int = 64, repeats: int = 5,
                    vocab: int | None = None, piece: Callable[[], Any] | None = None) -> list[float]:
    """[V(1), ..., V(max_m)]: the fastest pass of ``target`` over m = 1..max_m new tokens, in ms, each
    pass inside ``piece()`` when given (module terms)."""
    from transformers import DynamicCache

    from ears_core.model.attention import avoid_replanning_attention
    from ears_core.timing import StepClock

    piece = piece or nullcontext
    dev = next(target.parameters()).device
    avoid_replanning_attention(dev)  # priced with the kernels the decode loop runs
    v = vocab or int(target.config.get_text_config().vocab_size)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, v, (1, cache_len), generator=g).to(dev)
    new = torch.randint(0, v, (1, max_m), generator=g).to(dev)
    cache = DynamicCache(config=target.config)
    with piece():
        target(ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
    clock = StepClock(dev)
    times: dict[int, list[float]] = {m: [] for m in range(1, max_m + 1)}
    for r in range(repeats + 1):
        for m in range(1, max_m + 1):
            with piece():
                t0 = clock.mark()
                target(new[:, :m], past_key_values=cache, use_cache=True, logits_to_keep=m)
                t1 = clock.mark()
            cache.crop(-m)
            if r > 0:  # the first pass over every m is the warm-up
                times[m].append(clock.ms(t0, t1))
    # Kept as measured, even where a longer pass is cheaper than a shorter one: CPU matmul kernels
    # change with the number of rows (docs/measurements.md, price curves), and the policy must see
    # where a 4-draft round is cheaper than a 2-draft one. (Forcing the curve up to be non-decreasing
    # hid exactly that.)
    return [min(times[m]) for m in range(1, max_m + 1)]
