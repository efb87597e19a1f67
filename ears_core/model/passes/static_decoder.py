"""A Llama-family decoder as one fixed sequence of kernels over preallocated buffers: the form a CUDA graph
can capture.

Terms
-----
static pass   the layer loop (decoder.py) with the ``dense`` linear kind and the ``Folded`` policy: nothing read on
              the host, the cache length entering as data, so one replay serves every cache length up to C. Not
              bit for bit transformers' forward, but both decodings of a captured target run it.
fused         q/k/v as one matrix, gate/up as another: each transformers Parameter keeps its identity and its
              ``.data`` becomes a slice of the fused tensor, so nothing is held twice (even where something else
              holds the Parameters: ZeroGPU's packing) and the model's own forward computes the same.
fixed rope    frequencies and scaling that do not depend on the context length: one (P, D) table serves.
supported     ``supports(model)``: a Llama-shaped causal LM of a family in ``FAMILIES``, no sliding window, SiLU,
              no bias on the output or MLP projections, a fixed rope over the whole head, one device; else it
              keeps transformers' forward, and ``supports`` says why.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ears_core.model.passes.decoder import Decoder, Folded, Layer, dense, rotation_tables

__all__ = ["StaticDecoder", "supports", "additive_mask_over", "causal_mask"]

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
FIXED_ROPES = ("default", "linear", "llama3", "yarn")  # module terms: fixed rope


def supports(model: Any) -> str | None:
    """None where ``StaticDecoder`` can run ``model``, else why not, naming the model (module terms)."""
    cfg = getattr(model, "config", None)
    body = getattr(model, "model", None)
    if cfg is None or body is None or not hasattr(body, "layers"):
        return f"{type(model).__name__}: not a transformers causal LM with a decoder body"
    text = cfg.get_text_config()
    kind = str(getattr(text, "model_type", ""))
    name = f"{getattr(cfg, 'name_or_path', '') or type(model).__name__} ({kind or 'no model type'})"
    reason = _structure_reason(body, text, kind) or _rope_reason(getattr(body, "rotary_emb", None),
                                                                 int(body.layers[0].self_attn.head_dim))
    if reason is None:
        devices = {p.device for p in model.parameters()}
        reason = f"the model is spread over {len(devices)} devices" if len(devices) != 1 else None
    return None if reason is None else f"{name}: {reason}"


def _structure_reason(body: nn.Module, text: Any, kind: str) -> str | None:
    """Why the layers are not the Llama shape the static pass runs, or None."""
    if kind not in FAMILIES:
        return f"model type {kind!r} is not a family the static pass knows ({', '.join(FAMILIES)})"
    window = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True)
    layer_types = getattr(text, "layer_types", None) or ()
    if window or "sliding_attention" in layer_types or any(
            getattr(l.self_attn, "sliding_window", None) for l in body.layers):
        return "sliding-window attention (the static pass attends over the whole cache)"
    if str(getattr(text, "hidden_act", "silu")) != "silu":
        return f"activation {text.hidden_act!r} (the static pass runs SiLU)"
    if getattr(text, "mlp_bias", False) or getattr(body.layers[0].self_attn.o_proj, "bias", None) is not None:
        return "biases on the output or MLP projections"
    attn = body.layers[0].self_attn
    norms = [getattr(attn, n, None) for n in ("q_norm", "k_norm")]
    if any(n is not None for n in norms) and not all(
            getattr(n, "weight", None) is not None and tuple(n.weight.shape) == (attn.head_dim,) for n in norms):
        return "a q/k norm that is not an RMSNorm over each head (the static pass runs Qwen3's)"
    return None


def _rope_reason(rope: nn.Module | None, head_dim: int) -> str | None:
    """Why the rotary embedding's tables cannot be built once over all positions, or None (module terms)."""
    if rope is None or not isinstance(getattr(rope, "inv_freq", None), Tensor):
        return "no rotary embedding the static pass can read"
    kind = str(getattr(rope, "rope_type", "default"))
    if "dynamic" in kind:
        return (f"rope type {kind!r}: a rotary embedding whose frequencies change with the context length "
                "(transformers recomputes them past the cached length)")
    if kind == "longrope":
        return ("rope type 'longrope': transformers picks the short or the long factors by the context length, "
                "and the static pass's tables are built over all positions, so the long factors would apply to "
                "short contexts too")
    if kind not in FIXED_ROPES:
        return f"rope type {kind!r} is not one the static pass checks ({', '.join(FIXED_ROPES)})"
    if 2 * rope.inv_freq.numel() != head_dim:
        return (f"a partial rotary embedding ({2 * rope.inv_freq.numel()} of {head_dim} head dimensions; the static "
                "pass rotates the whole head)")
    return None


