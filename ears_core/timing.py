"""Step timing for the decode loops, without a host synchronisation per token.

Terms
-----
mark        a point in time: ``time.perf_counter()`` on CPU; on CUDA a
            ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream, so taking
            it costs no synchronisation (the GPU stamps it when it gets there).
ms(a, b)    milliseconds between two marks. On CUDA it reads the events' elapsed time, which
            is only valid once both have completed: it waits for b when b is still queued (a
            captured pass returns before its kernels have run), so call it after the round's
            existing host sync (the verdict's ``.tolist()``), where b has almost always completed.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["StepClock"]


class StepClock:
    """Wall time on CPU (and any non-CUDA device); CUDA events on a GPU."""

    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        """Milliseconds from mark a to mark b (on CUDA: after a sync that covers b)."""
        if not self.cuda:
            return (b - a) * 1000.0
        if not b.query():
            b.synchronize()
        return float(a.elapsed_time(b))
