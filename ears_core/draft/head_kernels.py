"""How an EAGLE-style draft head computes on this machine: its dtype and kernels, measured once
(terms: eagle.py, head dtype).

Terms
-----
variant       (dtype, packed, int4): the head dtype, oneDNN-packed linears (model/kernels/packed_linear.py), and
              int4 linears and output rows (model/kernels/int4_linear.py; ``int4-layers``: rows kept bfloat16):
              a quarter of the bytes for a few points of acceptance (docs/benchmarks.md), offered with the lean
              int4 target and kept only if ``INT4_MIN_GAIN`` cheaper than the best float variant.
candidates    ``EARS_DRAFT_DTYPE`` set: that one. Else float32 and bfloat16 for a float32 target on a CPU with
              native bfloat16, or the target's dtype; each packed and as loaded where oneDNN packs that dtype here;
              then int4 where its kernel runs here (both tried on a tiny input: model/kernels/cpu_forms.py).
choice        a drafting round timed in each candidate after a target pass, the candidates taking turns
              ``REPEATS`` times: the lowest median, but the first (as loaded) unless one is ``MIN_GAIN`` cheaper
              (the winner depends on the CPU: docs/measurements.md); cached.
default       with nothing cached a load takes ``default_variant`` (int4 where offered) and a session measures
              between requests (``pair.ModelPair.settle``).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ears_core.model.loading.hub import native_bf16
from ears_core.model.loading.lean_target import supported
from ears_core.model.measuring.measured import Measured, interleaved, keep_first, machine_tag, quietly

__all__ = ["DRAFT_DTYPES", "HeadChoice", "Variant", "candidates", "choose_head_variant", "default_variant"]

DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REPEATS = 7
MIN_GAIN = 0.03  # another variant must be >= 3 % cheaper than the target's dtype as loaded
INT4_MIN_GAIN = 0.2  # the int4 variant must be >= 20 % cheaper than the best float one (it drafts a little worse)
INT4 = "int4"  # EARS_DRAFT_DTYPE's name for the int4 variant
INT4_LAYERS = "int4-layers"  # ... and for its twin whose output rows stay bfloat16 (module terms: variant)


@dataclass(frozen=True)
class Variant:
    dtype: str  # a DRAFT_DTYPES key
    packed: bool
    int4: bool = False  # the layers and output rows on the int4 kernel (module terms); dtype is then bfloat16
    int4_rows: bool = True  # with int4: the output rows too (False: they stay bfloat16, packed)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def label(self) -> str:
        if self.int4:
            return INT4 if self.int4_rows else INT4_LAYERS
        return f"{self.dtype}{' packed' if self.packed else ''}"


INT4_VARIANT = Variant("bfloat16", False, True)  # the int4 kernel takes bfloat16 activations
INT4_LAYERS_VARIANT = Variant("bfloat16", False, True, False)


@dataclass
class HeadChoice(Measured):
    """dtype, packed and int4: the decision; ms[label] = the median drafting round of each candidate."""

    dtype: str
    packed: bool
    ms: dict[str, float] = field(default_factory=dict)
    int4: bool = False
    KIND = "draft"

    @property
    def variant(self) -> Variant:
        return Variant(self.dtype, self.packed, self.int4)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def candidates(device: torch.device, target_dtype: torch.dtype, *, env: dict[str, str] | None = None,
               bf16: bool | None = None, packing: bool | None = None, int4: bool = False,
               int4_runs: bool | None = None) -> list[Variant]:
    """The variants to time (module terms), the default first. ``bf16``: whether this CPU has native bfloat16;
    ``packing``: whether oneDNN packs here (None: tried per dtype, kernels/cpu_forms.py); ``int4``: offer int4;
    ``int4_runs``: whether its kernel runs here (None: tried). A ValueError names a bad override."""
    choice = (os.environ if env is None else env).get("EARS_DRAFT_DTYPE", "").strip().lower()
    if choice and choice not in (*DRAFT_DTYPES, INT4, INT4_LAYERS):
        raise ValueError(f"EARS_DRAFT_DTYPE={choice!r} is not a draft dtype: use one of "
                         f"{', '.join((*DRAFT_DTYPES, INT4, INT4_LAYERS))} (or leave it unset to measure on this machine)")
    int4_here = device.type == "cpu" and (supported() if int4_runs is None else int4_runs)
    if choice in (INT4, INT4_LAYERS):
        if not int4_here:
            raise ValueError(f"EARS_DRAFT_DTYPE={choice} needs PyTorch's CPU int4 kernel, which does not run here "
                             "with bfloat16 activations: leave it unset to measure the float variants here")
        return [INT4_VARIANT if choice == INT4 else INT4_LAYERS_VARIANT]
    if device.type != "cpu":
        return [Variant(choice or _dtype_name(target_dtype), False)]
    if choice:
        dtypes = [choice]
    elif target_dtype == torch.float32 and (native_bf16() if bf16 is None else bf16):
        dtypes = ["float32", "bfloat16"]
    else:
        dtypes = [_dtype_name(target_dtype)]

    def packs(dtype: str) -> bool:
        from ears_core.model.kernels.packed_linear import available
        return available(DRAFT_DTYPES[dtype]) if packing is None else packing

    found = [Variant(d, p) for d in dtypes for p in ((False, True) if packs(d) else (False,))]
    return found + ([INT4_VARIANT] if int4 and not choice and int4_here else [])


def _key(head: Any, variants: list[Variant]) -> str:
    c = head.config
    shape = f"{len(head.vocab_ids)}x{c.hidden_size}x{c.intermediate_size}x{c.num_hidden_layers}"
    return f"{shape}|{','.join(v.label for v in variants)}|{machine_tag(torch.float32)}"


@torch.inference_mode()
def time_round(target: torch.nn.Module, drafter: Any, vocab_size: int, *, cache_len: int = 64) -> float:
    """ms of one drafting round of ``drafter`` right after a target pass (module terms: choice)."""
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


def _pick(variants: list[Variant], ms: dict[Variant, float]) -> Variant:
    """The variant kept (module terms: choice, variant)."""
    best = keep_first({v: ms[v] for v in variants if not v.int4}, MIN_GAIN)
    quick = [v for v in variants if v.int4 and ms[v] <= (1 - INT4_MIN_GAIN) * ms[best]]
    return quick[0] if quick else best


def default_variant(variants: list[Variant]) -> Variant:
    """The variant a load takes before this machine's choice is measured (module terms: default)."""
    return INT4_VARIANT if INT4_VARIANT in variants else variants[0]