def _fuse(parts: list[nn.Linear], name: str = "weight") -> Tensor | None:
    """One (sum out, in) weight, or (sum out,) bias (zeros where a part has none; None where none has one), for
    several linears; each module's own becomes a view of it (module terms: fused)."""
    own = [getattr(p, name) for p in parts]
    if all(t is None for t in own):
        return None
    fused = torch.cat([t.detach() if t is not None else p.weight.new_zeros(p.weight.shape[0])
                       for p, t in zip(parts, own)])  # (sum out, in) or (sum out,)
    start = 0
    for p, t in zip(parts, own):
        rows = p.weight.shape[0]
        if t is not None:
            t.data = fused[start: start + rows]
            t.requires_grad_(False)
        start += rows
    return fused


def _static_layer(layer: nn.Module) -> Layer:
    """A transformers decoder layer's weights as a dense Layer, fusing q/k/v and gate/up (module terms)."""
    attn, mlp = layer.self_attn, layer.mlp
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    return Layer(
        layer.input_layernorm.weight, _fuse([attn.q_proj, attn.k_proj, attn.v_proj]), attn.o_proj.weight,
        layer.post_attention_layernorm.weight, _fuse([mlp.gate_proj, mlp.up_proj]), mlp.down_proj.weight,
        _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "bias"),
        q_norm.weight if q_norm is not None else None, k_norm.weight if k_norm is not None else None)


def causal_mask(pos: Tensor, slots: int, groups: int, dtype: torch.dtype) -> Tensor:
    """The additive (G m, C) mask of a pass whose row j sits at slot ``pos[j]`` and sees slots <= it."""
    seen = torch.arange(slots, device=pos.device)[None, :] <= pos[:, None]  # (m, C)
    return additive_mask_over(seen, groups, dtype)


def additive_mask_over(seen: Tensor, groups: int, dtype: torch.dtype) -> Tensor:
    """(m, C) bool, True where a row may attend -> the additive (G m, C) mask of the GQA fold."""
    add = torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, float("-inf"))
    return add.repeat(groups, 1)


class StaticDecoder(Decoder):
    """A Llama-family model's layers (and, for a causal LM, its embedding and head) as a static pass."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module, rotary: nn.Module, config: Any,
                 embed: nn.Embedding | None = None, head: nn.Module | None = None) -> None:
        attn = layers[0].self_attn
        q_norm = getattr(attn, "q_norm", None)
        dtype, device = final_norm.weight.dtype, final_norm.weight.device
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        positions = int(getattr(text, "max_position_embeddings", 8192))
        cos, sin = rotation_tables(rotary, int(attn.head_dim), positions, device)  # (P, D) each, float32
        eps = float(final_norm.variance_epsilon)
        super().__init__([_static_layer(l) for l in layers], final_norm.weight, text, cos.to(dtype), sin.to(dtype),
                         eps, float(q_norm.variance_epsilon) if q_norm is not None else eps)  # the rounding transformers applies
        self.groups = self.heads // self.kv_heads
        self.head_dim, self.scaling = int(attn.head_dim), float(attn.scaling)
        self.embed, self.head = embed, head
        self.device, self.dtype = device, dtype

    @classmethod
    def of_causal_lm(cls, model: Any) -> "StaticDecoder":
        """The static pass of a transformers causal LM (``supports(model)`` first)."""
        body = model.model
        return cls(list(body.layers), body.norm, body.rotary_emb, model.config, body.embed_tokens,
                   model.get_output_embeddings())

    def run(self, x: Tensor, pos: Tensor, slots: Tensor, mask: Tensor, kv: Tensor,  # type: ignore[override]
            hidden: Tensor | None = None) -> Tensor:
        """The layers over x (m, d) -> the final-normed states (m, d) (module terms: static pass); hidden
        (L + 1, m, d) or None: filled with the input and each layer's output."""
        cos, sin = self.angles(pos)  # (m, 1, D) each
        attend = Folded(slots, mask[None, None], self.scaling)
        return super().run(x, cos, sin, attend, kv.unbind(0), dense, hidden)

    def logits(self, states: Tensor) -> Tensor:
        """(m, d) final states -> (m, V) logits through the model's output head."""
        return self.head(states)
