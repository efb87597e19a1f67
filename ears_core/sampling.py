"""Logits to probabilities, and seeded random draws.

Terms
-----
temperature T   logits are divided by T before the softmax; T = 0 means greedy: the
                distribution is one-hot on the argmax of the logits.
top-k, top-p    after temperature, keep the k most likely tokens / the smallest set whose mass
                reaches p; everything else gets probability exactly 0. The same
                ``SamplingConfig`` is applied to draft and target logits, so both are judged
                on the same support.
draw            a number U in [0, 1). Draws are *counter based*: the draw for output position n
                of stream s under seed S is a hash of (S, n, s). Two runs on the same prompt and
                seed therefore see the same draws wherever their paths agree, whatever rule
                they use, and no generator state needs to be carried, synced or rolled back.
streams         DRAFT (the draft's proposal at n), ACCEPT (the U that verifies the draft at n),
                TARGET (a token drawn from the target at n: residual, bonus, or plain decoding).

A token is drawn from a distribution with one draw by inverting the CDF, which never picks a
token of probability 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Sequence

import torch
from torch import Tensor

__all__ = [
    "SamplingConfig",
    "Stream",
    "logits_to_probs",
    "counter_uniforms",
    "sample_with_uniforms",
    "search_cdf",
    "first_argmax",
    "host_uniforms",
    "splitmix64",
    "chained_keys",
]


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become the distribution that tokens are drawn from and judged against."""

    temperature: float = 0.9
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(
                f"temperature must be >= 0, got {self.temperature!r}; use 0 for greedy decoding "
                "or a positive value such as 0.9 for sampling"
            )
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: Tensor, config: SamplingConfig) -> Tensor:
    """(..., V) logits -> (..., V) float32 probabilities under ``config``."""
    logits = logits.float()
    if config.greedy:
        top = first_argmax(logits, keepdim=True)  # (..., 1)
        return torch.zeros_like(logits).scatter_(-1, top, 1.0)
    logits = logits / config.temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p is not None and config.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)  # (..., V)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of strictly more likely tokens
        drop_sorted = mass_before >= config.top_p  # the token that crosses top_p is kept
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


class Stream(IntEnum):
    """Independent families of draws; see the module docstring."""

    DRAFT = 1
    ACCEPT = 2
    TARGET = 3


MASK64 = (1 << 64) - 1


def _i64(c: int) -> int:
    """An unsigned 64-bit constant as the signed int64 with the same bits."""
    c &= MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)
_POS = _i64(0xD6E8FEB86659FD93)
_STREAM = _i64(0xCA5A826395121157)


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix(x: Tensor) -> Tensor:
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def counter_uniforms(seed: int | Tensor, positions: Tensor, stream: Stream) -> Tensor:
    """Draws in [0, 1) for each output position: a pure function of (seed, position, stream).

    seed: an int, or a (B, 1) int64 tensor for per-row seeds; positions: int64 tensor of any
    shape (broadcast against seed). Returns float32 with 24 random bits, so U < 1 exactly.
    """
    positions = positions.to(torch.int64)
    if isinstance(seed, int):  # the stream's key on the host: no tensor made from a Python number
        x = _i64(splitmix64((seed * _GOLDEN + int(stream) * _STREAM) & MASK64))
    else:
        x = _splitmix(torch.as_tensor(seed, dtype=torch.int64, device=positions.device) * _GOLDEN
                      + _i64(int(stream) * _STREAM))
    x = _splitmix(x ^ (positions * _POS))
    return _shr(x, 40).to(torch.float32) * (1.0 / (1 << 24))


def first_argmax(x: Tensor, keepdim: bool = False) -> Tensor:
    """``x.argmax(dim=-1)``: the index of the first maximum of each row (ties: the lowest index, as
    argmax). ``torch.max`` over a dim finds the same index faster than ``argmax`` on the CPU (timed in
    docs/measurements.md)."""
    return torch.max(x, dim=-1, keepdim=keepdim).indices


def splitmix64(x: int) -> int:
    """``_splitmix`` on one unsigned 64-bit Python integer."""
    x = (x + _GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & MASK64
    return x ^ (x >> 31)


def chained_keys(prefix: int, parts: Tensor) -> Tensor:
    """(m, j) int64 ``parts`` -> (m,) int64: x = splitmix64(x ^ part) over the columns, from x = ``prefix`` (a Python
    integer): ``splitmix64``'s host chain as tensor operations, bit for bit (trees.TreeDraws's keys)."""
    x = parts.new_full(parts.shape[:1], _i64(prefix))  # (m,)
    for j in range(parts.shape[1]):
        x = _splitmix(x ^ parts[:, j])
    return x


def host_uniforms(seed: int, positions: Sequence[int], stream: Stream) -> list[float]:
    """``counter_uniforms(seed, positions, stream)`` for a few positions, with Python integers: the same
    values bit for bit (each a float32 exactly). A tree round's dozen draws cost some 35 tensor ops a
    call on the device, far more than these integer operations (timed in docs/measurements.md)."""
    base = splitmix64((seed * _GOLDEN + int(stream) * _STREAM) & MASK64)
    return [(splitmix64(base ^ ((p * _POS) & MASK64)) >> 40) * (1.0 / (1 << 24)) for p in positions]


def sample_with_uniforms(probs: Tensor, u: Tensor) -> Tensor:
    """Draw one token per row of (..., V) ``probs`` by inverse CDF with (...,) draws ``u``.

    The distribution need not be normalised. A token with probability 0 is never drawn: the
    search returns the first index whose cumulative mass is strictly above u * total.
    """
    return search_cdf(probs.float().cumsum(dim=-1), u)  # (..., V) cumulative mass


def search_cdf(cdf: Tensor, u: Tensor) -> Tensor:
    """The inverse-CDF draw of ``sample_with_uniforms`` given the (..., V) cumulative mass of an
    unnormalised distribution and (...,) draws ``u``."""
    cdf = cdf.contiguous()
    target = (u.float() * cdf[..., -1]).unsqueeze(-1)  # (..., 1)
    idx = torch.searchsorted(cdf, target.contiguous(), right=True)  # (..., 1)
    # u * total can round up to total: fall back to the last token that has mass.
    last = torch.searchsorted(cdf, cdf[..., -1:].contiguous(), right=False)  # (..., 1)
    return torch.minimum(idx, last).squeeze(-1)
