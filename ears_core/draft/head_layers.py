"""The draft head's decoder layers, run by hand over a preallocated cache: a draft step without the
general model's per-call machinery.

Terms
-----
head body     the head's Llama decoder layer(s) and final norm (``DraftHead.body``, a transformers
              ``LlamaModel``). Training runs it as it is; drafting runs the same modules' weights here.
why by hand   a draft step feeds 1-8 rows through one layer. The layer's arithmetic is a fraction of
              a millisecond; the general forward adds about as much again per call (its mask and
              rotary builders, the cache's concatenation, keyword plumbing), paid on every draft
              pass of every round (docs/benchmarks.md, "The draft step by hand").
HeadCache     the head's keys and values per layer, (B, H_kv, capacity, D), preallocated and grown
              by doubling; ``length`` positions hold entries. Appending writes in place; dropping the
              last n positions (the entries made from predicted features) only lowers ``length``.
positions     each new row's rotary position (the tree's rows share a depth's position); cos/sin
              come from the head's own rotary module, and the norms and the rotation are its own
              modules and transformers' Llama function: only the wiring is written here.
mask          (m, length + m) bool, True where a new row may attend; None: causal over the new rows
              (row i sees every cached entry and new rows 0..i).
same numbers  the operations are the general forward's, in its order and dtypes (the same modules,
              scaled-dot-product attention); a test checks agreement
              with ``LlamaModel`` on a random head, causal and with a tree mask. Draft side only:
              whatever the head computes, q is exactly the distribution each draft was drawn from.
supported     default (and other static) rotary embeddings; ``supports(body)`` is False for a
              dynamic one, whose frequencies change with the length, and the drafter keeps the
              general forward there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ears_core.model.kv_cache import doubled_capacity

__all__ = ["HeadCache", "HeadLayers", "supports", "head_layers"]


def supports(body: nn.Module) -> bool:
    """Whether ``HeadLayers`` can run this head body (module terms: supported)."""
    rope = getattr(body, "rotary_emb", None)
    kind = str(getattr(rope, "rope_type", "default"))
    layers = getattr(body, "layers", None)
    return rope is not None and "dynamic" not in kind and layers is not None and len(layers) > 0


@dataclass
class HeadCache:
    """Keys and values per layer, (B, H_kv, capacity, D) each, and how many positions hold entries."""

    keys: list[Tensor]
    values: list[Tensor]
    length: int = 0

    @classmethod
    def empty(cls, layers: int, batch: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
              device: torch.device, capacity: int = 256) -> "HeadCache":
        shape = (batch, kv_heads, capacity, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)])

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more positions (doubling the capacity as often as needed)."""
        need = self.length + extra
        if need <= self.capacity:
            return
        cap = doubled_capacity(self.capacity, need)
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                grown = t.new_zeros(t.shape[0], t.shape[1], cap, t.shape[3])  # (B, H_kv, cap, D)
                grown[:, :, : self.length] = t[:, :, : self.length]
                store[i] = grown

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (nothing is copied)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a head cache of {self.length} positions to {length}")
        self.length = length


class HeadLayers:
    """Runs a head body's layers over new rows on a ``HeadCache`` (module terms)."""

    def __init__(self, body: nn.Module) -> None:
        if not supports(body):
            raise ValueError("this head's rotary embedding changes with the length (dynamic); "
                             "run it through its own forward instead")
        self.body = body
        self.layers = list(body.layers)
        attn = self.layers[0].self_attn
        cfg = body.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.dtype = body.norm.weight.dtype
        self.device = body.norm.weight.device

    def new_cache(self, batch: int, capacity: int = 256) -> HeadCache:
        return HeadCache.empty(len(self.layers), batch, self.kv_heads, self.head_dim, self.dtype, self.device,
                               capacity)

    def __call__(self, z: Tensor, cache: HeadCache, positions: Tensor | None = None,
                 mask: Tensor | None = None) -> Tensor:
        """z (B, m, d) head inputs -> (B, m, d) predicted features; appends m entries to ``cache``.
        positions (m,) long, default cache.length .. cache.length + m - 1; mask (m, length + m) bool."""
        b, m, _ = z.shape
        start = cache.length
        if positions is None:
            positions = torch.arange(start, start + m, device=z.device)
        cos, sin = self.body.rotary_emb(z, positions[None])  # (1, m, D) each, in z's dtype
        if mask is None:
            mask = torch.ones(m, start + m, dtype=torch.bool, device=z.device).tril(start)  # (m, L + m)
        cache.reserve(m)
        end = start + m
        x = z
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, m, self.heads, self.head_dim).transpose(1, 2)  # (B, H, m, D)
            k = attn.k_proj(h).view(b, m, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, m, D)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            cache.keys[i][:, :, start:end] = k
            cache.values[i][:, :, start:end] = attn.v_proj(h).view(b, m, self.kv_heads, self.head_dim).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, cache.keys[i][:, :, :end], cache.values[i][:, :, :end],
                                               attn_mask=mask, scale=self.scaling,
                                               enable_gqa=self.heads != self.kv_heads)  # (B, H, m, D)
            x = x + attn.o_proj(a.transpose(1, 2).reshape(b, m, self.heads * self.head_dim))
            h = layer.post_attention_layernorm(x)
            mlp = layer.mlp
            x = x + mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))
        cache.length = end
        return self.body.norm(x)  # (B, m, d)


def head_layers(head: nn.Module, want_graphs: bool) -> object:
    """The layers a drafter runs an EAGLE head's body with: a ``GraphedHead`` (model/graphed.py; built once per
    head, shared by the drafters of every generation) where passes are captured and ``want_graphs``; else
    ``HeadLayers``."""
    from ears_core.model.cuda_graphs import graphs_wanted
    from ears_core.model.graphed import GraphedHead

    if want_graphs and graphs_wanted(head.body.norm.weight.device):
        built = head.__dict__.get("_ears_graphed")
        if built is None:
            built = head.__dict__["_ears_graphed"] = GraphedHead(head.body, capture=True)
        return built
    return HeadLayers(head.body)
