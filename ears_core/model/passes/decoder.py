"""The Llama-family layer loop, written once: the lean CPU target, the static (capturable) pass and the
draft head's layers all run ``Decoder.run``; what differs between them is data.

Terms
-----
layer        ``Layer``: one decoder layer's weights, q/k/v and gate/up stacked.
linear kind  ``lin(x, w, bias)``: ``dense`` (out, in) tensors through ``F.linear`` (the static pass); ``int4_kind``
             ``Int4Weight`` blocks on the CPU int4 kernel, rows split by the row plan (measuring/lean_plan.py), at
             most ``ROW_CAP`` a call (the lean target); ``modules`` the module's own linears, a tuple run side by
             side (the draft head's, packed or int4).
rotation     ``x cos + x.roll(D / 2) sin`` with signed sin tables; ``all_heads``: over q, k and v heads (v with
             cos 1, sin 0: the same bits) in one ``addcmul``; else q and k only, after the q/k norm.
norm         RMSNorm, x / sqrt(mean(x^2) + eps) * w. On a CPU as ``F.layer_norm`` over the row and its negation
             [x, -x] with weight [w, 0]: that row's mean is 0 and its variance mean(x^2), the same formula in one
             fused kernel where ``F.rms_norm`` runs eight small ops (12 against 57 us a bfloat16 row, 61 a pass);
             each row alone, so rows stay exact; 99.6 % of bfloat16 rows the same bits, the rest 1 ulp apart.
attention    the policy ``attend(q, new, views)`` made per pass: ``Exact`` writes the new keys and values at
             [start, end) and attends over [0, end) (the views a ``KVBuffer`` makes for the pass) in ``dtype`` with
             a bool mask (float64: a row does not depend on the pass width); ``Folded`` writes at ``slots`` and
             attends over the whole bucket with an additive (G m, C) mask: nothing read on the host, so a CUDA
             graph can capture it.
folding      the query heads folded onto their key/value heads (``fold_heads``: (m, H, D) -> (1, Hkv, G m, D)),
             so SDPA attends without repeating the keys and values per query head as ``enable_gqa`` does (18 /
             72 / 171 us a layer less at 80 / 500 / 1,000 cached tokens, float64). ``Folded`` always; ``Exact``
             for one row (a step's each layer), where it gives ``enable_gqa``'s bits (rows_agree checks it at
             load); its wider passes keep ``enable_gqa``, whose bits the one-row form was checked against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ears_core.model.kernels.gguf_q4 import GROUP

__all__ = ["Decoder", "Exact", "Folded", "Layer", "ROW_CAP", "dense", "fold_heads", "head_dim_of", "int4_kind",
           "modules", "plain_rotary", "rotation_tables", "unfold_heads"]

ROW_CAP = 16  # rows per int4 kernel call: a longer pass (a prompt) runs in chunks, as a few rows would


@dataclass
class Layer:
    """One decoder layer's weights, in the form its linear kind takes (module terms)."""

    attn_norm: Tensor  # (d,)
    qkv: Any  # (H D + 2 Hkv D) x d: q, k, v stacked
    o: Any  # d x H D
    mlp_norm: Tensor  # (d,)
    gate_up: Any  # 2 I x d: gate, then up
    down: Any  # d x I
    qkv_bias: Tensor | None = None  # (H D + 2 Hkv D,) or None
    q_norm: Tensor | None = None  # (D,) or None
    k_norm: Tensor | None = None  # (D,) or None


