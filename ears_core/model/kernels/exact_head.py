"""The lean target's output head: logits whose every row is, bit for bit, what a one-row call gives, in the fastest
such form this machine runs (terms: rows, layout in output_head.py; probe in cpu_forms.py).

Terms
-----
layout        how the (V, d) weight meets r rows: output_head.py's ``linear``, ``wx`` and ``xw``, and ``packed``
              (oneDNN's layout of the weight, where ``cpu_forms.onednn_packs``). Each sums a row's products in its
              own order, so one layout serves every row count: mixing them would make rows depend on r.
exact width   the widest chunk c of ``CHUNKS`` such that a call on any c' <= c of ``CHUNKS`` rows gives each row
              the one-row call's bits, probed on random rows: 1 at least. A one-row call is its own reference, so
              every layout has a form; which batch a kernel blocks rows into depends on the CPU (oneDNN's
              emulated bfloat16 mixes rows from 2 on, where its native bfloat16 does not up to 16).
form          (layout, exact width, chunk plan): r rows run in chunks of ``CHUNKS`` sizes up to the exact width,
              split by ``lean_plan.best_chunks`` over the measured chunk costs (any such split, the same bits).
choice        every layout that runs: its exact width, then its chunk costs c(w) timed interleaved (a layout
              ``PRUNE`` times dearer than the cheapest on one row is dropped first); the layout whose plan costs
              least over r in ``MEASURED_M``; cached per machine (measured.py). A load measures nothing: with
              nothing cached it takes the first layout here at its exact width, untimed, and a session measures
              the choice between requests (pair.py: provisional); the new layout serves the requests after it.
growth        whether the head's cost grows with its rows: two rows cost ``GROWTH`` times one or more as measured
              (bfloat16 emulated, as on AVX2: the cost is arithmetic), one row at a time (exact width 1), or, unmeasured,
              any layout but oneDNN's packed one (which takes several rows for about the price of one). Where it
              grows, a chain's verify pass runs its head row by row up to the first draft that falls
              (decode/row_walk.py; figures: docs/measurements.md, "A verify pass's head, row by row").
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ears_core.model.kernels import cpu_forms
from ears_core.model.kernels.output_head import run_layout
from ears_core.model.kernels.packed_linear import PackedLinear
from ears_core.model.measuring.measured import MEASURED_M, Measured, interleaved, machine_tag, quietly

__all__ = ["CHUNKS", "GROWTH", "ExactHead", "HeadForm", "choose_head_form", "exact_width", "install_exact_head", "layouts_here"]

CHUNKS = (1, 2, 3, 4, 8, 16)  # chunk widths checked and planned (module terms: exact width)
MAX_ROWS = 17  # rows planned: a chain's verify pass (K + 1 <= 9) and a tree's (budget + 1 <= 17)
PRUNE = 3.0  # module terms: choice
GROWTH = 1.5  # module terms: growth
ROUNDS = 5


def layouts_here(dtype: torch.dtype) -> tuple[str, ...]:
    """The layouts this machine runs for a ``dtype`` weight, in order of preference when nothing is measured."""
    return (("packed",) if cpu_forms.onednn_packs(dtype) else ()) + ("linear", "xw", "wx")


class _Weights:
    """The head's weight (V, d) in the forms its layouts read, each made on first use."""

    def __init__(self, weight: Tensor) -> None:
        self.w = weight.detach()  # (V, d)
        self._t: Tensor | None = None  # (d, V) contiguous, for xw
        self._packed: PackedLinear | None = None  # oneDNN's layout, for packed

    def run(self, layout: str, h: Tensor) -> Tensor:  # (r, d) -> (r, V)
        if layout == "packed":
            if self._packed is None:
                plain = nn.Linear(self.w.shape[1], self.w.shape[0], bias=False, device="meta")
                plain.weight = nn.Parameter(self.w, requires_grad=False)  # the same tensor, not a copy
                self._packed = PackedLinear(plain)
            return self._packed(h)
        if layout == "xw" and self._t is None:
            self._t = self.w.t().contiguous()
        return run_layout(layout, h, self.w, self._t)

    def keep_only(self, layout: str) -> None:
        """Free the forms another layout read (a chosen head keeps one)."""
        self._t = self._t if layout == "xw" else None
        self._packed = self._packed if layout == "packed" else None


def exact_width(weights: _Weights, layout: str, h: Tensor) -> int:
    """The exact width of ``layout`` (module terms) on rows h (n >= max(CHUNKS), d): every chunk of each width
    tried over the first n rows (a rounding apart shows in some rows and not others)."""
    n = h.shape[0] - h.shape[0] % max(CHUNKS)
    reference = torch.cat([weights.run(layout, h[i: i + 1]) for i in range(n)])  # (n, V)
    width = 1
    for c in CHUNKS[1:]:
        if not all(torch.equal(weights.run(layout, h[s: s + c]), reference[s: s + c]) for s in range(0, n - c + 1, c)):
            break
        width = c
    return width


