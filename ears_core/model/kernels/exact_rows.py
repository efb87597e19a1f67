"""Target passes whose rows do not depend on how many tokens a pass carries (bfloat16 targets on a CPU).

Terms
-----
row invariance  a pass over m new tokens gives each, bit for bit, the logits of m one-token passes (else greedy
                speculative output parts from target-only output): PyTorch's CPU attention does not in bfloat16.
exact attention q, k, v widened to float64 for the attention alone (one fused SDPA call): bfloat16 products are
                exact there, so the output rounded back does not depend on the summation order.
row cap         oneDNN blocks many rows differently, so a packed layer (packed_linear.py) with a cap of c rows
                runs longer inputs c rows at a time: ``make_rows_exact`` keeps the widest cap of ``CAPS`` under
                which passes of ``CHECKED_WIDTHS`` rows agree (``rows_agree``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CHECKED_WIDTHS", "VERIFY_WIDTHS", "EXACT_ATTENTION", "exact_attention", "make_rows_exact", "rows_agree"]

EXACT_ATTENTION = "ears_float64"  # the name under which transformers' AttentionInterface knows it
CAPS = (32, 16, 8)  # row caps tried, widest first (module terms)
VERIFY_WIDTHS = (2, 9, 17)  # a chain's and a tree's verify passes (K + 1 <= 9, budget + 1 <= 17): rows that must agree
CHECKED_WIDTHS = VERIFY_WIDTHS + (40,)  # and a prompt past a cap (a packed layer's, ``CAPS``)


def exact_attention(module: nn.Module | None, query: Tensor, key: Tensor, value: Tensor,
                    attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: object) -> tuple[Tensor, None]:
    """transformers' attention function: query (B, H, m, D), key and value (B, Hkv, n, D), attention_mask
    (B, 1, m, >= n) additive or None -> output (B, m, H, D) in the query's dtype, no attention weights."""
    h, d = query.shape[1], query.shape[-1]
    kv_heads, n = key.shape[1], key.shape[-2]
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :n]  # (B, 1, m, n)
        mask = mask if mask.dtype == torch.bool else mask.double()
    # one fused float64 pass (scores, mask, softmax, values), grouped queries without copying the keys
    out = F.scaled_dot_product_attention(query.double(), key.double(), value.double(), attn_mask=mask,
                                         scale=scaling if scaling is not None else d ** -0.5,
                                         enable_gqa=h != kv_heads).to(query.dtype)  # (B, H, m, D)
    return out.transpose(1, 2).contiguous(), None


def use_exact_attention(model: nn.Module) -> bool:
    """Switch a transformers model to exact attention; False (and the model unchanged) when the model
    does not dispatch its attention through transformers' AttentionInterface."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(EXACT_ATTENTION, exact_attention)
    AttentionMaskInterface.register(EXACT_ATTENTION, eager_mask)  # an additive mask, never skipped
    setter = getattr(model, "set_attn_implementation", None)
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if setter is None or (can_set is not None and not can_set()):
        return False
    setter(EXACT_ATTENTION)
    return getattr(model.config, "_attn_implementation", None) == EXACT_ATTENTION


@torch.no_grad()
def rows_agree(model: nn.Module, widths: tuple[int, ...] = (9,), prompt_len: int = 24, seed: int = 0) -> bool:
    """Row invariance (module terms) after a ``prompt_len``-token random prompt, for every pass width in ``widths``."""
    from ears_core.model.passes.kv_cache import new_cache

    gen = torch.Generator().manual_seed(seed)
    emb = model.get_input_embeddings().weight  # (V, d)
    widest = max(widths)
    ids = torch.randint(0, emb.shape[0], (1, prompt_len + widest), generator=gen).to(emb.device)  # (1, P + W)
    prompt, new = ids[:, :prompt_len], ids[:, prompt_len:]
    after_prompt = new_cache(model)
    model(prompt, past_key_values=after_prompt, use_cache=True)
    cache = copy.deepcopy(after_prompt)
    narrow = torch.cat([model(new[:, j:j + 1], past_key_values=cache, use_cache=True).logits[0]
                        for j in range(widest)])  # (W, V)
    return all(torch.equal(model(new[:, :w], past_key_values=copy.deepcopy(after_prompt), use_cache=True).logits[0],
                           narrow[:w]) for w in widths)


def make_rows_exact(model: nn.Module) -> int | None:
    """Switch ``model`` to exact attention with a row cap on its packed layers (module terms); the cap, or
    None with the model left as it was when it cannot switch or no cap agrees."""
    from ears_core.model.kernels.packed_linear import PackedLinear

    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    before = getattr(model.config, "_attn_implementation", None)
    if not use_exact_attention(model):
        return None
    for cap in CAPS:
        for layer in packed:
            layer.max_rows = cap
        if rows_agree(model, CHECKED_WIDTHS):
            model.ears_row_cap = cap
            return cap
    for layer in packed:
        layer.max_rows = None
    model.set_attn_implementation(before)
    return None