def choose_head_variant(target: torch.nn.Module, make: Callable[[Variant], Any], variants: list[Variant],
                        vocab_size: int, *, cache_dir: str | os.PathLike | None = None,
                        timer: Callable[[Any], float] | None = None, measure: bool = True,
                        piece: Callable[[], Any] | None = None) -> tuple[Any, HeadChoice | None]:
    """The drafter ``make(variant)`` builds for the fastest variant here (module terms), and the choice: None for one
    variant, or with ``measure`` False and nothing cached (the default variant's drafter). ``timer(drafter)`` -> ms
    replaces the timed round (tests). Busy cores raise MachineBusy (measuring/measured.py: quiet)."""
    if len(variants) == 1:
        return make(variants[0]), None
    first = make(variants[0])
    key = _key(first.head, variants)
    choice = HeadChoice.cached(key, cache_dir, usable=lambda c: c.variant in variants)
    if choice is None and measure:
        drafters = {variants[0]: first} | {v: make(v) for v in variants[1:]}
        run = timer or (lambda d: time_round(target, d, vocab_size))
        samples = quietly("the draft head's kernels", lambda: interleaved(variants, lambda v: run(drafters[v]),
                                                                          REPEATS, piece), check=timer is None)
        ms = {v: statistics.median(s) for v, s in samples.items()}
        best = _pick(variants, ms)
        choice = HeadChoice(best.dtype, best.packed, {v.label: round(ms[v], 4) for v in variants}, best.int4, key=key)
        choice.save(cache_dir)
        return drafters[choice.variant], choice
    kept = choice.variant if choice is not None else default_variant(variants)
    return (first if kept == variants[0] else make(kept)), choice