@dataclass
class HeadForm(Measured):
    """layout and width (module terms: form); chunks[r - 1] the chunk sizes for r rows; widths[layout] its exact
    width and ms[layout][str(c)] its chunk costs as measured (ms empty: chosen unmeasured)."""

    layout: str
    width: int
    chunks: list[list[int]]
    widths: dict[str, int] = field(default_factory=dict)
    ms: dict[str, dict[str, float]] = field(default_factory=dict)
    KIND = "lean_head"

    def grows_with_rows(self) -> bool:
        """Whether the head's cost grows with its rows here (module terms: growth)."""
        cost = self.ms.get(self.layout, {})
        if self.width == 1:
            return True
        if "1" in cost and "2" in cost:
            return cost["2"] >= GROWTH * cost["1"]
        return self.layout != "packed"

    def plan(self, rows: int) -> list[int]:
        """Chunk sizes for ``rows`` rows: the plan's, or chunks of the exact width past it."""
        if rows <= len(self.chunks):
            return self.chunks[rows - 1]
        return [self.width] * (rows // self.width) + ([rows % self.width] if rows % self.width else [])


def _plan(cost: dict[int, float]) -> list[list[int]]:
    """Chunks for r = 1 .. MAX_ROWS from the sizes ``cost`` prices (a size -> its cost)."""
    from ears_core.model.measuring.lean_plan import best_chunks

    return best_chunks([cost.get(c, float("inf")) for c in range(1, max(cost) + 1)], MAX_ROWS)


@torch.inference_mode()
def choose_head_form(weight: Tensor, *, measure: bool = True, piece: Callable[[], Any] | None = None) -> HeadForm:
    """The head's form here (module terms: choice), each round in ``piece()`` (between requests: serve/between.py);
    busy cores raise ``MachineBusy`` (measured.py: quiet). ``measure`` False: the first layout here with its exact
    width, untimed (``ms`` empty)."""
    weights = _Weights(weight)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(max(CHUNKS), weight.shape[1], generator=g).to(weight.dtype)  # (16, d)
    names = layouts_here(weight.dtype)
    if not measure:
        width = exact_width(weights, names[0], h)
        return HeadForm(names[0], width, _plan({c: 1.0 for c in CHUNKS if c <= width}), {names[0]: width})

    def once(case: tuple[str, int]) -> float:
        t0 = time.perf_counter()
        weights.run(case[0], h[: case[1]])
        return (time.perf_counter() - t0) * 1e3

    def timed() -> tuple[dict[str, int], dict[tuple[str, int], list[float]]]:
        one = interleaved([(n, 1) for n in names], once, 3, piece)
        cheapest = min(min(v) for v in one.values())
        kept = [n for n in names if min(one[n, 1]) <= PRUNE * cheapest]
        widths = {}
        for n in kept:
            with (piece or nullcontext)():
                widths[n] = exact_width(weights, n, h)
        cases = [(n, c) for n in kept for c in CHUNKS if c <= min(widths[n], 8)]
        return widths, interleaved(cases, once, ROUNDS, piece)

    widths, times = quietly("the output head's form", timed)
    ms = {name: {str(c): round(min(t), 4) for (n, c), t in times.items() if n == name} for name in widths}

    def planned(name: str) -> tuple[float, list[list[int]]]:
        cost = {int(c): t for c, t in ms[name].items()}
        chunks = _plan(cost)
        return sum(sum(cost[c] for c in chunks[r - 1]) for r in MEASURED_M), chunks

    best = min(widths, key=lambda n: planned(n)[0])
    return HeadForm(best, widths[best], planned(best)[1], widths, ms)


class ExactHead(nn.Module):
    """(r, d) -> (r, V) logits in a ``HeadForm`` (module terms); ``weight`` the (V, d) tensor it reads."""

    def __init__(self, weight: Tensor, form: HeadForm) -> None:
        super().__init__()
        self.weight = weight
        self.form = form
        self._weights = _Weights(weight)
        self._weights.keep_only(form.layout)

    def forward(self, h: Tensor) -> Tensor:  # (r, d) -> (r, V)
        sizes = self.form.plan(h.shape[0])
        run, layout = self._weights.run, self.form.layout
        return run(layout, h) if len(sizes) == 1 else torch.cat([run(layout, c) for c in h.split(sizes)])

    def extra_repr(self) -> str:
        return f"layout={self.form.layout}, exact width={self.form.width}"


def install_exact_head(model: Any, cache_dir: str | os.PathLike | None = None, refresh: bool = False,
                       measure: bool = False, piece: Callable[[], Any] | None = None) -> HeadForm:
    """Give a LeanLlama its head (module terms): the cached form, else one chosen now: measured and cached with
    ``measure`` (rounds in ``piece()``; busy cores raise ``MachineBusy``), else untimed, marked
    ``model.ears_head_provisional`` (a load measures nothing: pair.py, provisional)."""
    w = model.get_output_embeddings().weight  # (V, d)
    key = f"{w.shape[0]}x{w.shape[1]}|{machine_tag(w.dtype)}"
    here = layouts_here(w.dtype)
    form = HeadForm.cached(key, cache_dir, refresh, lambda f: f.layout in here and len(f.chunks) >= MAX_ROWS
                           and f.width in CHUNKS and f.width == f.widths.get(f.layout))
    if form is None:
        form = choose_head_form(w, measure=measure, piece=piece)
        form.key = key
        if form.ms:
            form.save(cache_dir)
    model.head_form = ExactHead(w, form)
    model.ears_head_provisional = not form.ms
    return form
