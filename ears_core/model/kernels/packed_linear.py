"""Prepacked (oneDNN) linear layers for CPU inference, chosen by measuring the whole model (terms: rows and
exactness, output_head.py).

Terms
-----
packed        the weights reordered once into oneDNN's blocked layout, beside the originals (kept for tying):
              nearly flat in r for r <= 8, where MKL's ``F.linear`` reads each weight once per row.
kernel choice packed or as loaded (with the planned head: output_head.py), for a whole model: passes over m in
              ``MEASURED_M`` tokens timed in both modes, interleaved; packed kept only if ``MIN_GAIN`` cheaper.
scope         CPU, float32 or bfloat16 where oneDNN packs that dtype here (cpu_forms.py), at least ``MIN_ELEMENTS`` linear weights; a call that needs gradients,
              or an input on another device or dtype, runs the original layer; a weight changed in place is
              packed again at its next call.
row cap       ``max_rows`` (None by default): more rows run that many at a time (exact_rows.py: row cap).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ears_core.model.kernels import cpu_forms
from ears_core.model.measuring.measured import MEASURED_M, Measured, interleaved, keep_first, machine_tag, quietly
from ears_core.model.kernels.output_head import PlannedLinear
from ears_core.model.measuring.pass_times import measure_pass_ms

__all__ = ["PackedLinear", "available", "choose_kernels", "is_packed", "pack_layer", "pack_like", "pack_linears",
           "set_packed"]

MIN_ELEMENTS = 1 << 24  # linear weights below this (16M, 64 MB in float32) are not worth a measurement
MIN_GAIN = 0.03  # packed must be >= 3 % cheaper over the measured passes to be kept
_DTYPES = (torch.float32, torch.bfloat16)


def available(dtype: torch.dtype = torch.float32) -> bool:
    """oneDNN packs and runs a ``dtype`` linear weight here, tried (kernels/cpu_forms.py: never when portable)."""
    return cpu_forms.onednn_packs(dtype)


class PackedLinear(nn.Module):
    """A linear layer run with a oneDNN-packed copy of its weight while ``active`` (module terms: packed, scope).
    ``weight``/``bias`` are the original Parameters; the replaced layer, kept outside the tree, runs otherwise."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.weight = inner.weight  # (out, in)
        self.bias = getattr(inner, "bias", None)  # (out,) or None
        self.in_features, self.out_features = int(self.weight.shape[1]), int(self.weight.shape[0])
        self._inner = (inner,)  # a tuple: not registered, so parameters and state dicts are unchanged
        self.active = True
        self.max_rows: int | None = None  # row cap: more rows run in chunks of this many (exact_rows.py)
        self._pack()

    def _pack(self) -> None:
        w = self.weight.detach()
        self._packed = torch.ops.mkldnn._reorder_linear_weight(w, None)  # oneDNN layout, same values
        self._bias = None if self.bias is None else self.bias.detach()
        self._version = self.weight._version

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        w = self.weight
        if (not self.active or x.device.type != "cpu" or x.dtype != w.dtype
                or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return self._inner[0](x)
        if w._version != self._version:
            self._pack()
        h = x.reshape(-1, self.in_features)  # (r, in)
        if self.max_rows is None or h.shape[0] <= self.max_rows:
            y = torch.ops.mkldnn._linear_pointwise(h, self._packed, self._bias, "none", [], "")  # (r, out)
        else:  # the same kernel as for a few rows, chunk by chunk: a row's result does not depend on r
            y = torch.cat([torch.ops.mkldnn._linear_pointwise(c, self._packed, self._bias, "none", [], "")
                           for c in h.split(self.max_rows)])  # (r, out)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, active={self.active}"


def _linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, layer) for every plain linear layer: ``nn.Linear`` or the planned head."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is nn.Linear or type(child) is PlannedLinear]


def pack_layer(layer: nn.Module) -> nn.Module:
    """``PackedLinear(layer)`` for a CPU float32 / bfloat16 linear layer when oneDNN is here, else ``layer``."""
    w = layer.weight
    return PackedLinear(layer) if w.device.type == "cpu" and w.dtype in _DTYPES and available(w.dtype) else layer


def pack_linears(model: nn.Module) -> int:
    """Replace every CPU float32 / bfloat16 linear layer of ``model`` by a ``PackedLinear``; how many."""
    n = 0
    for parent, name, layer in _linears(model):
        packed = pack_layer(layer)
        if packed is not layer:
            setattr(parent, name, packed)
            n += 1
    if n:
        model.ears_kernels = "packed"
    return n


