"""Edits of a transformers ``DynamicCache`` after a verify pass: drop the positions that did not stand.

Terms
-----
layer      one ``DynamicLayer``: ``keys`` and ``values`` (B, H, L, D), L the cached positions.
crop       drop the last n positions of every layer (a chain round whose drafts did not all stand).
           ``DynamicCache.crop`` does it with an Ellipsis slice per tensor, a few microseconds each
           (docs/measurements.md); ``narrow`` makes the same views.
keep       keep chosen positions in a chosen order (a tree round keeps its accepted path).
Only full-attention (dynamic) layers are edited here; another kind of layer (sliding window, say)
is cropped by its own ``crop``, and cannot be rearranged. A model with a cache of its own (the lean
target's and the head's ``KVBuffer``: model/passes/decoder.py; a graphed model's ``SlotCache``: model/cuda/cuda_graphs.py) makes it
with ``new_cache()``, and the cache does its own edits: both are ``PositionCache``s, a length over a
preallocated buffer.
"""

from __future__ import annotations

from typing import Any, Iterator

from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["PositionCache", "cache_device", "doubled_capacity", "drop_last_positions", "keep_tail_positions",
           "new_cache"]


def doubled_capacity(capacity: int, need: int) -> int:
    """The capacity a preallocated cache grows to for ``need`` positions: doubled until it holds them."""
    while capacity < need:
        capacity *= 2
    return capacity


class PositionCache:
    """What the project's own caches share (model/passes/decoder.py, model/cuda/cuda_graphs.py): ``length`` filled
    positions of a preallocated (L, 2, Hkv, C, D) buffer, edited under transformers' names."""

    length: int

    def _held(self) -> Tensor:
        """The (L, 2, Hkv, C, D) buffer to edit in place."""
        raise NotImplementedError

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Cached positions (transformers' name, so code written for its caches reads it)."""
        return self.length

    def drop_last(self, n: int) -> None:
        """Drop the last n >= 0 cached positions (they stay in memory and are overwritten next)."""
        if n < 0 or n > self.length:
            raise ValueError(f"cannot drop {n} of {self.length} cached positions")
        self.length -= n

    def crop(self, max_length: int) -> None:
        """transformers' ``crop``: a negative argument drops that many positions, else keeps the first
        max_length (at most the cached positions: more raises ValueError)."""
        if max_length > self.length:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {max_length}")
        self.length = self.length + max_length if max_length < 0 else max_length

    def keep_tail(self, start: int, keep: Tensor) -> None:
        """Keep [0, start), then positions ``keep`` (ascending, each >= start) in that order, for all layers at once."""
        buf = self._held()
        n = int(keep.numel())
        buf[:, :, :, start: start + n] = buf.index_select(3, keep.to(buf.device))  # gathered first: overlaps are safe
        self.length = start + n


def new_cache(model: Any) -> Any:
    """An empty KV cache for ``model``: its own (``model.new_cache()``) where it has one, else a DynamicCache."""
    make = getattr(model, "new_cache", None)
    return make() if make is not None else DynamicCache(config=model.config)


def cache_device(cache: Any) -> Any:
    """The device a cache's tensors live on."""
    buf = getattr(cache, "buf", None)
    return buf.device if buf is not None else cache.layers[0].keys.device


def drop_last_positions(cache: DynamicCache, n: int) -> None:
    """Drop the last ``n`` >= 0 positions of every layer, in place (views: nothing is copied)."""
    if n <= 0:
        return
    if hasattr(cache, "drop_last"):
        cache.drop_last(n)
        return
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            layer.crop(-n)
        elif layer.is_initialized:
            keep = layer.keys.shape[-2] - n
            layer.keys = layer.keys.narrow(-2, 0, keep)  # (B, H, L - n, D)
            layer.values = layer.values.narrow(-2, 0, keep)


def _filled_layers(cache: DynamicCache) -> Iterator[Any]:
    """The cache's layers that hold positions; only full-attention (dynamic) layers can be rearranged."""
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(f"tree decoding rearranges full-attention caches only, not {type(layer).__name__}")
        if layer.is_initialized:
            yield layer


def keep_tail_positions(cache: DynamicCache, start: int, keep: Tensor) -> None:
    """Keep positions [0, start) as they are, then the positions ``keep`` (ascending, each >= start)
    in that order, in every layer: only the kept tail is copied, in place; the layers end as views."""
    if hasattr(cache, "keep_tail"):
        cache.keep_tail(start, keep)
        return
    n = int(keep.numel())
    for layer in _filled_layers(cache):
        idx = keep.to(layer.keys.device)
        for name in ("keys", "values"):
            t = getattr(layer, name)  # (B, H, L, D)
            t.narrow(-2, start, n).copy_(t.index_select(-2, idx))  # gathered first, so overlaps are safe
            setattr(layer, name, t.narrow(-2, 0, start + n))
