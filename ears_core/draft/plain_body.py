"""A draft head's body as weights only, in the module tree transformers' ``LlamaModel`` gives them, for a head
that drafts only by hand (head_layers.py): loading it imports none of transformers' Llama modules, which cost
about 5 s of a cold start on two cores (their configuration validators import torch.distributed, sympy and
torch._dynamo).

Terms
-----
plain body   ``PlainBody``: ``layers[i].self_attn.{q,k,v,o}_proj``, ``layers[i].mlp.{gate,up,down}_proj``,
             ``layers[i].{input,post_attention}_layernorm.weight``, ``norm.weight`` and ``rotary_emb`` (the plain
             rope's tables, decoder.py: ``plain_rotary``): the state dict keys of ``LlamaModel`` less its
             embedding, so a head's saved weights load into either. It has no forward of its own.
usable       ``plain_body_for(head_config)``: the config is a Llama-layer head whose rope is the plain one (the
             embedded head's); else None and the head keeps ``LlamaModel``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig

from ears_core.model.passes.decoder import head_dim_of, plain_rotary

__all__ = ["PlainBody", "plain_body_for"]


class _Norm(nn.Module):
    """RMSNorm weights: ``weight`` (d,) and ``variance_epsilon``, as transformers' Llama norm holds them."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.variance_epsilon = eps


class _Attention(nn.Module):
    def __init__(self, c: Any, head_dim: int) -> None:
        super().__init__()
        d, heads, kv, bias = int(c.hidden_size), int(c.num_attention_heads), int(c.num_key_value_heads), \
            bool(getattr(c, "attention_bias", False))
        self.head_dim, self.scaling = head_dim, head_dim ** -0.5
        self.q_proj = nn.Linear(d, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d, kv * head_dim, bias=bias)
        self.v_proj = nn.Linear(d, kv * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, d, bias=bias)


class _MLP(nn.Module):
    def __init__(self, c: Any) -> None:
        super().__init__()
        d, inner, bias = int(c.hidden_size), int(c.intermediate_size), bool(getattr(c, "mlp_bias", False))
        self.gate_proj = nn.Linear(d, inner, bias=bias)
        self.up_proj = nn.Linear(d, inner, bias=bias)
        self.down_proj = nn.Linear(inner, d, bias=bias)


class _Layer(nn.Module):
    def __init__(self, c: Any, head_dim: int) -> None:
        super().__init__()
        self.self_attn, self.mlp = _Attention(c, head_dim), _MLP(c)
        self.input_layernorm = _Norm(int(c.hidden_size), float(c.rms_norm_eps))
        self.post_attention_layernorm = _Norm(int(c.hidden_size), float(c.rms_norm_eps))


class PlainBody(nn.Module):
    """A head body's weights, run only by ``HeadLayers`` (module terms: plain body); ``rotary``: the config's plain
    rope (``plain_rotary``)."""

    def __init__(self, config: Any, rotary: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> None:
        super().__init__()
        head_dim = head_dim_of(config)
        self.config = config
        self.layers = nn.ModuleList(_Layer(config, head_dim) for _ in range(int(config.num_hidden_layers)))
        self.norm = _Norm(int(config.hidden_size), float(config.rms_norm_eps))
        self.rotary_emb = rotary  # (x, position_ids) -> (cos, sin); HeadLayers keeps its tables on it

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise RuntimeError("this draft head was loaded to draft by hand only (plain body): load it with "
                           "DraftHead.load(folder, plain=False) to run its general forward (training, CUDA graphs)")


def plain_body_for(head_config: dict[str, Any]) -> PlainBody | None:
    """A plain body for a head's saved config (head.json's ``head_config``) where it is usable (module terms), its
    config read as transformers' base config; else None."""
    config = PretrainedConfig.from_dict(head_config)
    rotary = plain_rotary(config)
    usable = str(getattr(config, "model_type", "llama") or "llama") == "llama" \
        and str(getattr(config, "hidden_act", "silu")) == "silu" and rotary is not None
    return PlainBody(config, rotary) if usable else None
