"""A Llama-family decoder as one fixed sequence of kernels over preallocated buffers: the form a CUDA graph
can capture.

Terms
-----
static pass   ``run(x, pos, slots, mask, kv, hidden)``: every shape is fixed by its arguments' shapes, and
              nothing in it reads a tensor's value on the host, allocates by a value, or branches on one.
              Where the cache length enters, it enters as data: ``pos`` (m,) the rotary positions,
              ``slots`` (m,) the cache slots the m new keys and values are written to, ``mask`` the
              additive (G m, C) mask over the C slots of the KV view. So one captured replay serves every
              cache length up to C (cuda_graphs.py).
kv            (L, 2, Hkv, C, D): per layer keys (0) and values (1), Hkv key/value heads, C slots, width D.
              Slots past the cache length hold stale entries; the mask hides them.
GQA fold      H query heads share Hkv key/value heads in groups of G = H / Hkv. The queries are laid out
              as (1, Hkv, G m, D), so attention is plain multi-head attention over the Hkv heads (any SDPA
              kernel takes it, a mask included) and the mask is built once per pass as (G m, C), not per
              layer.
fused         q/k/v run as one matrix product and gate/up as another: the transformers modules' own
              weights are re-pointed to slices of the fused ones, so nothing is held twice and the
              model's own (eager) forward computes with the same numbers.
numerics      the decoder's own arithmetic in the model's dtype: ``F.rms_norm``, the rotation as
              transformers' ``x cos + rotate_half(x) sin``, SDPA with the model's scale. It is not bit
              for bit transformers' forward (another kernel order); on a captured target, target-only and
              speculative decoding both run it, so they compare like with like.
supported     ``supports(model)``: a Llama-shaped causal LM (llama, qwen2, mistral without a sliding
              window), SiLU MLP, a rotary embedding whose frequencies do not change with the length, the
              whole model on one device. Anything else keeps transformers' forward (``reason`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["StaticDecoder", "StaticLayer", "supports", "additive_mask_over", "causal_mask", "rotation_tables"]

FAMILIES = ("llama", "qwen2", "mistral")


@dataclass
class StaticLayer:
    """One decoder layer's weights, (out, in) as ``F.linear`` takes them."""

    attn_norm: Tensor  # (d,)
    qkv: Tensor  # (H D + 2 Hkv D, d): q, k, v stacked
    qkv_bias: Tensor | None  # (H D + 2 Hkv D,) or None
    o: Tensor  # (d, H D)
    mlp_norm: Tensor  # (d,)
    gate_up: Tensor  # (2 I, d): gate, then up
    down: Tensor  # (d, I)


def supports(model: Any) -> str | None:
    """None where ``StaticDecoder`` can run ``model``, else the reason it cannot (module terms)."""
    cfg = getattr(model, "config", None)
    body = getattr(model, "model", None)
    if cfg is None or body is None or not hasattr(body, "layers"):
        return "not a transformers causal LM with a decoder body"
    text = cfg.get_text_config()
    kind = str(getattr(text, "model_type", ""))
    if kind not in FAMILIES:
        return f"model type {kind!r} is not one of {', '.join(FAMILIES)}"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "a sliding-window attention model"
    if str(getattr(text, "hidden_act", "silu")) != "silu":
        return f"activation {text.hidden_act!r} (the static pass runs SiLU)"
    if getattr(text, "mlp_bias", False) or getattr(body.layers[0].self_attn.o_proj, "bias", None) is not None:
        return "biases on the output or MLP projections"
    rope = getattr(body, "rotary_emb", None)
    if rope is None or "dynamic" in str(getattr(rope, "rope_type", "default")):
        return "a rotary embedding whose frequencies change with the length"
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        return f"the model is spread over {len(devices)} devices"
    return None


def _fuse(parts: list[nn.Linear]) -> Tensor:
    """One (sum out, in) weight for several linears; each module's weight becomes a view of it."""
    fused = torch.cat([p.weight.detach() for p in parts])
    start = 0
    for p in parts:
        rows = p.weight.shape[0]
        p.weight = nn.Parameter(fused[start: start + rows], requires_grad=False)
        start += rows
    return fused


def _fuse_bias(parts: list[nn.Linear]) -> Tensor | None:
    if all(p.bias is None for p in parts):
        return None
    return torch.cat([p.bias.detach() if p.bias is not None else p.weight.new_zeros(p.weight.shape[0])
                      for p in parts])


def rotation_tables(rotary: nn.Module, head_dim: int, positions: int, device: torch.device | str = "cpu"
                    ) -> tuple[Tensor, Tensor]:
    """(cos, signed sin), each (P, D) float32, for P positions of a transformers rotary embedding, such that
    ``x cos + x.roll(D / 2, -1) sin`` is its ``x cos + rotate_half(x) sin``."""
    with torch.no_grad():
        probe = torch.zeros(1, 1, head_dim, device=device)  # float32: the tables as the embedding computes them
        cos, sin = rotary(probe, torch.arange(positions, device=device)[None])  # (1, P, D) each
    half = head_dim // 2
    sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(device)  # rotate_half(x) = roll(x, half) * sign
    return cos[0], sin[0] * sign


def causal_mask(pos: Tensor, slots: int, groups: int, dtype: torch.dtype) -> Tensor:
    """The additive (G m, C) mask of a pass whose row j sits at slot ``pos[j]`` and sees slots <= it."""
    seen = torch.arange(slots, device=pos.device)[None, :] <= pos[:, None]  # (m, C)
    return additive_mask_over(seen, groups, dtype)


