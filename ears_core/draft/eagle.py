"""An EAGLE-style draft head: it drafts from the target's own last hidden state.

Terms
-----
head            z_t = fc([f_t ; E(x_{t+1})]) (f_t the target's last hidden state after its final norm, E its
                frozen input embedding) through one Llama decoder layer and a norm, causal with a KV cache: its
                output at t predicts f_{t+1}, and W f^_{t+1} scores x_{t+2} (W the target's output head on
                ``vocab_ids``, its N most frequent tokens; q is 0 elsewhere). Only ``fc`` and the layer ship.
drafting        a round's first draft comes from the head's last output; each further one feeds back the head's
                *predicted* feature with the drafted token.
commit          drop the entries made from predicted features and queue the target's true features for the kept
                drafts and the new token, consumed in one forward when the head next drafts.
confidence      the head's raw (T = 1) probability on its top token: ``keep(confidence)``, asked before each draw,
                stops at the first False (verification stays exact).
temperature scale  tau: drafts are drawn from ``probs_fn(logits / tau)``; greedy drafts and the confidence are
                unchanged.
head dtype      the head's layers, cache and rows of the output head (``w_sub``) compute in it (head_kernels.py);
                logits come back as float32. Like tau and the kernels it changes only q, still exactly the
                distribution each draft was drawn from (draft side): every rule stays as exact as before.
feature layers  (EAGLE-3) indices into the target's ``hidden_states`` (0 the embeddings, i after decoder layer i,
                -1 after the final norm: always last) read side by side into fc; an input from the head's own
                prediction (2nd and later drafts) has zeros for the lower layers, as in training.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import DynamicCache

from ears_core.draft.drafters import Draw, Keep, ProbsFn, draft_chain, drawn
from ears_core.draft.head_layers import head_layers, supports
from ears_core.draft.plain_body import plain_body_for
from ears_core.draft.step_graphs import StepGraphs
from ears_core.draft.trees import DraftTree, additive_mask, build_tree, draft_pass, node_rows
from ears_core.model.passes.kv_cache import KVBuffer, drop_last_positions

if TYPE_CHECKING:  # annotations only: transformers' Llama modules cost seconds to import (plain_body.py)
    from transformers import LlamaConfig, PreTrainedModel

__all__ = ["DraftHead", "EagleDrafter", "head_config_from_target"]


def head_config_from_target(target_config: Any, layers: int = 1) -> LlamaConfig:
    """A Llama config for the head: the target's widths, ``layers`` decoder layers, no vocabulary."""
    from transformers import LlamaConfig

    c = target_config
    return LlamaConfig(vocab_size=1, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                       num_hidden_layers=layers, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                       head_dim=getattr(c, "head_dim", None), rms_norm_eps=c.rms_norm_eps,
                       rope_parameters=getattr(c, "rope_parameters", None),
                       max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=False)