# ------------------------------------------------------------------------ linear kinds
def dense(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """(r, in) @ (out, in)^T (+ bias) -> (r, out)."""
    return F.linear(x, w, bias)


def modules(x: Tensor, w: Any, bias: None = None) -> Tensor:
    """(r, in) through a linear module, or through a tuple of them side by side -> (r, sum out)."""
    return torch.cat([part(x) for part in w], -1) if isinstance(w, tuple) else w(x)


def int4_rows(x: Tensor, w: Any, bias: None = None) -> Tensor:
    """(r, K) contiguous bfloat16 rows -> (r, N) through the int4 kernel, in one call (torch's binding of the op:
    through ``torch.ops.aten`` a call costs 12 us more, 1.4 ms a lean step)."""
    return torch._weight_int4pack_mm_for_cpu(x, w.packed, GROUP, w.scales_zeros)


def int4_kind(m: int, plan: dict[int, tuple[int, ...]]) -> Callable[..., Tensor]:
    """The int4 linear kind for passes over m rows: one kernel call, or the planned chunks (module terms)."""
    sizes = (plan.get(m) if plan else None) or (ROW_CAP if m > ROW_CAP else None)
    if sizes is None or (not isinstance(sizes, int) and len(sizes) == 1):
        return int4_rows
    return lambda x, w, bias=None: torch.cat([int4_rows(c, w) for c in x.split(sizes)])


# ------------------------------------------------------------------------ attention policies
@dataclass
class Exact:
    """Keys and values written where the pass's views say (``KVStore.views``); attention over the visible slice in
    ``dtype`` (module terms)."""

    mask: Tensor | None  # (1, 1, m, >= end): bool, True where a row may attend, or additive (0 / -inf); None: one row
    dtype: torch.dtype
    scale: float | None = None  # None: SDPA's 1 / sqrt(D)

    def __call__(self, q: Tensor, new: Tensor, views: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        written, keys, values = views  # (2, Hkv, m, D) at [start, end); (1, Hkv, end, D) each (KVStore.views)
        m, h_q, dim = q.shape
        h_kv = keys.shape[1]
        written.copy_(new)
        if m == 1:  # module terms: folding (views only)
            a = F.scaled_dot_product_attention(fold_heads(q, h_kv).to(self.dtype), keys, values, scale=self.scale)
            return unfold_heads(a.to(q.dtype), 1)  # (1, H D)
        heads = q.transpose(0, 1)[None].to(self.dtype)  # (1, H, m, D)
        a = F.scaled_dot_product_attention(heads, keys, values, attn_mask=self.mask, scale=self.scale,
                                           enable_gqa=h_q != h_kv)  # (1, H, m, D)
        return a[0].to(q.dtype).transpose(0, 1).reshape(m, h_q * dim)


@dataclass
class Folded:
    """Keys and values written at ``slots``; attention over the bucket with an additive mask (module terms)."""

    slots: Tensor  # (m,) long
    mask: Tensor  # (1, 1, G m, C) additive, G = H / Hkv
    scale: float

    def __call__(self, q: Tensor, new: Tensor, layer_kv: Tensor) -> Tensor:  # layer_kv (2, Hkv, C, D)
        layer_kv.index_copy_(2, self.slots, new)
        a = F.scaled_dot_product_attention(fold_heads(q, layer_kv.shape[1]), layer_kv[0][None], layer_kv[1][None],
                                           attn_mask=self.mask, scale=self.scale)  # (1, Hkv, G m, D)
        return unfold_heads(a, q.shape[0])  # (m, H D)


def fold_heads(q: Tensor, h_kv: int) -> Tensor:
    """(m, H, D) -> (1, Hkv, G m, D), query head h on key/value head h // G, rows ordered (g, m) (module terms:
    folding); a view for one row."""
    m, h_q, dim = q.shape
    g = h_q // h_kv
    return q.view(m, h_kv, g, dim).permute(1, 2, 0, 3).reshape(1, h_kv, g * m, dim)


def unfold_heads(a: Tensor, m: int) -> Tensor:
    """``fold_heads``' layout (1, Hkv, G m, D) back to (m, H D), heads in q's order; a view for one row."""
    _, h_kv, gm, dim = a.shape
    return a.view(h_kv, gm // m, m, dim).permute(2, 0, 1, 3).reshape(m, h_kv * (gm // m) * dim)


def head_dim_of(config: Any) -> int:
    """A (text) config's head width D: its ``head_dim``, else hidden size / attention heads."""
    return int(getattr(config, "head_dim", None) or int(config.hidden_size) // int(config.num_attention_heads))


def plain_rotary(config: Any) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None:
    """For a config whose rope is the plain one (``rope_parameters`` of type ``default``): ``(x, position_ids) ->
    (cos, sin)`` with the floats of transformers' rotary embedding for it (inverse frequencies theta^(-2i/D)), so
    a pass need not import transformers' modeling modules (seconds at a cold start); None for any other rope."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
        return None
    dim = head_dim_of(config)
    inv_freq = 1.0 / (float(rope["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))  # (D/2,)

    def rotary(x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:  # (B, P) -> (B, P, D) each
        freqs = position_ids[..., None].float() * inv_freq.to(x.device)  # (B, P, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (B, P, D)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    return rotary


def rotation_tables(rotary: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], head_dim: int, positions: int,
                    device: torch.device | str = "cpu"
                    ) -> tuple[Tensor, Tensor]:
    """(cos, signed sin), each (P, D) float32, for P positions of a transformers rotary embedding, such that
    ``x cos + x.roll(D / 2, -1) sin`` is its ``x cos + rotate_half(x) sin``."""
    with torch.no_grad():
        probe = torch.zeros(1, 1, head_dim, device=device)  # float32: the tables as the embedding computes them
        cos, sin = rotary(probe, torch.arange(positions, device=device)[None])  # (1, P, D) each
    half = head_dim // 2
    sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(device)  # rotate_half(x) = roll(x, half) * sign
    return cos[0], sin[0] * sign


# ------------------------------------------------------------------------ the pass
class Decoder:
    """Layers, final norm and rotation tables; ``run`` is the layer loop (module terms)."""

    def __init__(self, layers: list[Layer], final_norm: Tensor, config: Any, cos: Tensor, sin: Tensor,
                 eps: float, qk_eps: float | None = None, all_heads: bool = False) -> None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.heads, self.kv_heads = int(text.num_attention_heads), int(text.num_key_value_heads)
        self.hidden = int(text.hidden_size)
        self.head_dim = head_dim_of(text)
        self.layers, self.final_norm, self.eps = layers, final_norm, eps
        # module terms: norm; (2 d,) weights per layer (attention, MLP) and the final norm's, or None off the CPU
        self.doubled = ([(_doubled(l.attn_norm), _doubled(l.mlp_norm)) for l in layers], _doubled(final_norm)) \
            if final_norm.device.type == "cpu" else None
        self.qk_eps = eps if qk_eps is None else qk_eps
        self.all_heads = all_heads  # module terms: rotation
        self.cos, self.sin = cos, sin  # (P, D), or (P, H + 2 Hkv, D) for all heads
        self.max_positions = int(cos.shape[0])

    def new_kv(self, capacity: int, dtype: torch.dtype, device: torch.device | str = "cpu", exact: bool = False) -> Tensor:
        """An empty (L, 2, Hkv, C, D) buffer of C = ``capacity`` positions (kv_cache.py: KV buffer); unfilled for
        the ``exact`` policy (it reads only what it wrote), zeros for the folded one (it reads the bucket, masked)."""
        make = torch.empty if exact else torch.zeros
        return make(len(self.layers), 2, self.kv_heads, capacity, self.head_dim, dtype=dtype, device=device)

    def angles(self, pos: Tensor | None, start: int = 0, m: int = 0) -> tuple[Tensor, Tensor]:
        """The rotation tables (m, 1 or H + 2 Hkv, D) at ``pos`` (m,), or (views) at start .. start + m - 1."""
        if pos is None:
            cos, sin = self.cos[start: start + m], self.sin[start: start + m]
        else:
            cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        return (cos, sin) if cos.dim() == 3 else (cos[:, None], sin[:, None])

    def _rotated(self, layer: Layer, qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """qkv (m, H + 2 Hkv, D) -> q (m, H, D) rotated, new keys and values (2, Hkv, m, D) (module terms)."""
        m, h_q, h_kv, dim = qkv.shape[0], self.heads, self.kv_heads, self.head_dim
        if self.all_heads:  # q and k rotated, v as it was
            qkv = torch.addcmul(qkv * cos, qkv.roll(dim // 2, -1), sin)
            return qkv[:, :h_q], qkv[:, h_q:].view(m, 2, h_kv, dim).permute(1, 2, 0, 3)
        qk = qkv[:, : h_q + h_kv]  # (m, H + Hkv, D)
        if layer.q_norm is not None:  # Qwen3's per-head q/k norm (llama, qwen2, mistral: no step added)
            qk = torch.cat([F.rms_norm(qk[:, :h_q], (dim,), layer.q_norm, self.qk_eps),
                            F.rms_norm(qk[:, h_q:], (dim,), layer.k_norm, self.qk_eps)], dim=1)
        qk = qk * cos + qk.roll(dim // 2, -1) * sin  # (m, H + Hkv, D): q and k
        return qk[:, :h_q], torch.stack([qk[:, h_q:], qkv[:, h_q + h_kv:]]).transpose(1, 2)

    def run(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Callable[..., Tensor], views: Any,
            lin: Callable[..., Tensor], hidden: Tensor | None = None) -> Tensor:
        """The layers over x (m, d) -> the final-normed states (m, d). cos, sin from ``angles``; ``attend`` gets each
        layer's entry of ``views``; hidden (L + 1, m, d) or None: filled with the input and each layer's output."""
        m = x.shape[0]
        if hidden is not None:
            hidden[0].copy_(x)
        for i, (layer, layer_kv) in enumerate(zip(self.layers, views)):
            h = self.norm(x, layer.attn_norm, i, 0)  # (m, d)
            qkv = lin(h, layer.qkv, layer.qkv_bias).view(m, self.heads + 2 * self.kv_heads, self.head_dim)
            q, new = self._rotated(layer, qkv, cos, sin)
            x = x + lin(attend(q, new, layer_kv), layer.o)
            h = self.norm(x, layer.mlp_norm, i, 1)
            gu = lin(h, layer.gate_up)  # (m, 2 I)
            inner = gu.shape[1] // 2
            mlp = lin(F.silu(gu[:, :inner]) * gu[:, inner:], layer.down)
            x = torch.add(x, mlp, out=hidden[i + 1]) if hidden is not None else x + mlp
        return self.norm(x, self.final_norm)

    def norm(self, x: Tensor, weight: Tensor, layer: int | None = None, which: int = 0) -> Tensor:
        """RMSNorm of x (m, d) with ``weight`` (d,): layer ``layer``'s attention (``which`` 0) or MLP (1) norm, or
        the final one (``layer`` None), in the form for its device (module terms: norm) -> (m, d)."""
        if self.doubled is None:
            return F.rms_norm(x, (self.hidden,), weight, self.eps)
        w2 = self.doubled[1] if layer is None else self.doubled[0][layer][which]  # (2 d,)
        y = torch.layer_norm(torch.cat([x, -x], -1), (2 * self.hidden,), w2, None, self.eps)[:, : self.hidden]
        return y if y.shape[0] == 1 else y.contiguous()  # (m, d): the int4 kernel takes contiguous rows


def _doubled(weight: Tensor) -> Tensor:
    """(d,) -> (2 d,): ``weight``, then zeros (module terms: norm)."""
    return torch.cat([weight, torch.zeros_like(weight)])
