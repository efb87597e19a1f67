"""4-bit linear layers straight from a GGUF's Q4_1 blocks, on PyTorch's CPU int4 kernel.

Terms
-----
Q4_1 block    32 weights of a row: a float16 scale ``d`` and minimum ``m``, 32 codes ``c`` in 0..15 (byte j: code
              j in its low nibble, j + 16 in its high one), 20 bytes; a weight is ``d * c + m``. ``attn_q`` and
              ``attn_k`` rows follow llama.cpp's rotary order, un-permuted as transformers' GGUF loader does.
int4 group    what ``_weight_int4pack_mm_for_cpu`` multiplies with: per ``GROUP`` of 32 inputs, codes in 0..15, a
              scale ``s`` and a zero ``z``, a weight ``(c - 8) * s + z``: a Q4_1 block with ``s = d``,
              ``z = m + 8 d`` (the GGUF's own codes). A row's result does not depend on how many rows come with it.
scales        ``s`` and ``z`` rounded to bfloat16 (float32 ones take a path ~25x slower): a layer's output moves
              by about 4e-3 relative against the float32 dequantised weights (docs/benchmarks.md).
Q8_0 block    32 int8 codes and a float16 scale (34 bytes): the token embedding, dequantised to bfloat16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["GROUP", "Int4Weight", "available", "dequantize_q4_1", "int4_linear", "pack_q4_1", "q4_1_parts",
           "q8_0_to_tensor", "rotary_row_order"]

GROUP = 32  # weights per Q4_1 block and per int4 group
_Q4_1_BYTES = 20
_Q8_0_BYTES = 34
INNER_K_TILES = 2  # the packing's tile width along the input axis (the kernel accepts 2, 4 or 8)


def available() -> bool:
    """Whether this torch has the CPU int4 kernel and its packing op."""
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


def q4_1_parts(raw: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """A Q4_1 tensor as the GGUF reader gives it, (N, K / 32 * 20) uint8 -> codes (N, K) uint8 in 0..15,
    d (N, K / 32) float32, m (N, K / 32) float32 (the float16 values, widened exactly)."""
    n, width = raw.shape
    if width % _Q4_1_BYTES:
        raise ValueError(f"a Q4_1 row is a multiple of {_Q4_1_BYTES} bytes, not {width}")
    blocks = np.ascontiguousarray(raw).reshape(n, width // _Q4_1_BYTES, _Q4_1_BYTES)  # (N, nb, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, nb)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, nb)
    qs = blocks[..., 4:]  # (N, nb, 16)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # (N, nb, 32): low nibbles first, then high
    return torch.from_numpy(codes.reshape(n, -1)), torch.from_numpy(d), torch.from_numpy(m)


def dequantize_q4_1(codes: Tensor, d: Tensor, m: Tensor) -> Tensor:
    """(N, K) float32 weights ``d * c + m``: the float reference of the same blocks."""
    n, k = codes.shape
    w = codes.view(n, k // GROUP, GROUP).float() * d[..., None] + m[..., None]  # (N, nb, 32)
    return w.view(n, k)


def q8_0_to_tensor(raw: np.ndarray, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """A Q8_0 tensor, (N, K / 32 * 34) uint8 -> (N, K) in ``dtype`` (``d * c``, computed in float32)."""
    n, width = raw.shape
    blocks = np.ascontiguousarray(raw).reshape(n, width // _Q8_0_BYTES, _Q8_0_BYTES)  # (N, nb, 34)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)  # (N, nb, 1)
    c = blocks[..., 2:].copy().view(np.int8).astype(np.float32)  # (N, nb, 32)
    return torch.from_numpy((c * d).reshape(n, -1)).to(dtype)


def rotary_row_order(rows: int, heads: int) -> Tensor:
    """The row permutation transformers' GGUF loader applies to ``attn_q`` (heads = query heads) and
    ``attn_k`` (heads = key/value heads): new row i is stored row ``order[i]``."""
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(rows)


@dataclass
class Int4Weight:
    """A linear layer's weight for the int4 kernel: ``packed`` (the kernel's layout of the codes) and
    ``scales_zeros`` (K / 32, N, 2) bfloat16; N outputs, K inputs."""

    packed: Tensor
    scales_zeros: Tensor
    out_features: int
    in_features: int


def pack_q4_1(codes: Tensor, d: Tensor, m: Tensor) -> Int4Weight:
    """Codes (N, K), d and m (N, K / 32) -> the int4 kernel's weight (module terms: int4 group)."""
    n, k = codes.shape
    if k % GROUP or n % 16:
        raise ValueError(f"the int4 kernel needs K a multiple of {GROUP} and N of 16, not ({n}, {k})")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), INNER_K_TILES)
    sz = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)  # (K/32, N, 2)
    return Int4Weight(packed, sz, n, k)


def int4_linear(x: Tensor, w: Int4Weight) -> Tensor:
    """(..., K) bfloat16 -> (..., N) bfloat16 through the int4 kernel."""
    h = x.reshape(-1, w.in_features)  # (r, K)
    y = torch._weight_int4pack_mm_for_cpu(h, w.packed, GROUP, w.scales_zeros)  # (r, N)
    return y.view(*x.shape[:-1], w.out_features)
