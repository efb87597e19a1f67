"""Float linear layers re-quantised to Q4_1-style blocks and run on the CPU int4 kernel (terms: gguf_q4.py).

Terms
-----
blocks        ``q4_1_blocks(w)``: per 32 inputs of a row, the minimum ``m`` and the step ``d = (max - min) / 15``
              (rounded to float16, as a GGUF stores them) and codes ``round((w - m) / d)`` clamped to 0..15.
round trip    ``round_trip(w)``: the float weight the kernel computes with for ``w``'s blocks (a head trained
              through it fits its int4 variant: scripts/train_draft.py --qat).
side by side  ``side_by_side(parts)``: bias-free ``Int4Linear``s over the same inputs, each with a multiple of 64
              outputs, as one (their outputs in order): one kernel call, the same bits (64 outputs a packed block).
quantize      ``quantize_linears(module)``: every ``nn.Linear`` the kernel takes (inputs a multiple of 32, outputs
              of 16) becomes an ``Int4Linear`` (bfloat16 in and out): the draft head's int4 variant.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from ears_core.model.kernels.gguf_q4 import GROUP, Int4Weight, int4_linear, pack_q4_1

__all__ = ["Int4Linear", "q4_1_blocks", "quantize_linears", "round_trip", "side_by_side", "takes"]


def q4_1_blocks(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A float weight (N, K) -> codes (N, K) uint8, d and m (N, K / 32) float32 (module terms: blocks)."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"Q4_1 blocks need inputs in multiples of {GROUP}, not {k}")
    g = w.detach().float().view(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)  # (N, nb)
    d = ((hi - lo) / 15).half().float()
    m = lo.half().float()
    codes = ((g - m[..., None]) / d.clamp_min(1e-12)[..., None]).round().clamp(0, 15).to(torch.uint8)
    return codes.view(n, k), d, m


def round_trip(w: Tensor) -> Tensor:
    """(N, K) float weight -> (N, K) float32: what the int4 kernel multiplies by for its blocks (module terms)."""
    codes, d, m = q4_1_blocks(w)
    n, k = codes.shape
    s, z = d.to(torch.bfloat16).float(), (m + 8 * d).to(torch.bfloat16).float()  # (N, K / 32) each
    out = (codes.view(n, k // GROUP, GROUP).float() - 8) * s[..., None] + z[..., None]  # (N, nb, 32)
    return out.view(n, k)


def takes(layer: nn.Module) -> bool:
    """Whether the int4 kernel takes this layer's shape (an ``nn.Linear``, K % 32 == 0, N % 16 == 0)."""
    return isinstance(layer, nn.Linear) and layer.in_features % GROUP == 0 and layer.out_features % 16 == 0


class Int4Linear(nn.Module):
    """``nn.Linear``'s forward over Q4_1-style blocks of its weight (module terms)."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        if not takes(layer):
            raise ValueError(f"the int4 kernel needs inputs a multiple of {GROUP} and outputs of 16, not "
                             f"{layer.in_features} -> {layer.out_features}")
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight4: Int4Weight = pack_q4_1(*q4_1_blocks(layer.weight))
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach().to(torch.bfloat16), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:  # (..., K) -> (..., N) bfloat16
        y = int4_linear(x.to(torch.bfloat16), self.weight4)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}"


def side_by_side(parts: tuple[nn.Module, ...]) -> Int4Linear | None:
    """The parts as one ``Int4Linear`` (module terms: side by side), or None where they are not such parts."""
    if not all(isinstance(p, Int4Linear) and p.bias is None and p.out_features % 64 == 0
               and p.in_features == parts[0].in_features for p in parts):
        return None
    one = copy.copy(parts[0])  # (N, K / 2) packed codes in blocks of 64 rows, (K / 32, N, 2) scales: concatenated
    one.out_features = sum(p.out_features for p in parts)
    one.weight4 = Int4Weight(torch.cat([p.weight4.packed for p in parts]),
                             torch.cat([p.weight4.scales_zeros for p in parts], 1), one.out_features, one.in_features)
    return one


def quantize_linears(module: nn.Module) -> int:
    """Swap every ``nn.Linear`` the kernel takes under ``module`` for an ``Int4Linear``; returns how many."""
    swapped = 0
    for name, child in list(module.named_children()):
        if takes(child):
            setattr(module, name, Int4Linear(child))
            swapped += 1
        else:
            swapped += quantize_linears(child)
    return swapped
