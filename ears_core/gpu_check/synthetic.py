"""Llama-shaped model pairs built in memory with seeded random weights: no files, no network.

Terms
-----
small pair     a target of a few layers and a vocabulary of a few thousand, and a draft that is the
               target with seeded noise on every weight: it agrees with the target often but not always,
               so rounds accept, reject and roll back. For correctness, in float32 and bfloat16.
skip pair      for speed: a deeper, wider target whose layers after the first ``draft_layers`` add only a
               small, scaled-down update to the residual stream, and a draft made of exactly those first
               layers (with the target's embeddings, final norm and output head). The draft then costs
               about draft_layers / layers of a target step and agrees with the target most of the time:
               a stand-in for a real pair where none is on the machine. Its acceptance says nothing about
               any real pair; its prices and host syncs are the device's.
peaked         a large initialiser standard deviation makes the distributions peaked like a real LM's
               (near-ties between the top two tokens are rare, so greedy equality is a sharp test).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

__all__ = ["PairShape", "SMALL", "SKIP_GPU", "SKIP_CPU", "small_pair", "skip_pair"]


@dataclass(frozen=True)
class PairShape:
    """The target's shape; ``draft_layers`` > 0 makes a skip pair, else a noisy copy."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    std: float = 0.3  # initialiser std: peaked distributions
    draft_layers: int = 0
    tail_scale: float = 0.05  # skip pair: the later layers' output projections are scaled by this
    noise: float = 0.002  # small pair: the draft's weight noise (greedy acceptance about 0.5)

    def config(self, layers: int | None = None) -> LlamaConfig:
        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=2 * self.hidden,
                           num_hidden_layers=layers or self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, max_position_embeddings=1024,
                           initializer_range=self.std, bos_token_id=0, eos_token_id=None, pad_token_id=None,
                           tie_word_embeddings=False)

    @property
    def params_m(self) -> float:
        """The target's parameters, in millions (embeddings and head included)."""
        per_layer = 4 * self.hidden * self.hidden + 3 * self.hidden * 2 * self.hidden
        return (self.layers * per_layer + 2 * self.vocab * self.hidden) / 1e6


SMALL = PairShape(vocab=4096, hidden=128, layers=4, heads=4, kv_heads=2)
SKIP_GPU = PairShape(vocab=32000, hidden=2048, layers=16, heads=16, kv_heads=8, std=0.1, draft_layers=2,
                     tail_scale=0.01)
SKIP_CPU = PairShape(vocab=2048, hidden=128, layers=8, heads=4, kv_heads=2, std=0.3, draft_layers=1,
                     tail_scale=0.02)


def _built(cfg: LlamaConfig, device: torch.device, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: a 1B-parameter init on the host takes long
        model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = None
    return model.eval()


@torch.no_grad()
def small_pair(device: torch.device, dtype: torch.dtype, shape: PairShape = SMALL, seed: int = 0
               ) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(target, draft): the draft is the target plus seeded noise on every weight (module terms)."""
    target = _built(shape.config(), device, seed)
    draft = _built(shape.config(), device, seed + 1)
    draft.load_state_dict(target.state_dict())
    gen = torch.Generator(device="cpu").manual_seed(seed + 2)
    for p in draft.parameters():
        p.add_((shape.noise * torch.randn(p.shape, generator=gen)).to(device))
    return target.to(dtype), draft.to(dtype)


@torch.no_grad()
def skip_pair(device: torch.device, dtype: torch.dtype, shape: PairShape, seed: int = 0
              ) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(target, draft): the draft is the target's first ``shape.draft_layers`` layers (module terms)."""
    if shape.draft_layers < 1:
        raise ValueError("a skip pair needs draft_layers >= 1")
    target = _built(shape.config(), device, seed)
    for layer in target.model.layers[shape.draft_layers:]:  # the later layers only nudge the residual stream
        layer.self_attn.o_proj.weight.mul_(shape.tail_scale)
        layer.mlp.down_proj.weight.mul_(shape.tail_scale)
    draft = _built(shape.config(shape.draft_layers), device, seed + 1)
    own = draft.state_dict()
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if k in own})
    return target.to(dtype), draft.to(dtype)
