"""How long a target's forward pass over m new tokens takes on this machine: what the price curve
(policy/costs.py) and the kernel choice (kernels/packed_linear.py) are measured from.

Terms
-----
step          V(1): the fastest of ``repeats`` one-token passes on a cache of ``cache_len`` random tokens.
paired ratio  each pass over m > 1 (all m logits kept) is timed right after a one-token pass; V(m) is the step
              times the median ratio, so a machine's fast and slow spells (docs/measurements.md) hit both passes
              of a pair. Kept as measured, even where a longer pass is cheaper.
piece         ``piece()`` (optional): a context manager each forward runs in (serve/between.py).
warm-up       a first round over every m, not counted; ``warm=False`` skips it (a quick measurement right after
              a load whose own checks ran these passes: the lean target's exact-rows check).
"""
from __future__ import annotations

import statistics
from contextlib import nullcontext
from typing import Any, Callable

import torch

__all__ = ["measure_pass_ms"]


@torch.inference_mode()
def measure_pass_ms(target: torch.nn.Module, *, max_m: int = 9, cache_len: int = 64, repeats: int = 5,
                    vocab: int | None = None, piece: Callable[[], Any] | None = None, warm: bool = True) -> list[float]:
    """[V(1), ..., V(max_m)] in ms: ``target``'s step and its passes priced by paired ratios (module terms)."""
    from ears_core.model.passes.attention import avoid_replanning_attention
    from ears_core.model.passes.kv_cache import new_cache
    from ears_core.timing import StepClock, check_early

    piece = piece or nullcontext
    dev = next(target.parameters()).device
    avoid_replanning_attention(dev)  # priced with the kernels the decode loop runs
    v = vocab or int(target.config.get_text_config().vocab_size)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, v, (1, cache_len), generator=g).to(dev)
    new = torch.randint(0, v, (1, max_m), generator=g).to(dev)
    cache = new_cache(target)
    with piece():
        target(ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
    clock = StepClock(dev)

    def timed(m: int) -> float:
        check_early()  # a watched measurement on busy cores stops here (timing.py: given up)
        with piece():
            t0 = clock.mark()
            target(new[:, :m], past_key_values=cache, use_cache=True, logits_to_keep=m)
            t1 = clock.mark()
        cache.crop(-m)
        return clock.ms(t0, t1)

    steps: list[float] = []
    ratios: dict[int, list[float]] = {m: [] for m in range(2, max_m + 1)}
    for r in range(repeats + warm):
        for m in range(1, max_m + 1):
            one = timed(1)  # the pair's one-token pass (module terms: paired ratio)
            wide = timed(m) if m > 1 else None
            if r >= warm:  # module terms: warm-up
                steps.append(one)
                if wide is not None:
                    ratios[m].append(wide / one)
    step = min(steps)
    return [step] + [step * statistics.median(ratios[m]) for m in range(2, max_m + 1)]
