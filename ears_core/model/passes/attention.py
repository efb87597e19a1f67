"""The calling convention of hand-run passes (the lean target, a graphed model), and which attention kernels
a CUDA target runs.

Terms
-----
re-planning   cuDNN's attention plans (tens of ms) each new (query, key) length, as speculative decoding meets every
              round: off (process-wide, for both decodings), PyTorch picks a kernel needing none (docs/gpu.md).
one sequence  the hand-run passes decode batch 1; anything else is refused, naming the model.
visible       what a hand-run pass reads from ``attention_mask``: a tree pass's (1, 1, m, L) mask, additive or
              bool; or a (B, T) padding mask, which must be all ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ears_core.model.passes.kv_cache import KVBuffer

__all__ = ["PassOutput", "avoid_replanning_attention", "pass_inputs"]


@dataclass
class PassOutput:
    """logits (1, kept, V), or None for a pass asked for its states alone; hidden_states (the embeddings, each
    layer's output, the last after the final norm, each (1, m, d)) or None; past_key_values the cache (a KVBuffer);
    states (1, kept, d): the kept rows after the final norm, where the head was left for the caller."""

    logits: torch.Tensor | None
    hidden_states: tuple[torch.Tensor, ...] | None
    past_key_values: Any
    states: torch.Tensor | None = None


def avoid_replanning_attention(device: torch.device) -> None:
    """On CUDA, turn off cuDNN's attention backend (module terms: re-planning); elsewhere, nothing."""
    if device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled():
        torch.backends.cuda.enable_cudnn_sdp(False)


def pass_inputs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, cache: Any, who: str,
                store: Any = None) -> tuple[int, Any, torch.Tensor | None]:
    """m (the new tokens of the (1, m) ids: module terms, one sequence), the cache (``model.new_cache()`` for None:
    a KVBuffer, on ``store`` where given) and the visible positions (module terms: visible) of a hand-run pass
    over ``input_ids``; the errors name ``who`` and the fix."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"{who} decodes one sequence at a time: ids (1, T), not {tuple(input_ids.shape)}")
    cache = cache if cache is not None else model.new_cache()
    if not isinstance(cache, KVBuffer) or (store is not None and cache.kv is not store):
        where = " on its own store" if store is not None else ""
        raise TypeError(f"{who} keeps its keys and values in a KVBuffer{where}, not this {type(cache).__name__}: "
                        "make one with model.new_cache() (ears_core.model.passes.kv_cache.new_cache)")
    return int(input_ids.shape[1]), cache, _visible(attention_mask, who)


def _visible(attention_mask: torch.Tensor | None, who: str) -> torch.Tensor | None:
    """(1, 1, m, L) bool, True where a row may attend, from a tree pass's additive or bool mask; None for no mask
    or an all-ones (B, T) padding mask (module terms: visible)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        if not bool(attention_mask.all()):
            raise ValueError(f"{who} takes no padding: pass unpadded ids, batch 1")
        return None
    return attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
