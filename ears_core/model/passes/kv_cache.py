"""KV caches: the project's own (``KVBuffer``) and edits of a transformers ``DynamicCache`` after a verify pass.

Terms
-----
KV store   ``KVStore``: one preallocated (L, 2, Hkv, C, D) tensor, the cache that holds it and the graph banks
           that read it (cuda/cuda_graphs.py); past its capacity it doubles C and every bank drops its graphs.
KV buffer  ``KVBuffer``: one generation's cache on a store, its ``length``, with transformers' cache names. When
           another cache takes the tensor (a graphed model's caches share its store), the holder's positions are
           copied aside and back when it is used again, so any number of caches coexist.
threads    a pass, with the copy of its outputs, and an edit hold the store's ``lock``: decodes in several
           threads on one store take turns pass by pass.
crop, keep drop the last n positions (a chain round's drafts that did not stand: ``narrow`` views; a ``KVBuffer``
           lowers its length), or keep chosen positions in a chosen order (a tree round's accepted path).
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["KVBuffer", "KVStore", "cache_device", "doubled_capacity", "drop_last_positions", "keep_tail_positions",
           "new_cache", "on_device"]


def doubled_capacity(capacity: int, need: int) -> int:
    """The capacity a preallocated cache grows to for ``need`` positions: doubled until it holds them."""
    while capacity < need:
        capacity *= 2
    return capacity


class KVStore:
    """A preallocated (L, 2, Hkv, C, D) buffer, the cache that holds it and the banks that read it (module terms)."""

    def __init__(self, buf: Tensor) -> None:
        self.buf = buf  # (L, 2, Hkv, C, D)
        self.banks: list[Any] = []  # whatever keeps graphs over this buffer: cleared when it grows
        self.lock = threading.RLock()  # module terms: threads
        self._holder: Any = None  # a weak reference: a finished generation's positions are not copied aside

    @property
    def holder(self) -> "KVBuffer | None":
        return self._holder() if self._holder is not None else None

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[3])

    def take(self, cache: "KVBuffer", need: int = 0) -> Tensor:
        """The buffer, held by ``cache``, with room for ``need`` positions (module terms: KV buffer)."""
        with self.lock:
            held = self.holder
            if held is not cache:
                if held is not None:
                    held.saved = self.buf[:, :, :, : held.length].clone()
                if cache.saved is not None:
                    self.buf[:, :, :, : cache.saved.shape[3]] = cache.saved
                    cache.saved = None
                self._holder = weakref.ref(cache)
            if need > self.capacity:
                grown = self.buf.new_zeros(*self.buf.shape[:3], doubled_capacity(self.capacity, need), self.buf.shape[4])
                grown[:, :, :, : cache.length] = self.buf[:, :, :, : cache.length]
                self.buf = grown
                for bank in self.banks:
                    bank.clear()
            return self.buf

    def views(self, start: int, end: int) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per layer, a pass's views: where it writes its keys and values, positions [start, end) (2, Hkv, m, D),
        and the keys and values it attends to, [0, end) (1, Hkv, end, D) each. Made with seven operations a pass,
        whatever the number of layers (three a layer cost a lean step 0.5 ms)."""
        seen = self.buf[:, :, :, :end]  # (L, 2, Hkv, end, D)
        return list(zip(self.buf[:, :, :, start:end].unbind(0), seen[:, 0:1].unbind(0), seen[:, 1:2].unbind(0)))


class KVBuffer:
    """One generation's keys and values on a ``KVStore`` (module terms), with transformers' cache names."""

    def __init__(self, kv: KVStore) -> None:
        self.kv, self.length = kv, 0
        self.saved: Tensor | None = None  # (L, 2, Hkv, length, D) while another cache holds the store
        kv.take(self)  # a new generation starts in the buffer

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """transformers' ``crop``: a negative argument drops that many positions, else keeps the first max_length
        (dropped positions stay in memory and are overwritten next)."""
        keep = self.length + max_length if max_length < 0 else max_length
        if not 0 <= keep <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {max_length}")
        self.length = keep

    @property
    def buf(self) -> Tensor:
        """The store's buffer (held by this cache or not: for its device and dtype)."""
        return self.kv.buf

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    def reserve(self, extra: int = 0) -> Tensor:
        """The (L, 2, Hkv, C, D) buffer, held, with room for ``extra`` more positions (doubling C past it)."""
        return self.kv.take(self, self.length + extra)

    def layer_views(self, extra: int = 0) -> list[tuple[Tensor, Tensor, Tensor]]:
        """``reserve(extra)``, then the views per layer (``KVStore.views``) of an exact pass over ``extra`` new
        positions after ``length``."""
        self.reserve(extra)
        return self.kv.views(self.length, self.length + extra)

    @torch.inference_mode()
    def keep_tail(self, start: int, keep: Tensor) -> None:
        """Keep [0, start), then positions ``keep`` (ascending, each >= start) in that order, in every layer."""
        with self.kv.lock:  # the buffer is taken and edited in one go (module terms: threads)
            buf = self.reserve()
            n = int(keep.numel())
            kept = buf.index_select(3, on_device(keep, buf.device))  # gathered first: overlaps are safe
            buf[:, :, :, start: start + n] = kept
            self.length = start + n

    def __deepcopy__(self, memo: dict) -> "KVBuffer":
        fresh = copy.copy(self)
        with self.kv.lock:
            fresh.saved = self.kv.buf[:, :, :, : self.length].clone() if self.kv.holder is self else self.saved.clone()
        return fresh


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
    if isinstance(cache, KVBuffer):
        cache.crop(-n)
        return
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            layer.crop(-n)
        elif layer.is_initialized:
            keep = layer.keys.shape[-2] - n
            layer.keys = layer.keys.narrow(-2, 0, keep)  # (B, H, L - n, D)
            layer.values = layer.values.narrow(-2, 0, keep)


def on_device(t: Tensor, device: torch.device) -> Tensor:
    """t on ``device``: itself where it is there already (no call that could copy)."""
    return t if t.device == device else t.to(device)


def keep_tail_positions(cache: DynamicCache, start: int, keep: Tensor) -> None:
    """Keep positions [0, start) as they are, then the positions ``keep`` (ascending, each >= start)
    in that order, in every layer: only the kept tail is copied, in place; the layers end as views."""
    if hasattr(cache, "keep_tail"):
        cache.keep_tail(start, keep)
        return
    n = int(keep.numel())
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:  # module terms: keep
            raise ValueError(f"tree decoding rearranges full-attention caches only, not {type(layer).__name__}")
        if not layer.is_initialized:
            continue
        idx = on_device(keep, layer.keys.device)
        for name in ("keys", "values"):
            t = getattr(layer, name)  # (B, H, L, D)
            t.narrow(-2, start, n).copy_(t.index_select(-2, idx))  # gathered first, so overlaps are safe
            setattr(layer, name, t.narrow(-2, 0, start + n))
