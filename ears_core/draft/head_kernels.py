"""How an EAGLE-style draft head computes on this machine: its dtype and kernels, measured once.

Terms
-----
variant       (dtype, packed): the dtype of the head's layers, its cache and its rows of the target's
              output head (eagle.py, "head dtype"), and whether its linear layers run oneDNN-packed
              weights (packed_linear.py). Draft side only: whatever the variant, q is exactly the
              distribution each draft was drawn from, so every rule stays as exact as before.
candidates    the variants worth timing. ``EARS_DRAFT_DTYPE`` set: that dtype only. A float32 target on
              a CPU with native bfloat16 dot products (AVX512-BF16 or AMX): float32 and bfloat16.
              Otherwise the target's dtype. Each dtype packed and as loaded where oneDNN is here.
why measure   a draft step reads all of the head's weights from memory (the target's pass has just
              evicted them), so bfloat16 halves the bytes; but whether its kernels are as fast as
              float32's for one row depends on the CPU: two machines with native bfloat16 (an AMD EPYC
              and an Intel Xeon) ranked the variants differently, so a rule from CPU flags picks wrong on
              one of them (docs/measurements.md has the times).
choice        when a pair loads: a drafting round (one catch-up entry and two draft steps, as the
              decode loop runs them) is timed in each candidate right after a target pass (which
              evicts the head from the caches, as in the loop), the candidates taking turns, ``REPEATS``
              times; the lowest median wins, except that the first candidate (the target's dtype, as
              loaded) is left only for one at least ``MIN_GAIN`` cheaper. The choice is cached per
              (head shape, candidates, machine) under $EARS_CACHE/kernels: a machine measures once.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from ears_core.model.hub import native_bf16
from ears_core.model.output_head import kernel_file, machine_tag, read_cached, write_cached

__all__ = ["DRAFT_DTYPES", "HeadChoice", "Variant", "candidates", "choose_head_variant"]

DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REPEATS = 7
MIN_GAIN = 0.03  # another variant must be >= 3 % cheaper than the target's dtype as loaded


@dataclass(frozen=True)
class Variant:
    dtype: str  # a DRAFT_DTYPES key
    packed: bool

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def label(self) -> str:
        return f"{self.dtype}{' packed' if self.packed else ''}"


@dataclass
class HeadChoice:
    """dtype and packed: the decision; ms[label] = the median drafting round of each candidate."""

    dtype: str
    packed: bool
    ms: dict[str, float] = field(default_factory=dict)
    key: str = ""
    measured_at: str = ""

    @property
    def variant(self) -> Variant:
        return Variant(self.dtype, self.packed)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def candidates(device: torch.device, target_dtype: torch.dtype, *, env: dict[str, str] | None = None,
               bf16: bool | None = None, packing: bool | None = None) -> list[Variant]:
    """The variants to time (module terms), the default first. ``bf16``/``packing``: whether this CPU
    has native bfloat16 and oneDNN packing (None: ask torch). A ValueError names a bad override."""
    choice = (os.environ if env is None else env).get("EARS_DRAFT_DTYPE", "").strip().lower()
    if choice and choice not in DRAFT_DTYPES:
        raise ValueError(f"EARS_DRAFT_DTYPE={choice!r} is not a draft dtype: use one of "
                         f"{', '.join(DRAFT_DTYPES)} (or leave it unset to measure on this machine)")
    if device.type != "cpu":
        return [Variant(choice or _dtype_name(target_dtype), False)]
    if choice:
        dtypes = [choice]
    elif target_dtype == torch.float32 and (native_bf16() if bf16 is None else bf16):
        dtypes = ["float32", "bfloat16"]
    else:
        dtypes = [_dtype_name(target_dtype)]
    if packing is None:
        from ears_core.model.packed_linear import available
        packing = available()
    return [Variant(d, p) for d in dtypes for p in ((False, True) if packing else (False,))]


def _key(head: Any, variants: list[Variant]) -> str:
    c = head.config
    shape = f"{len(head.vocab_ids)}x{c.hidden_size}x{c.intermediate_size}x{c.num_hidden_layers}"
    return f"{shape}|{','.join(v.label for v in variants)}|{machine_tag(torch.float32)}"


@torch.inference_mode()
def time_round(target: torch.nn.Module, drafter: Any, vocab_size: int, *, cache_len: int = 64) -> float:
    """ms of one drafting round of ``drafter`` right after a target pass: the catch-up forward over one
    committed entry, then two drafts (their head step, logits over its tokens, softmax and draw)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (1, cache_len), generator=gen)  # (1, T)
    width = len(drafter.feature_layers) * drafter.head.config.hidden_size
    feats = torch.randn(1, cache_len, width, generator=gen)  # (1, T, n*d): values do not change the cost
    drafter.prefill(ids, feats[:, : cache_len - 1])
    u = torch.full((1, 2), 0.5)

    def probs(logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float() / 0.9, dim=-1)

    drafter.propose(2, probs, u)  # the first call builds what later calls reuse
    drafter.commit(0, ids[:, -1], feats[:, -1:])
    target(ids[:, :4])  # evicts the head's weights from the caches, as a verify pass does
    t0 = time.perf_counter()
    drafter.propose(2, probs, u)
    ms = (time.perf_counter() - t0) * 1e3
    drafter.commit(0, ids[:, -1], feats[:, -1:])
    return ms


def choose_head_variant(target: torch.nn.Module, make: Callable[[Variant], Any], variants: list[Variant],
                        vocab_size: int, *, cache_dir: str | os.PathLike | None = None,
                        timer: Callable[[Any], float] | None = None) -> tuple[Any, HeadChoice | None]:
    """The drafter ``make(variant)`` builds for the variant that is fastest here (module terms), and the
    choice (None when there was only one variant, so nothing to measure). ``timer(drafter)`` -> ms
    replaces the measured drafting round (tests)."""
    if len(variants) == 1:
        return make(variants[0]), None
    first = make(variants[0])
    key = _key(first.head, variants)
    path = kernel_file("draft", key, cache_dir)
    choice = read_cached(path, HeadChoice)
    if choice is None or choice.variant not in variants:
        drafters = {variants[0]: first} | {v: make(v) for v in variants[1:]}
        run = timer or (lambda d: time_round(target, d, vocab_size))
        samples: dict[Variant, list[float]] = {v: [] for v in variants}
        for r in range(REPEATS):  # the candidates take turns, so a slow moment hits them all
            for v in (variants if r % 2 == 0 else variants[::-1]):
                samples[v].append(run(drafters[v]))
        ms = {v: statistics.median(s) for v, s in samples.items()}
        best = min(variants, key=lambda v: ms[v])
        if ms[best] > (1 - MIN_GAIN) * ms[variants[0]]:
            best = variants[0]
        choice = HeadChoice(best.dtype, best.packed, {v.label: round(ms[v], 4) for v in variants},
                            key, time.strftime("%Y-%m-%d %H:%M:%S"))
        write_cached(path, asdict(choice))
        return drafters[best], choice
    return (first if choice.variant == variants[0] else make(choice.variant)), choice
