"""Which scaled-dot-product attention kernels a target runs with on CUDA.

Terms
-----
re-planning   cuDNN's attention backend (``torch.backends.cuda.enable_cudnn_sdp``) builds an execution plan
              for every new (query length, key length) shape it meets. Target-only decoding meets few new
              shapes; speculative decoding meets one every round (a verify pass over m = k + 1 tokens, k
              chosen per round, on a cache that grew), and each new plan costs tens of milliseconds, more
              than the pass itself. Without it PyTorch picks FlashAttention or the memory-efficient kernel,
              which need no plan. The measurement is in docs/gpu.md.
one sequence  ``one_sequence``: the hand-run passes decode batch 1; anything else is refused, naming the model.
visible       ``visible_positions``: what a hand-run pass (the lean target, a graphed model) reads from the
              ``attention_mask`` transformers' callers give: a tree pass's (1, 1, m, L) mask, additive or
              bool; or a (B, T) padding mask, which must be all ones (batch 1, no padding).
scope         a process-wide switch (PyTorch keeps these flags globally), set by the decode loop and the
              target-only baseline alike, so speculative and target-only decoding keep the same numerics.
"""

from __future__ import annotations

import torch

__all__ = ["avoid_replanning_attention", "one_sequence", "visible_positions"]


def avoid_replanning_attention(device: torch.device) -> None:
    """On CUDA, turn off cuDNN's attention backend (see the module's terms); elsewhere, nothing."""
    if device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled():
        torch.backends.cuda.enable_cudnn_sdp(False)


def one_sequence(input_ids: torch.Tensor, who: str) -> int:
    """m, the new tokens of a hand-run pass's (1, m) ids (module terms: one sequence)."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"{who} decodes one sequence at a time: ids (1, T), not {tuple(input_ids.shape)}")
    return int(input_ids.shape[1])


def visible_positions(attention_mask: torch.Tensor | None, who: str) -> torch.Tensor | None:
    """(1, 1, m, L) bool, True where a row may attend, from a tree pass's additive or bool mask; None for no mask
    or an all-ones (B, T) padding mask (module terms: visible). ``who`` names the model in the error."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        if not bool(attention_mask.all()):
            raise ValueError(f"{who} takes no padding: pass unpadded ids, batch 1")
        return None
    return attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
