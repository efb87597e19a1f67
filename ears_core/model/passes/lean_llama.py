"""The lean target: a Llama decoder run by hand from 4-bit weights, with transformers' calling convention
(passes/attention.py; batch 1, CPU only).

Terms
-----
lean step     the layer loop (decoder.py) with the ``int4`` linear kind (the GGUF's Q4_1 blocks, scales in
              bfloat16: kernels/gguf_q4.py) and the ``Exact`` policy over a ``KVBuffer``; the output head in
              bfloat16 in the fastest exact form this machine runs (kernels/exact_head.py). Target-only and
              speculative decoding both run it.
exact rows    row j of a pass over m tokens equals, bit for bit, a one-token pass at its position: the int4
              kernel is row-invariant (decoder.py: ``ROW_CAP`` rows a call), the head runs rows in chunks its form
              proved exact, and the attention runs in float64 over a float64 cache.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ears_core.model.passes.attention import PassOutput, pass_inputs
from ears_core.model.passes.decoder import Decoder, Exact, Layer, head_dim_of, int4_kind, plain_rotary, rotation_tables
from ears_core.model.passes.kv_cache import KVBuffer, KVStore

__all__ = ["LeanLlama"]


class LeanLlama(nn.Module):
    """A Llama-architecture causal LM from int4 layers (module terms). Build with ``loading/lean_target.py``."""

    def __init__(self, config: Any, layers: list[Layer], embedding: Tensor, final_norm: Tensor,
                 attn_dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        from transformers import GenerationConfig

        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config)  # end-of-sequence ids, as transformers'
        text = config.get_text_config()
        heads, kv_heads = int(text.num_attention_heads), int(text.num_key_value_heads)
        head_dim = head_dim_of(text)
        positions = int(getattr(text, "max_position_embeddings", 8192))
        rotary = plain_rotary(text)
        if rotary is None:  # a scaled rope: transformers' own tables
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
            rotary = LlamaRotaryEmbedding(text)
        cos, sin = rotation_tables(rotary, head_dim, positions)  # (P, D) each, float32
        # per head of the fused q/k/v output: q and k heads rotate, v heads pass (cos 1, sin 0: the same bits)
        rotates = torch.arange(heads + 2 * kv_heads) < heads + kv_heads  # (H + 2 Hkv,)
        cos = torch.where(rotates[None, :, None], cos[:, None], 1.0).to(torch.bfloat16)  # (P, H + 2 Hkv, D)
        sin = torch.where(rotates[None, :, None], sin[:, None], 0.0).to(torch.bfloat16)
        self.decoder = Decoder(layers, final_norm, text, cos, sin, float(text.rms_norm_eps), all_heads=True)
        self.layers = layers
        self.embed = nn.Embedding.from_pretrained(embedding, freeze=True)  # (V, d) bfloat16, tied to the head
        self.head = nn.Module()  # the output head as ``get_output_embeddings()`` returns it: a ``weight`` (V, d)
        self.head.weight = self.embed.weight
        self.head_form: Any = None  # kernels/exact_head.py: ExactHead, installed at load or at the first pass
        self.attn_dtype = attn_dtype
        self.row_plan: dict[int, tuple[int, ...]] = {}  # rows -> chunk sizes for the int4 calls (measuring/lean_plan.py)
        self.ears_kernels = "lean-int4"

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

    def new_cache(self, capacity: int = 256) -> KVBuffer:
        """An empty cache for this model, on a store of its own in the attention's dtype (module terms)."""
        return KVBuffer(KVStore(self.decoder.new_kv(capacity, self.attn_dtype, exact=True)))

    def _head(self) -> Any:
        """The output head's ExactHead (kernels/exact_head.py): the loader's, else this machine's form, untimed."""
        if self.head_form is None:  # not installed by the loader (lean_target.py)
            from ears_core.model.kernels.exact_head import install_exact_head
            install_exact_head(self, measure=False)
        return self.head_form

    def head_logits(self, h: Tensor) -> Tensor:
        """(r, d) final-normed states -> (r, V) logits, each row the bits of a one-row pass (exact rows)."""
        return self._head()(h)

    @property
    def head_grows_with_rows(self) -> bool:
        """Whether this machine's head costs about its row count in rows (exact_head.py: growth)."""
        return self._head().form.grows_with_rows()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values: KVBuffer | None = None, use_cache: bool = True, logits_to_keep: int = 0,
                output_hidden_states: bool = False, head: bool = True, **unused: Any) -> PassOutput:
        """transformers' calling convention; ``head`` False: no logits, the kept rows' states instead (a caller that
        runs the head row by row: ``head_logits``)."""
        # seen (1, 1, m, >= n + m) bool, True where a row may attend; or None
        m, cache, seen = pass_inputs(self, input_ids, attention_mask, past_key_values, "the lean target")
        n, d = cache.length, self.decoder
        cos, sin = d.angles(None if position_ids is None else position_ids.reshape(-1), n, m)  # (m, H + 2 Hkv, D)
        mask = (seen[..., : n + m] if seen is not None  # else causal after the cache; no mask for one row
                else None if m == 1 else torch.ones(m, n + m, dtype=torch.bool).tril(n)[None, None])
        if mask is not None:  # additive, once a pass: SDPA would turn a bool mask into this in every layer (the same bits)
            mask = torch.zeros(mask.shape, dtype=self.attn_dtype).masked_fill_(~mask, float("-inf"))
        attend = Exact(mask, self.attn_dtype)
        x = self.embed(input_ids[0])  # (m, d)
        hidden = x.new_empty(len(self.layers) + 1, m, d.hidden) if output_hidden_states else None
        with cache.kv.lock:  # kv_cache.py: threads
            x = d.run(x, cos, sin, attend, cache.layer_views(m), int4_kind(m, self.row_plan), hidden)  # (m, d)
            cache.length = n + m
        kept = x if not logits_to_keep else x[-logits_to_keep:]  # (kept, d)
        states = None if hidden is None else tuple(t[None] for t in hidden[:-1]) + (x[None],)  # each (1, m, d)
        if not head:
            return PassOutput(None, states, cache, kept[None])
        return PassOutput(self.head_logits(kept)[None], states, cache)  # logits (1, kept, V)

    @torch.inference_mode()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, max_new_tokens: int = 20,
                 do_sample: bool = False, temperature: float = 1.0, eos_token_id: int | list[int] | None = None,
                 **unused: Any) -> Tensor:
        """transformers' ``generate`` for greedy or plain sampling (torch's global generator), one sequence, to an
        end-of-sequence token -> (1, T + new) ids; ``ears_core.autoregressive`` and ``generate`` do the rest."""
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
        d = self.decoder
        return (f"layers={len(self.layers)}, hidden={d.hidden}, heads={d.heads}/{d.kv_heads}, "
                f"int4 linears, attention in {str(self.attn_dtype).removeprefix('torch.')}")
