"""How the lean target splits a pass's rows between int4 kernel calls: the cheapest chunks, measured here.

Terms
-----
width cost   c(w): one call of every int4 matrix of a layer on w rows (the kernel takes rows in fours, so 5 rows
             can cost more than 3 + 2), the fastest of a few interleaved timings.
plan         per width m = 1 .. ``MAX_PLANNED``, the chunks with the least summed cost over c(1) .. c(``MEASURED``);
             wider passes run in chunks of ``decoder.ROW_CAP``. The kernel is row-invariant: any split gives the
             same bits. Cached per machine (measured.py).
default      until measured (a cold start measures nothing) the plan from ``DEFAULT_COST``, an Intel Xeon's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ears_core.model.measuring.measured import Measured, interleaved, machine_tag, quietly

__all__ = ["DEFAULT_COST", "MAX_PLANNED", "MEASURED", "RowPlan", "best_chunks", "install_row_plan", "measure_widths"]

MEASURED = 8  # widths timed
MAX_PLANNED = 17  # widths planned: a chain's verify pass (K + 1 <= 9) and a tree's (budget + 1 <= 17)
DEFAULT_COST = (3.33, 4.08, 4.82, 5.65, 10.36, 10.37, 10.32, 10.45)  # c(1..8) ms, module terms: default


@dataclass
class RowPlan(Measured):
    """chunks[m - 1] = the chunk sizes for a pass over m rows; cost_ms[w - 1] = c(w) as measured (module terms)."""

    chunks: list[list[int]]
    cost_ms: list[float] = field(default_factory=list)
    KIND = "lean_rows"


def best_chunks(cost: list[float], widths: int = MAX_PLANNED) -> list[list[int]]:
    """For m = 1 .. widths, the chunk sizes (each at most len(cost)) with the least summed cost; ties keep
    fewer chunks, larger first."""
    best: list[tuple[float, list[int]]] = [(0.0, [])]
    for m in range(1, widths + 1):
        options = [(best[m - w][0] + cost[w - 1], sorted([w, *best[m - w][1]], reverse=True))
                   for w in range(1, min(m, len(cost)) + 1)]
        best.append(min(options, key=lambda o: (round(o[0], 9), len(o[1]))))
    return [b[1] for b in best[1:]]


@torch.inference_mode()
def measure_widths(model: Any, widths: int = MEASURED, rounds: int = 7, calls: int = 20,
                   piece: Callable[[], Any] | None = None) -> list[float]:
    """c(1) .. c(widths) in ms for all the model's layers (module terms: width cost), interleaved (measured.py),
    each round in ``piece()`` (a measurement between requests: serve/between.py)."""
    from ears_core.model.kernels.gguf_q4 import int4_linear

    layer = model.layers[0]
    mats = (layer.qkv, layer.o, layer.gate_up, layer.down)
    g = torch.Generator().manual_seed(0)
    xs = {w: [torch.randn(w, m.in_features, generator=g).to(torch.bfloat16) for m in mats] for w in range(1, widths + 1)}

    def time_width(w: int) -> float:
        for x, m in zip(xs[w], mats):
            int4_linear(x, m)
        t0 = time.perf_counter()
        for _ in range(calls):
            for x, m in zip(xs[w], mats):
                int4_linear(x, m)
        return (time.perf_counter() - t0) / calls * 1e3 * len(model.layers)

    samples = interleaved(list(range(1, widths + 1)), time_width, rounds, piece)
    return [round(min(samples[w]), 4) for w in range(1, widths + 1)]


def _usable(plan: RowPlan) -> bool:
    """Whether a cached plan covers every width planned, each m in chunks of 1 or more rows that add up to m."""
    return len(plan.chunks) >= MAX_PLANNED and all(c and min(c) >= 1 and sum(c) == m
                                                   for m, c in enumerate(plan.chunks, 1))


def install_row_plan(model: Any, cache_dir: str | os.PathLike | None = None, refresh: bool = False,
                     measure: bool = True, piece: Callable[[], Any] | None = None) -> RowPlan | None:
    """Give a LeanLlama its row plan: read from the cache, or measured (about a second; each round in
    ``piece()``; busy cores raise ``MachineBusy``: measured.py, quiet), cached and returned; with
    ``measure=False`` and nothing cached, the default plan, and None (module terms)."""
    layer = model.layers[0]
    key = f"{layer.qkv.out_features}x{layer.gate_up.out_features}x{layer.down.in_features}|{machine_tag(torch.bfloat16)}"
    plan = RowPlan.cached(key, cache_dir, refresh, _usable)
    if plan is None and measure:
        cost = quietly("the int4 row plan", lambda: measure_widths(model, piece=piece))
        plan = RowPlan(best_chunks(cost), cost, key=key).save(cache_dir)
    chunks = plan.chunks if plan is not None else best_chunks(list(DEFAULT_COST))
    model.row_plan = {m: tuple(c) for m, c in enumerate(chunks, 1)}
    return plan
