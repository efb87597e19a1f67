"""The target's output projection with the fastest matmul layout for the rows at hand (CPU only).

Terms
-----
rows        r = the hidden states projected in one call: 1 for a decode step, k + 1 for a verify pass.
layout      ``linear`` F.linear(h, W), ``wx`` (W @ h^T)^T or ``xw`` h @ W^T with W^T kept contiguous: for small r
            their speed changes with r and the machine (docs/measurements.md). The plan: the fastest per r up
            to max_rows (more: ``linear``), timed interleaved and cached (measuring/measured.py).
exactness   the same dot products summed in another order: logits agree to float rounding; speculative and
            target-only decoding run the same kernels.
scope       CPU, floating dtypes, V x d >= ``MIN_ELEMENTS``; inference only (W^T is not updated).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ears_core.model.measuring.measured import Measured, interleaved, machine_tag, quietly

__all__ = ["LAYOUTS", "HeadPlan", "PlannedLinear", "choose_layouts", "install_planned_head", "plan_head", "run_layout"]

LAYOUTS = ("linear", "wx", "xw")
MIN_ELEMENTS = 1 << 22  # V x d below this (4M weights, 16 MB in float32): not worth a plan


@dataclass
class HeadPlan(Measured):
    """layouts[r - 1] = the layout for r rows; ms[r - 1] = {layout: median ms} as measured."""

    layouts: list[str]
    ms: list[dict[str, float]]
    KIND = "head"

    def layout(self, rows: int) -> str:
        return self.layouts[rows - 1] if 1 <= rows <= len(self.layouts) else "linear"


def choose_layouts(ms: list[dict[str, float]]) -> list[str]:
    """The fastest layout per row count; ties keep ``linear`` (no W^T copy for nothing)."""
    return [min(LAYOUTS, key=lambda name: (t.get(name, float("inf")), name != "linear")) for t in ms]


class PlannedLinear(torch.nn.Module):
    """An ``nn.Linear`` replacement that follows a ``HeadPlan``: ``weight`` is the original Parameter (tied
    embeddings stay tied); ``weight_t`` (d, V) a contiguous copy of W^T, kept only when the plan uses ``xw``."""

    def __init__(self, linear: torch.nn.Linear, plan: HeadPlan) -> None:
        super().__init__()
        self.weight = linear.weight  # (V, d)
        self.bias = linear.bias  # (V,) or None
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.plan = plan
        self.weight_t = linear.weight.detach().t().contiguous() if "xw" in plan.layouts else None  # (d, V)

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., V)
        layout = self.plan.layout(x[..., 0].numel())
        if layout == "linear" or x.requires_grad:
            return F.linear(x, self.weight, self.bias)
        y = run_layout(layout, x.reshape(-1, x.shape[-1]), self.weight.detach(), self.weight_t)  # (r, V)
        return (y if self.bias is None else y + self.bias).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, plan={self.plan.layouts}"


def run_layout(layout: str, h: Tensor, w: Tensor, w_t: Tensor | None) -> Tensor:
    """h (r, d) through W (V, d) in ``layout`` (module terms; ``w_t`` W^T, for ``xw``) -> (r, V)."""
    if layout == "linear":
        return F.linear(h, w)
    return h @ w_t if layout == "xw" else (w @ h.t()).t()


@torch.inference_mode()
def plan_head(weight: Tensor, max_rows: int = 12, repeats: int = 5,
              clock: Callable[[], float] = time.perf_counter, piece: Callable[[], Any] | None = None) -> HeadPlan:
    """Time every layout for r = 1 .. max_rows rows (interleaved, after a warm-up round, each round in ``piece()``)
    and keep the fastest."""
    w = weight.detach()
    w_t = w.t().contiguous()
    g = torch.Generator().manual_seed(0)
    h = torch.randn(max_rows, w.shape[1], generator=g).to(w.device, w.dtype)  # (max_rows, d)

    def time_one(case: tuple[int, str]) -> float:
        t0 = clock()
        run_layout(case[1], h[: case[0]], w, w_t)
        return (clock() - t0) * 1000

    cases = [(r, name) for r in range(1, max_rows + 1) for name in LAYOUTS]
    times = interleaved(cases, time_one, repeats + 1, piece)  # the first round is the warm-up
    ms = [{name: statistics.median(times[r, name][1:]) for name in LAYOUTS} for r in range(1, max_rows + 1)]
    return HeadPlan(choose_layouts(ms), ms)


def install_planned_head(model: torch.nn.Module, *, max_rows: int = 12, cache_dir: str | os.PathLike | None = None,
                         refresh: bool = False, measure: bool = True, piece: Callable[[], Any] | None = None
                         ) -> HeadPlan | None:
    """Give ``model`` a planned output projection (module terms: scope); the plan (cached or measured), or None.
    Not cached: measured and cached with ``measure`` (with ``piece``, rounds in ``piece()`` and busy cores raise
    ``MachineBusy``), else the model keeps its own head and ``model.ears_kernels_provisional`` is set (pair.py:
    provisional)."""
    head = model.get_output_embeddings()
    if isinstance(head, PlannedLinear):
        return head.plan
    w = head.weight if type(head) is torch.nn.Linear else None  # a plain linear layer only
    if w is None or w.device.type != "cpu" or not w.dtype.is_floating_point or w.numel() < MIN_ELEMENTS:
        return None
    key = f"{w.shape[0]}x{w.shape[1]}|{machine_tag(w.dtype)}"
    plan = HeadPlan.cached(key, cache_dir, refresh,  # an old file: measured again
                           lambda p: len(p.layouts) >= max_rows and all(x in LAYOUTS for x in p.layouts))
    if plan is None:
        if not measure:
            model.ears_kernels_provisional = True
            return None
        plan = quietly("the output head's layouts", lambda: plan_head(w, max_rows, piece=piece), check=piece is not None)
        plan.key = key
        plan.save(cache_dir)
    model.set_output_embeddings(PlannedLinear(head, plan))
    return plan