class DraftHead(nn.Module):
    """fc + decoder layer(s) + norm: (features (B, T, d), token embeddings (B, T, d)) -> (B, T, d)."""

    def __init__(self, config: LlamaConfig, vocab_ids: Tensor, feature_layers: tuple[int, ...] = (-1,),
                 body: nn.Module | None = None) -> None:
        super().__init__()
        d = config.hidden_size
        self.config = config
        self.feature_layers = tuple(int(i) for i in feature_layers)
        if not self.feature_layers:
            raise ValueError("feature_layers must name at least one hidden state of the target (e.g. (-1,))")
        self.fc = nn.Linear((len(self.feature_layers) + 1) * d, d, bias=True)
        if body is None:  # the general forward (training, CUDA graph capture); plain_body.py: weights only
            from transformers import LlamaModel
            body = LlamaModel(config)
        self.body = body
        self.register_buffer("vocab_ids", vocab_ids.to(torch.long), persistent=True)  # (N,)
        self.temperature_scale = 1.0  # tau (see the module docstring); saved in head.json

    def inputs(self, feats: Tensor, tok_emb: Tensor) -> Tensor:
        """z = fc([features ; E(x)]): feats (..., n*d) true features of every feature layer, or
        (..., d) a predicted final feature (the lower layers then read as zeros) -> (..., d)."""
        missing = len(self.feature_layers) * self.config.hidden_size - feats.shape[-1]
        if missing:
            feats = torch.cat([feats.new_zeros(*feats.shape[:-1], missing), feats], dim=-1)
        return self.fc(torch.cat([feats, tok_emb], dim=-1))

    def forward(self, feats: Tensor, tok_emb: Tensor, cache: DynamicCache | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        z = self.inputs(feats, tok_emb)  # (B, T, d)
        out = self.body(inputs_embeds=z, past_key_values=cache, use_cache=cache is not None,
                        attention_mask=attention_mask)
        return out.last_hidden_state  # (B, T, d) predicted next (final) features

    def save(self, folder: str | Path, meta: dict[str, Any] | None = None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(torch.bfloat16 if v.is_floating_point() else v.dtype).contiguous()
                 for k, v in self.state_dict().items() if not k.startswith("body.embed_tokens")}
        save_file(state, str(folder / "head.safetensors"))
        info = {"head_config": self.config.to_dict(), "feature_layers": list(self.feature_layers),
                "temperature_scale": float(self.temperature_scale), "meta": meta or {}}
        (folder / "head.json").write_text(json.dumps(info, indent=1, default=str))

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype = torch.float32, plain: bool = False) -> "DraftHead":
        """The head saved in ``folder``. ``plain``: its body as weights only where usable (plain_body.py), for a head
        that only drafts by hand: no transformers Llama modules imported; else (and by default) ``LlamaModel``."""
        folder = Path(folder)
        info = json.loads((folder / "head.json").read_text())
        state = load_file(str(folder / "head.safetensors"))
        body = plain_body_for(info["head_config"]) if plain else None
        if body is not None:
            config = body.config
        else:
            from transformers import LlamaConfig
            config = LlamaConfig.from_dict(info["head_config"])
        head = cls(config, state["vocab_ids"], tuple(info.get("feature_layers", (-1,))), body=body)
        missing, unexpected = head.load_state_dict(state, strict=False)
        bad = [m for m in missing if not m.startswith("body.embed_tokens")]
        if bad or unexpected:
            raise ValueError(f"draft head files in {folder} do not match the head: missing {bad}, unexpected {unexpected}")
        head.meta = info.get("meta", {})  # the training record
        tau = float(info.get("temperature_scale", 1.0))
        if not tau > 0:
            raise ValueError(f"draft head in {folder}: temperature_scale must be > 0, got {tau}; fix head.json")
        head.temperature_scale = tau
        return head.to(dtype).eval()


@dataclass
class _State:
    cache: KVBuffer | DynamicCache  # KVBuffer where head_layers.supports the head, else the general one
    cache_len: int  # head entries built from true features
    next_feat: Tensor | None  # (B, d): the head's prediction that scores the next draft token
    proposed: Tensor | None  # (B, k) the last proposal
    pending: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # committed (features, tokens) not yet fed


