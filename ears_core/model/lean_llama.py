"""The lean target: a Llama decoder run by hand from 4-bit weights, with transformers' calling convention.

Terms
-----
lean step     one target pass with none of the general model's per-call machinery: every layer's seven
              linear layers run from Q4_1 blocks on the CPU int4 kernel (gguf_q4.py), q/k/v fused into
              one matrix and gate/up into another, bfloat16 activations, ``F.rms_norm``, the rotation as
              one roll and two multiplies, one scaled-dot-product call over a preallocated cache
              (lean_cache.py), and the output head in bfloat16 through a oneDNN-packed weight.
numerics      the lean target is its own function, and it is *the* target wherever it runs:
              target-only and speculative decoding both call it. It computes the GGUF's own weights
              (scales rounded to bfloat16) in bfloat16; the float32 reference (``EARS_LEAN=0``)
              computes the same blocks dequantised in float32 (how closely their greedy texts agree:
              docs/benchmarks.md).
exact rows    row j of a pass over m tokens must equal, bit for bit, a one-token pass at its position, or
              greedy speculative output parts from target-only output. The int4 kernel and the packed
              head are row-invariant (up to ``ROW_CAP`` rows a call); the attention is not in bfloat16,
              so by default it runs in float64 (products of bfloat16 numbers are exact there; the output,
              rounded back, does not depend on the summation order) over a float64 cache.
calling       ``model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=k,
              output_hidden_states=..., attention_mask=..., position_ids=...)`` as the decode loop calls a
              transformers model: ``attention_mask`` None (causal after the cache) or a (1, 1, m, n + m)
              additive or boolean mask (a tree pass), ``position_ids`` None (consecutive) or (1, m).
              ``new_cache()`` makes the cache; ``hidden_states`` has transformers' layout: the embeddings,
              each layer's output, and the last one after the final norm. Batch 1, CPU only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ears_core.model.attention import one_sequence, visible_positions
from ears_core.model.gguf_q4 import GROUP, Int4Weight
from ears_core.model.lean_cache import LeanCache
from ears_core.model.static_decoder import rotation_tables

__all__ = ["LeanLayer", "LeanLlama", "LeanOutput", "ROW_CAP"]

ROW_CAP = 16  # rows per kernel call: a longer pass (a prompt) runs in chunks, as a few rows would


@dataclass
class LeanOutput:
    """What a pass returns, by transformers' names: logits (1, kept, V); hidden_states or None."""

    logits: Tensor
    hidden_states: tuple[Tensor, ...] | None
    past_key_values: LeanCache


@dataclass
class LeanLayer:
    """One decoder layer's weights: norms (d,) bfloat16 and four int4 matrices."""

    attn_norm: Tensor
    qkv: Int4Weight  # (H D + 2 Hkv D) x d: q, k, v stacked
    o: Int4Weight  # d x H D
    mlp_norm: Tensor
    gate_up: Int4Weight  # 2 I x d: gate, then up
    down: Int4Weight  # d x I


class _Tied(nn.Module):
    """The output head as an object with a ``weight`` (V, d), as ``get_output_embeddings()`` returns."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight


def int4_rows(x: Tensor, w: Int4Weight) -> Tensor:
    """(r, K) contiguous bfloat16 rows -> (r, N) through the int4 kernel, in one call."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, w.packed, GROUP, w.scales_zeros)


def _linear_for(m: int, plan: dict[int, tuple[int, ...]]) -> Any:
    """The int4 layer call for passes over m rows: one kernel call, or the planned chunks (module terms: exact rows)."""
    sizes = plan.get(m) if plan else None
    if sizes is None and m > ROW_CAP:
        sizes = ROW_CAP
    if sizes is None or (not isinstance(sizes, int) and len(sizes) == 1):
        return int4_rows
    return lambda x, w: torch.cat([int4_rows(c, w) for c in x.split(sizes)])


