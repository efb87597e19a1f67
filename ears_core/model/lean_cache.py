"""The lean target's KV cache: one preallocated tensor for every layer's keys and values.

Terms
-----
buffer     ``buf`` (L, 2, Hkv, C, D): layer, keys (0) or values (1), key/value head, position, head width;
           C the capacity. Positions [0, length) hold the cached prefix; a pass over m tokens writes
           [length, length + m) in place. Nothing is allocated while the capacity lasts; past it the
           buffer doubles (one copy).
crop       ``drop_last(n)`` lowers the length: the positions stay in memory and are overwritten next.
keep tail  ``keep_tail(start, keep)``: positions [0, start) stay, then the positions ``keep`` (ascending,
           each >= start) are moved down in order, for all layers at once (a tree round's accepted path).
dtype      the attention's compute dtype (lean_llama.py): float64 where rows must be exact, else the
           model's; the keys and values are bfloat16 numbers either way, held exactly.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from ears_core.model.kv_cache import PositionCache, doubled_capacity

__all__ = ["LeanCache"]


class LeanCache(PositionCache):
    """The KV cache of a ``LeanLlama`` (module terms); batch 1."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 256,
                 device: torch.device | str = "cpu") -> None:
        self.buf = torch.zeros(layers, 2, kv_heads, capacity, head_dim, dtype=dtype, device=device)  # (L, 2, Hkv, C, D)
        self.length = 0
        self._views: list[tuple[Tensor, Tensor, Tensor]] | None = None

    def layer_views(self) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per layer: keys and values (2, Hkv, C, D), keys (1, Hkv, C, D), values (1, Hkv, C, D): views of the
        buffer, made once per allocation (a pass slices them instead of indexing the buffer anew)."""
        if self._views is None:
            self._views = [(layer, layer[0:1], layer[1:2]) for layer in self.buf.unbind(0)]
        return self._views

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[3])

    def _held(self) -> Tensor:
        return self.buf

    def reserve(self, m: int) -> None:
        """Make room for m more positions (doubling the capacity when it runs out)."""
        need = self.length + m
        if need <= self.capacity:
            return
        grown = self.buf.new_zeros(*self.buf.shape[:3], doubled_capacity(self.capacity, need), self.buf.shape[4])
        grown[:, :, :, : self.length] = self.buf[:, :, :, : self.length]
        self.buf = grown
        self._views = None

    def __deepcopy__(self, memo: dict) -> "LeanCache":
        fresh = copy.copy(self)
        fresh.buf = self.buf.clone()
        fresh._views = None
        return fresh