class EagleDrafter:
    """The Drafter protocol around a DraftHead and the target's embedding and output head."""

    needs_target_hidden = True
    device_confidence = True  # propose(confidences=True) records them on the device (drafters.py)
    calibration_table: dict | None = None  # confidence -> acceptance counts (assets/.../calibration.json)

    def __init__(self, head: DraftHead, target: PreTrainedModel, vocab_size: int | None = None) -> None:
        self.head = head
        self.feature_layers = head.feature_layers  # which of the target's hidden states it reads
        self.embed = target.get_input_embeddings()
        w = target.get_output_embeddings().weight  # (V, d)
        self.vocab_size = vocab_size if vocab_size is not None else int(w.shape[0])
        self.vocab_ids = head.vocab_ids.to(w.device).sort().values  # (N,) ascending (the head's order is free)
        self.support = self.vocab_ids  # the drafter's q is 0 outside these tokens (drafters.py)
        # A chain's draft step samples on the head's N tokens and widens to V once per round: the same draws as over V
        # (ascending ids: the same inverse CDF and argmax on ties). Only when every head token is a real token.
        self._n_space = bool(len(self.vocab_ids)) and int(self.vocab_ids[-1]) < self.vocab_size
        self.dtype = next(head.parameters()).dtype  # the head dtype (module terms)
        self.w_sub = w.detach()[self.vocab_ids].to(self.dtype)  # (N, d): the target's head on the draft's tokens
        self.sub_head = nn.Linear(self.w_sub.shape[1], self.w_sub.shape[0], bias=False, device="meta")  # feats -> (N,)
        self.sub_head.weight = nn.Parameter(self.w_sub, requires_grad=False)  # the same tensor, not a copy
        self.tau = float(head.temperature_scale)  # drafts drawn at T * tau
        self.by_hand = supports(head.body)  # the head's layers run by hand (head_layers.py); False: its general forward
        self._layers: Any = None  # HeadLayers (or a GraphedHead on CUDA), built at prefill once dtype and kernels are set
        self.cuda_graphs = True  # on CUDA, run the head's passes as captured graphs (model/cuda/graphed.py)
        self._steps: StepGraphs | None = None  # its chain draft steps as captured graphs (draft/step_graphs.py)
        self._s: _State | None = None
        self.confidence: list[float] = []  # the last proposal's confidence per drafted position
        self.confidence_t: Tensor | None = None  # (k',) the same as a tensor, with propose(confidences=True)

    def fresh(self) -> "EagleDrafter":
        """A drafter sharing these weights with no decode state: one per concurrent generation."""
        other = copy.copy(self)
        other._s = None
        return other

    def pack_kernels(self) -> int:
        """Run the head's layers and its output rows with oneDNN-packed weights (model/kernels/packed_linear.py)."""
        from ears_core.model.kernels.packed_linear import pack_layer, pack_linears

        rows = self.sub_head
        self.sub_head = pack_layer(rows)
        return pack_linears(self.head) + int(self.sub_head is not rows)

    def quantize_kernels(self, rows: bool = True) -> int:
        """Run the head's layers, and its output rows unless ``rows`` is False (then oneDNN-packed bfloat16), on the
        CPU int4 kernel (model/kernels/int4_linear.py); the head must be bfloat16."""
        from ears_core.model.kernels.int4_linear import Int4Linear, quantize_linears, takes
        from ears_core.model.kernels.packed_linear import pack_layer

        if self.dtype != torch.bfloat16:
            raise ValueError(f"the int4 kernel takes bfloat16 activations: load the head in bfloat16, not {self.dtype}")
        quantized = rows and takes(self.sub_head)
        self.sub_head = Int4Linear(self.sub_head) if quantized else pack_layer(self.sub_head) if not rows else self.sub_head
        return quantize_linears(self.head) + int(quantized)

    def _sub(self, feats: Tensor) -> Tensor:  # (..., d) -> (..., N) float32 logits over the head's vocabulary
        return self.sub_head(feats).float()

    def _scaled(self, sub: Tensor) -> Tensor:
        """Logits for drawing drafts: divided by tau (no copy when tau = 1)."""
        return sub if self.tau == 1.0 else sub / self.tau

    def _widen(self, sub: Tensor) -> Tensor:
        """(..., N) logits on the head's tokens -> (..., V) logits, -inf outside vocab_ids."""
        logits = torch.full((*sub.shape[:-1], self.vocab_size), float("-inf"), device=sub.device)
        logits[..., self.vocab_ids] = sub.float()
        return logits

    @torch.inference_mode()
    def _run(self, z: Tensor, positions: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """The head body over z (B, m, d) on the state's cache -> (B, m, d). positions (m,) and mask
        (m, entries + m) bool, True where a row may attend: a tree's rows; None: causal."""
        cache = self._s.cache
        if not isinstance(cache, DynamicCache):  # a KVBuffer: the head's own, or on a graphed head's store
            return self._layers(z, cache, positions, mask)
        # the general forward's additive (1, 1, m, L + m) mask and (1, m) positions
        extra = {} if mask is None else {"attention_mask": additive_mask(mask, z.dtype), "position_ids": positions[None]}
        return self.head.body(inputs_embeds=z, past_key_values=cache, use_cache=True, **extra).last_hidden_state

    def _head(self, feats: Tensor, tokens: Tensor) -> Tensor:
        return self._run(self.head.inputs(feats.to(self.dtype), self.embed(tokens).to(self.dtype)))  # (B, T, d)

    @torch.inference_mode()
    def prefill(self, input_ids: Tensor, target_hidden: Tensor | None) -> None:
        if self.by_hand:
            from ears_core.model.cuda.graphed import GraphedHead
            self._layers = head_layers(self.head, self.cuda_graphs and input_ids.shape[0] == 1)
            if isinstance(self._layers, GraphedHead) and self._n_space:  # one captured graph per draft step
                self._steps = self._layers.__dict__.get("step_graphs")
                if self._steps is None:
                    self._steps = self._layers.__dict__["step_graphs"] = StepGraphs(self, self._layers.runner)
            cache: KVBuffer | DynamicCache = self._layers.new_cache(input_ids.shape[0], max(256, 2 * input_ids.shape[1]))
        else:
            cache = DynamicCache(config=self.head.config)
        self._s = _State(cache, 0, None, None)
        t = input_ids.shape[1]
        if target_hidden is not None and t >= 2:  # entries (f_j, x_{j+1}) for j = 0 .. T-2
            self._s.next_feat = self._head(target_hidden[:, : t - 1], input_ids[:, 1:t])[:, -1]
            self._s.cache_len = t - 1

    @torch.inference_mode()
    def propose(self, k: int, probs_fn: ProbsFn, uniforms: Tensor, keep: Keep | None = None, confidences: bool = False
                ) -> tuple[Tensor, Tensor]:
        """Draft up to k tokens (drafters.py: ``Drafter.propose``, device confidence)."""
        s = self._s
        assert s is not None, "prefill() first"
        if k > 0:
            self.sync()
        scored = keep is not None or confidences  # the confidence is computed (and read only for keep)
        steps = self._steps if self._steps is not None and StepGraphs.usable(probs_fn) else None  # batch 1, N tokens
        ids = self.vocab_ids if self._n_space else None  # drawn on the head's tokens, or over V
        feat = s.next_feat  # (B, d)

        def step(i: int, drafts: list[Tensor]) -> tuple[Tensor | None, Draw]:
            nonlocal feat
            if steps is not None:  # the whole step as one captured graph (draft/step_graphs.py)
                feat, conf_t, pr, tok = steps.step(s.cache, feat, drafts[-1] if i else None, uniforms[:, i], probs_fn)
                return conf_t, lambda u: (pr, tok)
            if i > 0:  # the head's predicted feature after the previous draft
                feat = self._head(feat.unsqueeze(1), drafts[-1].unsqueeze(1))[:, -1]
            sub = self._sub(feat)  # (B, N)
            conf_t = torch.softmax(sub, dim=-1).max(dim=-1).values.mean() if scored else None
            return conf_t, lambda u: drawn(  # probs (B, N) on the head's tokens, or (B, V) zero outside vocab_ids
                probs_fn(self._scaled(sub) if ids is not None else self._widen(self._scaled(sub))), u, ids)

        s.proposed, q = draft_chain(self, k if feat is not None else 0, uniforms, keep, step, ask_ahead=True,
                                    confidences=confidences, batch=1 if feat is None else feat.shape[0],
                                    device=self.w_sub.device)
        if ids is not None and q.shape[1]:  # widen once: zero outside vocab_ids
            q = q.new_zeros(q.shape[0], q.shape[1], self.vocab_size).index_copy_(-1, ids, q)
        return s.proposed, q  # (B, k'), (B, k', V)

    @torch.inference_mode()
    def sync(self) -> None:
        """Feed the queued committed entries to the head in one forward (see ``commit``)."""
        s = self._s
        assert s is not None, "prefill() first"
        if not s.pending:
            return
        feats = torch.cat([h for h, _ in s.pending], dim=1)  # (B, n, d)
        tokens = torch.cat([t for _, t in s.pending], dim=1)  # (B, n)
        s.pending = []
        s.next_feat = self._head(feats, tokens)[:, -1]  # entries (f_L+j, x_L+j+1)
        s.cache_len += tokens.shape[1]

    @torch.inference_mode()
    def commit(self, num_accepted: int, next_token: Tensor, target_hidden: Tensor | None) -> None:
        """Keep the first ``num_accepted`` proposals and next_token (module terms); target_hidden (B, n + 1, d)."""
        s = self._s
        assert s is not None, "prefill() first"
        drop_last_positions(s.cache, s.cache.get_seq_length() - s.cache_len)  # the entries from predicted features
        if target_hidden is None:
            raise ValueError("EagleDrafter needs the target's hidden states (needs_target_hidden = True)")
        proposed = s.proposed if s.proposed is not None else next_token.reshape(-1, 1)[:, :0]
        kept = torch.cat([proposed[:, :num_accepted], next_token.reshape(-1, 1)], dim=1)  # (B, n+1)
        s.pending.append((target_hidden[:, : num_accepted + 1], kept))
        s.proposed = None

    # ------------------------------------------------------------------ trees (seed 002, trees.py)
    @torch.inference_mode()
    def propose_tree(self, spec: Any, probs_fn: ProbsFn, draws: Any, *, build: Any = None, **options: Any
                     ) -> DraftTree:
        """``ModelDrafter.propose_tree`` (drafters.py) on the head: a node's entry is fc([predicted feature at its
        parent ; E(token)]) at position cache_len + depth - 1, as the chain's."""
        self.sync()
        s = self._s
        assert s is not None, "prefill() first"
        dev = self.w_sub.device
        s.proposed = torch.empty((1, 0), dtype=torch.long, device=dev)
        if s.next_feat is None or spec.depth == 0:
            return DraftTree.empty(self.vocab_size, dev)
        feats = {-1: s.next_feat[0]}  # node -> predicted feature (d,); -1: the root
        slots: list[int] = []  # tree nodes in the head's cache, in cache order

        def expand(ids: list[int], tree: DraftTree) -> Tensor:
            parent_f = torch.stack([feats[tree.parents[i]] for i in ids]).to(self.dtype)  # (m, d)
            z = self.head.inputs(parent_f, self.embed(node_rows(tree.tokens, ids)).to(self.dtype))[None]  # (1, m, d)
            mask, pos = draft_pass(tree, ids, slots, s.cache_len, dev)
            out = self._run(z, pos, mask)[0]  # (m, d)
            slots.extend(ids)
            feats.update(zip(ids, out))
            return self._widen(self._sub(out))  # (m, V), -inf outside vocab_ids

        draw_fn = probs_fn if self.tau == 1.0 else (lambda logits: probs_fn(self._scaled(logits)))  # ranks stay raw
        tree = (build or build_tree)(self._widen(self._sub(s.next_feat))[0], expand, spec, draw_fn, draws, **options)
        s.proposed = tree.tokens[None]  # (1, N)
        return tree

    @torch.inference_mode()
    def commit_tree(self, path: list[int], next_token: Tensor, target_hidden: Tensor | None,
                    nodes: Tensor | None = None) -> None:
        """Keep nodes ``path`` (root first) and next_token, as ``commit`` keeps a chain's drafts; ``nodes``: the
        path as a (n,) long tensor on the device, where the caller has one (drafters.py: ``ModelDrafter.commit_tree``)."""
        s = self._s
        assert s is not None and s.proposed is not None, "propose_tree() first"
        s.proposed = s.proposed[:, path] if nodes is None else s.proposed.index_select(1, nodes)  # (1, n)
        self.commit(len(path), next_token, target_hidden)