def _chunked(fn: Any, x: Tensor) -> Tensor:
    """fn over the rows of x (r, ...), at most ``ROW_CAP`` at a time (module terms: exact rows)."""
    return fn(x) if x.shape[0] <= ROW_CAP else torch.cat([fn(c) for c in x.split(ROW_CAP)])


class LeanLlama(nn.Module):
    """A Llama-architecture causal LM from int4 layers (module terms). Build with ``lean_target.py``."""

    def __init__(self, config: Any, layers: list[LeanLayer], embedding: Tensor, final_norm: Tensor,
                 attn_dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        from transformers import GenerationConfig

        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config)  # end-of-sequence ids, as transformers'
        text = config.get_text_config()
        self.heads, self.kv_heads = int(text.num_attention_heads), int(text.num_key_value_heads)
        self.hidden = int(text.hidden_size)
        self.head_dim = int(getattr(text, "head_dim", None) or self.hidden // self.heads)
        self.eps = float(text.rms_norm_eps)
        self.layers = layers
        self.embed = nn.Embedding.from_pretrained(embedding, freeze=True)  # (V, d) bfloat16, tied to the head
        self.head = _Tied(self.embed.weight)
        self._head_packed = torch.ops.mkldnn._reorder_linear_weight(embedding, None)  # oneDNN layout, same values
        self.final_norm = final_norm
        self.attn_dtype = attn_dtype
        self.row_plan: dict[int, tuple[int, ...]] = {}  # rows -> chunk sizes for the int4 calls (lean_plan.py)
        positions = int(getattr(text, "max_position_embeddings", 8192))
        cos, sin = rotation_tables(LlamaRotaryEmbedding(text), self.head_dim, positions)  # (P, D) each, float32
        # per head of the fused q/k/v output: q and k heads rotate, v heads pass (cos 1, sin 0: the same bits)
        rotates = torch.arange(self.heads + 2 * self.kv_heads) < self.heads + self.kv_heads  # (H + 2 Hkv,)
        self._cos = torch.where(rotates[None, :, None], cos[:, None], 1.0).to(torch.bfloat16)  # (P, H + 2 Hkv, D)
        self._sin = torch.where(rotates[None, :, None], sin[:, None], 0.0).to(torch.bfloat16)
        self.ears_kernels = "lean-int4"

    # -------------------------------------------------------------------- transformers' accessors
    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def new_cache(self, capacity: int = 256) -> LeanCache:
        """An empty cache for this model (module terms)."""
        return LeanCache(len(self.layers), self.kv_heads, self.head_dim, self.attn_dtype, capacity)

    # -------------------------------------------------------------------- the pass
    def _logits(self, h: Tensor) -> Tensor:  # (r, d) -> (r, V)
        return torch.ops.mkldnn._linear_pointwise(h, self._head_packed, None, "none", [], "")

    @staticmethod
    def _mask(attention_mask: Tensor | None, m: int, n: int) -> Tensor | None:
        """A (1, 1, m, n + m) bool mask, True where a row may attend; None for one row and no mask."""
        seen = visible_positions(attention_mask, "the lean target")
        if seen is None:
            return None if m == 1 else torch.ones(m, n + m, dtype=torch.bool).tril(n)[None, None]
        return seen[..., : n + m]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values: LeanCache | None = None, use_cache: bool = True, logits_to_keep: int = 0,
                output_hidden_states: bool = False, **unused: Any) -> LeanOutput:
        m = one_sequence(input_ids, "the lean target")
        cache = past_key_values if past_key_values is not None else self.new_cache()
        if not isinstance(cache, LeanCache):
            raise TypeError(f"the lean target keeps its keys and values in a LeanCache, not a {type(cache).__name__}: "
                            "make one with model.new_cache() (ears_core.model.kv_cache.new_cache)")
        n = cache.length
        cache.reserve(m)
        if position_ids is None:
            cos, sin = self._cos[n: n + m], self._sin[n: n + m]  # (m, 1, D)
        else:
            pos = position_ids.reshape(-1)
            cos, sin = self._cos[pos], self._sin[pos]
        mask = self._mask(attention_mask, m, n)
        x = self.embed(input_ids[0])  # (m, d)
        hidden = [x] if output_hidden_states else None
        h_q, h_kv, dim, half = self.heads, self.kv_heads, self.head_dim, self.head_dim // 2
        end, adt, lin, shape, eps = n + m, self.attn_dtype, _linear_for(m, self.row_plan), (self.hidden,), self.eps
        for layer, (kv, k_all, v_all) in zip(self.layers, cache.layer_views()):
            h = F.rms_norm(x, shape, layer.attn_norm, eps)  # (m, d)
            qkv = lin(h, layer.qkv).view(m, h_q + 2 * h_kv, dim)  # (m, H + 2 Hkv, D)
            qkv = torch.addcmul(qkv * cos, qkv.roll(half, -1), sin)  # q and k rotated, v as it was
            kv[:, :, n:end].copy_(qkv[:, h_q:].view(m, 2, h_kv, dim).permute(1, 2, 0, 3))  # (2, Hkv, m, D) new keys, values
            q = qkv[:, :h_q].transpose(0, 1)[None].to(adt)  # (1, H, m, D)
            a = F.scaled_dot_product_attention(q, k_all[:, :, :end], v_all[:, :, :end], attn_mask=mask,
                                               enable_gqa=h_q != h_kv)  # (1, H, m, D)
            a = a[0].to(x.dtype).transpose(0, 1).reshape(m, h_q * dim)  # (m, H D)
            x = x + lin(a, layer.o)
            h = F.rms_norm(x, shape, layer.mlp_norm, eps)
            gu = lin(h, layer.gate_up)  # (m, 2 I)
            inner = gu.shape[1] // 2
            x = x + lin(F.silu(gu[:, :inner]) * gu[:, inner:], layer.down)
            if hidden is not None:
                hidden.append(x)
        cache.length = end
        x = F.rms_norm(x, (self.hidden,), self.final_norm, self.eps)  # (m, d)
        if hidden is not None:
            hidden[-1] = x  # transformers' layout: the last hidden state after the final norm
        keep = x if not logits_to_keep else x[-logits_to_keep:]
        logits = _chunked(self._logits, keep)[None]  # (1, kept, V)
        states = None if hidden is None else tuple(t[None] for t in hidden)  # each (1, m, d)
        return LeanOutput(logits, states, cache)

    @torch.inference_mode()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, max_new_tokens: int = 20,
                 do_sample: bool = False, temperature: float = 1.0, eos_token_id: int | list[int] | None = None,
                 **unused: Any) -> Tensor:
        """transformers' ``generate`` for the common case: greedy or plain sampling (torch's global generator),
        one sequence, stopping at an end-of-sequence token -> (1, T + new) ids. Other options (top-k, top-p,
        assistant models) are not taken: ``ears_core.autoregressive`` and ``generate`` are the full decoders."""
        if any(unused.get(key) for key in ("assistant_model", "prompt_lookup_num_tokens", "num_beams")):
            raise ValueError("the lean target's generate() decodes plainly; use ears_core.generate for speculative decoding")
        eos = eos_token_id if eos_token_id is not None else self.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        cache, inp, out = self.new_cache(), input_ids, [input_ids]
        for _ in range(max_new_tokens):
            logits = self(inp, attention_mask=attention_mask if inp is input_ids else None, past_key_values=cache,
                          logits_to_keep=1).logits[:, -1].float()  # (1, V)
            tok = (torch.multinomial(torch.softmax(logits / temperature, -1), 1) if do_sample
                   else logits.argmax(-1, keepdim=True))  # (1, 1)
            out.append(tok)
            if int(tok) in stops:
                break
            inp = tok
        return torch.cat(out, dim=1)

    def extra_repr(self) -> str:
        return (f"layers={len(self.layers)}, hidden={self.hidden}, heads={self.heads}/{self.kv_heads}, "
                f"int4 linears, attention in {str(self.attn_dtype).removeprefix('torch.')}")
