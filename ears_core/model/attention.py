"""Which scaled-dot-product attention kernels a target runs with on CUDA.

Terms
-----
re-planning   cuDNN's attention backend (``torch.backends.cuda.enable_cudnn_sdp``) builds an execution plan
              for every new (query length, key length) shape it meets. Target-only decoding meets few new
              shapes; speculative decoding meets one every round (a verify pass over m = k + 1 tokens, k
              chosen per round, on a cache that grew), and each new plan costs tens of milliseconds, more
              than the pass itself. Without it PyTorch picks FlashAttention or the memory-efficient kernel,
              which need no plan. The measurement is in docs/gpu.md.
scope         a process-wide switch (PyTorch keeps these flags globally), set by the decode loop and the
              target-only baseline alike, so speculative and target-only decoding keep the same numerics.
"""

from __future__ import annotations

import torch

__all__ = ["avoid_replanning_attention"]


def avoid_replanning_attention(device: torch.device) -> None:
    """On CUDA, turn off cuDNN's attention backend (see the module's terms); elsewhere, nothing."""
    if device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled():
        torch.backends.cuda.enable_cudnn_sdp(False)
