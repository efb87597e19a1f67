"""The draft head's decoder layers (``DraftHead.body``) run by hand over a preallocated cache: a draft step
without the general model's per-call machinery, about as costly as its arithmetic (docs/benchmarks.md).

Terms
-----
by hand       the layer loop (model/passes/decoder.py) with the ``modules`` linear kind (the packed and int4
              variants as swapped in) and the ``Exact`` policy in the head's dtype, over a ``KVBuffer`` of its own;
              rotary tables from the head's rotary module. The general forward's operations up to the rounding of
              fused kernels (a test compares them, causal and with a tree mask).
supported     ``supports(body)``: False for a dynamic rotary embedding: the drafter keeps the general forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ears_core.model.kernels.int4_linear import side_by_side
from ears_core.model.passes.decoder import Decoder, Exact, Layer, modules, rotation_tables
from ears_core.model.passes.kv_cache import KVBuffer, KVStore, doubled_capacity

__all__ = ["HeadLayers", "supports", "head_layers"]


def supports(body: nn.Module) -> bool:
    """Whether ``HeadLayers`` can run this head body (module terms: supported)."""
    rope = getattr(body, "rotary_emb", None)
    kind = str(getattr(rope, "rope_type", "default"))
    layers = getattr(body, "layers", None)
    return rope is not None and "dynamic" not in kind and layers is not None and len(layers) > 0


def _layer(layer: nn.Module) -> Layer:
    """A head decoder layer as the pass's Layer over its own modules (module terms: by hand); int4 q / k / v and
    gate / up each as one kernel call (int4_linear.py: side by side), made once for its modules, not per request."""
    attn, mlp = layer.self_attn, layer.mlp
    parts = (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
    made = layer.__dict__.get("_ears_side_by_side")
    if made is None or made[0] != parts:
        made = layer.__dict__["_ears_side_by_side"] = (parts, *(side_by_side(p) or p for p in parts))
    return Layer(layer.input_layernorm.weight, made[1], attn.o_proj, layer.post_attention_layernorm.weight, made[2],
                 mlp.down_proj)


class HeadLayers(Decoder):
    """Runs a head body's layers over new rows on a ``KVBuffer`` (module terms: by hand)."""

    def __init__(self, body: nn.Module) -> None:
        if not supports(body):
            raise ValueError("this head's rotary embedding changes with the length (dynamic); "
                             "run it through its own forward instead")
        attn = body.layers[0].self_attn
        self.dtype, self.device = body.norm.weight.dtype, body.norm.weight.device
        self.rotary, self.head_dim, self.scaling = body.rotary_emb, int(attn.head_dim), float(attn.scaling)
        cos, sin = self._tables(int(getattr(body.config, "max_position_embeddings", 8192)))
        super().__init__([_layer(l) for l in body.layers], body.norm.weight, body.config, cos, sin,
                         float(body.norm.variance_epsilon))
        self.head_dim = int(attn.head_dim)

    def _tables(self, positions: int) -> tuple[Tensor, Tensor]:
        """(cos, signed sin), each (P, D) in the head's dtype, for P positions of its rotary embedding: made once
        per head, dtype and length (a drafter builds its layers every request)."""
        made, key = self.rotary.__dict__.setdefault("_ears_tables", {}), (positions, self.dtype, str(self.device))
        if key not in made:
            made[key] = tuple(t.to(self.dtype) for t in rotation_tables(self.rotary, self.head_dim, positions, self.device))
        return made[key]

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVBuffer:
        if batch != 1:
            raise ValueError("the draft head drafts one sequence at a time (batch 1)")
        return KVBuffer(KVStore(self.new_kv(capacity, self.dtype, self.device, exact=True)))

    def __call__(self, z: Tensor, cache: KVBuffer, positions: Tensor | None = None,
                 mask: Tensor | None = None) -> Tensor:
        """z (1, m, d) head inputs -> (1, m, d) predicted features; appends m entries to ``cache``.
        positions (m,) long, default cache.length .. cache.length + m - 1; mask (m, length + m) bool."""
        m, start = z.shape[1], cache.length
        if mask is None and m > 1:
            mask = torch.ones(m, start + m, dtype=torch.bool, device=z.device).tril(start)  # (m, L + m)
        if start + m > self.max_positions:  # past the config's positions, as the head's own forward goes
            self.cos, self.sin = self._tables(doubled_capacity(self.max_positions, start + m))
            self.max_positions = int(self.cos.shape[0])
        cos, sin = self.angles(positions, start, m)  # (m, 1, D) each
        attend = Exact(None if mask is None else mask[None, None], self.dtype, self.scaling)
        out = self.run(z[0], cos, sin, attend, cache.layer_views(m), modules)  # (m, d)
        cache.length = start + m
        return out[None]


def head_layers(head: nn.Module, want_graphs: bool) -> object:
    """``HeadLayers``, or where passes are captured and ``want_graphs`` the head's one ``GraphedHead`` (graphed.py)."""
    from ears_core.model.cuda.cuda_graphs import graphs_wanted
    from ears_core.model.cuda.graphed import GraphedHead

    if want_graphs and graphs_wanted(head.body.norm.weight.device):
        built = head.__dict__.get("_ears_graphed")
        if built is None:
            built = head.__dict__["_ears_graphed"] = GraphedHead(head.body, capture=True)
        return built
    return HeadLayers(head.body)
