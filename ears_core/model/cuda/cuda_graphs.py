"""Captured CUDA graphs and the static KV state they replay over.

Terms
-----
graph bank    ``GraphBank``: one captured CUDA graph per key (a pass's width and KV bucket), captured on first
              use and replayed after. A capture records a function's kernels reading and writing fixed
              buffers; a replay launches all of them with one call, so a pass costs what its kernels cost,
              not what launching them from Python costs. Capture runs the function once first on a side
              stream (the warm-up torch asks for). That warm-up computes exactly what the replay computes
              (the same inputs, the same cache slots written with the same values), so capturing in the
              middle of a generation changes nothing. Off CUDA, or switched off, ``run`` just calls.
static KV     ``StaticKV``: a model's one preallocated (L, 2, Hkv, C, D) buffer, which every captured graph
              of that model reads and writes. It grows (doubling C) only past its capacity, and then every
              graph is captured again.
slot cache    ``SlotCache``: one generation's cache on a static KV: its length, and the buffer while it
              holds it. Another generation's cache may take the buffer (a baseline run between two
              speculative ones, say): the holder's filled slots are copied aside and copied back when it
              is used again, so any number of caches coexist and only the one in use sits in the buffer.
threads       a model's passes share its buffer and the graphs' input and output buffers, so a pass, with the
              copy of its outputs, holds the buffer's lock: decodes in several threads (two visitors of the
              app) take turns pass by pass, each in its own slots.
bucket        the KV slots a pass attends over: the smallest power of two >= 256 that holds the cache
              after the pass, at most the capacity. A graph is captured per (width, bucket).
switch        ``EARS_CUDA_GRAPHS``: 1 (the default) captures on CUDA, 0 keeps every pass eager.
fallback      a capture that fails (a device or driver that refuses it) turns capture off for that bank: the
              pass runs eagerly then and after, with the same kernels, and ``failed`` says why.
"""

from __future__ import annotations

import copy
import os
import threading
import time
import weakref
from typing import Any, Callable

import torch
from torch import Tensor

from ears_core.model.passes.kv_cache import PositionCache, doubled_capacity

__all__ = ["GraphBank", "StaticKV", "SlotCache", "bucket", "graphs_wanted", "MIN_BUCKET"]

MIN_BUCKET = 256


def graphs_wanted(device: torch.device) -> bool:
    """Whether passes on ``device`` are captured (module terms: switch)."""
    flag = os.environ.get("EARS_CUDA_GRAPHS", "1").strip().lower()
    if flag not in {"0", "1", "false", "true", "no", "yes", "off", "on"}:
        raise ValueError(f"EARS_CUDA_GRAPHS={flag!r}: use 1 (capture CUDA graphs, the default) or 0 (eager)")
    return device.type == "cuda" and flag in {"1", "true", "yes", "on"}


def bucket(need: int, capacity: int) -> int:
    """The slots a pass attends over (module terms)."""
    return min(doubled_capacity(MIN_BUCKET, need), capacity)


class GraphBank:
    """Captured graphs by key (module terms)."""

    def __init__(self, device: torch.device, capture: bool) -> None:
        self.capture = capture and device.type == "cuda"
        self.graphs: dict[Any, tuple[Any, Any]] = {}
        self.pool: Any = None
        self.capture_s = 0.0  # seconds spent capturing, warm-ups included
        self.replays = 0
        self.failed: str | None = None  # why capture stopped here (module terms: fallback), None while it runs

    def run(self, key: Any, fn: Callable[[], Any]) -> Any:
        """fn's outputs, from the graph captured for ``key`` (captured now if new); fn() reads and writes
        only buffers that outlive the graph."""
        if not self.capture:
            return fn()
        hit = self.graphs.get(key)
        if hit is None:
            t0 = time.perf_counter()
            try:
                hit = self.graphs[key] = self._capture(fn)
            except Exception as exc:  # noqa: BLE001 - any failure to capture means: run eagerly from now on
                self.capture, self.failed = False, f"capture failed: {type(exc).__name__}: {exc}".splitlines()[0]
                self.graphs.clear()
                return fn()
            finally:
                self.capture_s += time.perf_counter() - t0
        hit[0].replay()
        self.replays += 1
        return hit[1]

    def _capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # the warm-up: what the replay will compute (module terms)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out

    def clear(self) -> None:
        self.graphs.clear()


class StaticKV:
    """A model's preallocated KV buffer, who holds it, and the graphs that read it (module terms)."""

    def __init__(self, make: Callable[[int], Tensor], capacity: int, bank: GraphBank) -> None:
        self.make, self.banks = make, [bank]  # every bank whose graphs read this buffer
        self.lock = threading.RLock()  # held over a pass and the copy of its outputs (module terms: threads)
        self.buf = make(capacity)  # (L, 2, Hkv, C, D)
        self._holder: Any = None  # a weak reference: a finished generation's slots are not copied aside

    @property
    def holder(self) -> "SlotCache | None":
        return self._holder() if self._holder is not None else None

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[3])

    def take(self, cache: "SlotCache") -> Tensor:
        """The buffer, held by ``cache`` (module terms: slot cache)."""
        with self.lock:
            return self._take(cache)

    def _take(self, cache: "SlotCache") -> Tensor:
        if self.holder is not cache:
            held = self.holder
            if held is not None:
                held.saved = self.buf[:, :, :, : held.length].clone()
            if cache.saved is not None:
                self.buf[:, :, :, : cache.saved.shape[3]] = cache.saved
                cache.saved = None
            self._holder = weakref.ref(cache)
        return self.buf

    def grow(self, need: int) -> None:
        """Room for ``need`` slots: a doubled buffer, the holder's slots copied, every graph dropped."""
        with self.lock:
            self._grow(need)

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        grown = self.make(doubled_capacity(self.capacity, need))
        held = self.holder
        if held is not None:
            grown[:, :, :, : held.length] = self.buf[:, :, :, : held.length]
        self.buf = grown
        for bank in self.banks:
            bank.clear()


class SlotCache(PositionCache):
    """One generation's KV cache on a ``StaticKV`` (module terms), with transformers' cache names."""

    def __init__(self, kv: StaticKV) -> None:
        self.kv, self.length, self.saved = kv, 0, None
        kv.take(self)  # a new generation starts in the buffer

    @property
    def buf(self) -> Tensor:
        """The static buffer (held by this cache or not: for its device and dtype)."""
        return self.kv.buf

    def buffer(self, extra: int = 0) -> Tensor:
        """The (L, 2, Hkv, C, D) buffer, held, with room for ``extra`` more positions."""
        self.kv.take(self)
        self.kv.grow(self.length + extra)
        return self.kv.buf

    def _held(self) -> Tensor:
        return self.buffer()

    @torch.inference_mode()
    def keep_tail(self, start: int, keep: Tensor) -> None:
        with self.kv.lock:  # the buffer is taken and edited in one go (module terms: threads)
            super().keep_tail(start, keep)

    def __deepcopy__(self, memo: dict) -> "SlotCache":
        fresh = copy.copy(self)
        with self.kv.lock:
            fresh.saved = self.kv.buf[:, :, :, : self.length].clone() if self.kv.holder is self else self.saved.clone()
        return fresh
