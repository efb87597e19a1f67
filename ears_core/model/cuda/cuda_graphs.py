"""Captured CUDA graphs: one per pass shape, replayed over a model's one KV store (passes/kv_cache.py: KV store).

Terms
-----
graph bank    ``GraphBank``: one CUDA graph per key (a pass's width and KV bucket), captured on first use and
              replayed after (one launch for all a pass's kernels). The warm-up run before capture computes
              exactly what the replay does, so capturing mid-generation changes nothing. Off CUDA ``run`` calls.
bucket        the KV slots a pass attends over: the smallest power of two >= 256 holding the cache after the pass.
switch        ``EARS_CUDA_GRAPHS``: 1 (the default) captures on CUDA, 0 keeps every pass eager.
fallback      a capture that fails turns capture off for that bank (eager from then on, the same kernels), and
              ``failed`` says why. Under ``torch.cuda.set_sync_debug_mode`` (gpu_check's waits) a key not captured yet
              runs eagerly and is captured at its next use outside it: capturing synchronizes the device.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch

from ears_core.model.passes.kv_cache import doubled_capacity

__all__ = ["GraphBank", "bucket", "graphs_wanted", "MIN_BUCKET"]

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
        self.failed: str | None = None  # why capture stopped here (module terms: fallback), None while it runs

    def run(self, key: Any, fn: Callable[[], Any]) -> Any:
        """fn's outputs from the graph for ``key`` (captured now if new); fn() touches only buffers that outlive it."""
        if not self.capture:
            return fn()
        hit = self.graphs.get(key)
        if hit is None and torch.cuda.is_available() and torch.cuda.get_sync_debug_mode() != 0:
            return fn()  # a capture synchronizes, which that mode would raise at: eager this once (module terms)
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