def additive_mask_over(seen: Tensor, groups: int, dtype: torch.dtype) -> Tensor:
    """(m, C) bool, True where a row may attend -> the additive (G m, C) mask of the GQA fold."""
    add = torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, float("-inf"))
    return add.repeat(groups, 1)


class StaticDecoder:
    """A Llama-family model's layers (and, for a causal LM, its embedding and head) as a static pass."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module, rotary: nn.Module, config: Any,
                 embed: nn.Embedding | None = None, head: nn.Module | None = None) -> None:
        attn = layers[0].self_attn
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.heads, self.kv_heads = int(text.num_attention_heads), int(text.num_key_value_heads)
        self.groups = self.heads // self.kv_heads
        self.head_dim, self.scaling = int(attn.head_dim), float(attn.scaling)
        self.hidden = int(text.hidden_size)
        self.eps = float(final_norm.variance_epsilon)
        self.final_norm = final_norm.weight
        self.embed, self.head = embed, head
        self.layers = [StaticLayer(
            l.input_layernorm.weight, _fuse([l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj]),
            _fuse_bias([l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj]), l.self_attn.o_proj.weight,
            l.post_attention_layernorm.weight, _fuse([l.mlp.gate_proj, l.mlp.up_proj]), l.mlp.down_proj.weight)
            for l in layers]
        self.device, self.dtype = self.final_norm.device, self.final_norm.dtype
        positions = int(getattr(text, "max_position_embeddings", 8192))
        cos, sin = rotation_tables(rotary, self.head_dim, positions, self.device)
        self.cos, self.sin = cos.to(self.dtype), sin.to(self.dtype)  # (P, D) each: the rounding transformers applies
        self.max_positions = positions

    @classmethod
    def of_causal_lm(cls, model: Any) -> "StaticDecoder":
        """The static pass of a transformers causal LM (``supports(model)`` first)."""
        body = model.model
        return cls(list(body.layers), body.norm, body.rotary_emb, model.config, body.embed_tokens,
                   model.get_output_embeddings())

    def new_kv(self, capacity: int) -> Tensor:
        """An empty (L, 2, Hkv, C, D) buffer."""
        return torch.zeros(len(self.layers), 2, self.kv_heads, capacity, self.head_dim, dtype=self.dtype,
                           device=self.device)

    def _rotate(self, t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # (m, heads, D), (m, 1, D) each
        return t * cos + t.roll(self.head_dim // 2, -1) * sin

    def run(self, x: Tensor, pos: Tensor, slots: Tensor, mask: Tensor, kv: Tensor,
            hidden: Tensor | None = None) -> Tensor:
        """The layers over x (m, d) -> the final-normed states (m, d) (module terms: static pass).

        pos, slots (m,) long; mask (G m, C) additive; kv (L, 2, Hkv, C, D), written at ``slots``;
        hidden (L + 1, m, d) or None: filled with the input and each layer's output."""
        m, h_q, h_kv, dim, g = x.shape[0], self.heads, self.kv_heads, self.head_dim, self.groups
        cos, sin = self.cos.index_select(0, pos)[:, None], self.sin.index_select(0, pos)[:, None]  # (m, 1, D)
        attn_mask = mask[None, None]  # (1, 1, G m, C)
        if hidden is not None:
            hidden[0].copy_(x)
        for i, (layer, layer_kv) in enumerate(zip(self.layers, kv.unbind(0))):
            h = F.rms_norm(x, (self.hidden,), layer.attn_norm, self.eps)  # (m, d)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias).view(m, h_q + 2 * h_kv, dim)  # (m, H + 2 Hkv, D)
            qk = self._rotate(qkv[:, : h_q + h_kv], cos, sin)  # (m, H + Hkv, D): q and k in one go
            q, k = qk[:, :h_q], qk[:, h_q:]  # (m, H, D), (m, Hkv, D)
            new = torch.stack([k, qkv[:, h_q + h_kv:]]).transpose(1, 2)  # (2, Hkv, m, D)
            layer_kv.index_copy_(2, slots, new)
            q = q.view(m, h_kv, g, dim).permute(1, 2, 0, 3).reshape(1, h_kv, g * m, dim)  # (1, Hkv, G m, D)
            a = F.scaled_dot_product_attention(q, layer_kv[0][None], layer_kv[1][None], attn_mask=attn_mask,
                                               scale=self.scaling)  # (1, Hkv, G m, D)
            a = a.view(h_kv, g, m, dim).permute(2, 0, 1, 3).reshape(m, h_q * dim)  # (m, H D): heads in q's order
            x = x + F.linear(a, layer.o)
            h = F.rms_norm(x, (self.hidden,), layer.mlp_norm, self.eps)
            gu = F.linear(h, layer.gate_up)  # (m, 2 I)
            inner = gu.shape[1] // 2
            mlp = F.linear(F.silu(gu[:, :inner]) * gu[:, inner:], layer.down)
            x = torch.add(x, mlp, out=hidden[i + 1]) if hidden is not None else x + mlp
        return F.rms_norm(x, (self.hidden,), self.final_norm, self.eps)

    def logits(self, states: Tensor) -> Tensor:
        """(m, d) final states -> (m, V) logits through the model's output head."""
        return self.head(states)