def set_packed(model: nn.Module, active: bool) -> None:
    """Switch ``model``'s packed layers on or off; ``model.ears_kernels`` names the mode (policy/costs.py)."""
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    for m in packed:
        m.active = active
    model.ears_kernels = "packed" if active and packed else ""


def is_packed(model: nn.Module) -> bool:
    """True when ``model`` runs packed linear layers (part of the price profile's key)."""
    return any(isinstance(m, PackedLinear) and m.active for m in model.modules())


@dataclass
class KernelChoice(Measured):
    """packed: the decision; ms[mode][str(m)] = the fastest pass over m new tokens in that mode."""

    packed: bool
    ms: dict[str, dict[str, float]] = field(default_factory=dict)
    KIND = "linears"


def _key(model: nn.Module) -> str:
    cfg = model.config.get_text_config() if hasattr(model, "config") else None
    shape = "x".join(str(getattr(cfg, a, "?")) for a in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                                          "vocab_size"))
    return f"{shape}|{machine_tag(next(model.parameters()).dtype)}"


@torch.inference_mode()
def measure_modes(model: nn.Module, *, rounds: int = 3, cache_len: int = 64, piece: Callable[[], Any] | None = None
                  ) -> dict[str, dict[str, float]]:
    """Per mode (packed, as loaded), the fastest pass over m in ``MEASURED_M`` tokens in ms, the modes interleaved
    (each round in ``piece()``)."""
    def curve(mode: str) -> list[float]:  # V(1) .. V(max m)
        set_packed(model, mode == "packed")
        return measure_pass_ms(model, max_m=max(MEASURED_M), cache_len=cache_len, repeats=2)

    try:
        samples = interleaved(["packed", "loaded"], curve, rounds, piece)
    finally:
        set_packed(model, True)
    return {mode: {str(m): min(v[m - 1] for v in curves) for m in MEASURED_M} for mode, curves in samples.items()}


def choose_kernels(model: nn.Module, *, cache_dir: str | os.PathLike | None = None, refresh: bool = False,
                   measure: bool = True, piece: Callable[[], Any] | None = None) -> KernelChoice | None:
    """Pack ``model``'s linear layers if that measures faster here (module terms: kernel choice); the choice
    (cached, or measured in a few seconds and cached), or None when the model is out of scope. Not cached and not
    ``measure``: the layers stay as loaded and ``model.ears_kernels_provisional`` is set (pair.py: provisional);
    with ``piece`` each round runs in ``piece()`` and busy cores raise ``MachineBusy``."""
    if any(isinstance(m, PackedLinear) for m in model.modules()):
        return None  # already decided for this model
    layers = _linears(model)
    w = layers[0][2].weight if layers else None
    if (w is None or w.device.type != "cpu" or w.dtype not in _DTYPES or not available(w.dtype)
            or sum(layer.weight.numel() for _, _, layer in layers) < MIN_ELEMENTS):
        return None
    key = _key(model)
    choice = KernelChoice.cached(key, cache_dir, refresh)
    if choice is not None and not choice.packed:
        return choice  # this machine measured packing slower: the model keeps its own layers
    if choice is None and not measure:
        model.ears_kernels_provisional = True
        return None
    if not pack_linears(model):
        return None
    if choice is None:
        try:
            ms = quietly("the target's linear kernels", lambda: measure_modes(model, piece=piece), check=piece is not None)
        except BaseException:
            unpack_linears(model)  # undecided: as loaded, so that a later try measures again
            raise
        total = {mode: sum(ms[mode].values()) for mode in ("loaded", "packed")}  # as loaded first: the default
        choice = KernelChoice(keep_first(total, MIN_GAIN) == "packed", ms, key=key).save(cache_dir)
    if not choice.packed:
        unpack_linears(model)  # give the memory of the packed copies back
    return choice


def unpack_linears(model: nn.Module) -> None:
    """Put back the layers ``pack_linears`` replaced."""
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                setattr(parent, name, child._inner[0])
    model.ears_kernels = ""


def pack_like(target: nn.Module, other: Any) -> int:
    """Give a drafter's own layers (an EAGLE head, a draft model) the kernels the target chose."""
    if not is_packed(target):
        return 0
    if hasattr(other, "pack_kernels"):
        return int(other.pack_kernels())
    return pack_linears(other) if isinstance(other, nn.Module) else 0

