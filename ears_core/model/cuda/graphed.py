"""Models whose decode passes replay captured CUDA graphs: a causal LM (target or draft), ``GraphedLM``, with
transformers' calling convention (passes/attention.py), and an EAGLE head's body, ``GraphedHead``.

Terms
-----
captured pass  a pass over m <= ``MAX_WIDTH`` consecutive new tokens: its inputs copied into the width's static
               buffers, the graph for (m, bucket) replayed (cuda_graphs.py), the outputs copied out.
eager pass     anything else (a prompt, a tree pass) runs the same static pass (passes/static_decoder.py) without a
               graph: the same kernels, so the same numbers.
lazy           a GraphedLM builds its static pass at its first pass: on ZeroGPU that runs in the worker that holds
               the GPU, not in the app's process, whose "cuda" is a stand-in.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import Tensor, nn

from ears_core.model.passes.attention import PassOutput, avoid_replanning_attention, pass_inputs
from ears_core.model.cuda.cuda_graphs import GraphBank, bucket, graphs_wanted
from ears_core.model.passes.kv_cache import KVBuffer, KVStore
from ears_core.model.passes.static_decoder import StaticDecoder, additive_mask_over, causal_mask, supports

__all__ = ["GraphedLM", "GraphedHead", "MAX_WIDTH", "CAPACITY"]

MAX_WIDTH = 16  # the widest pass captured: a verify pass over K + 1 <= 16 tokens
CAPACITY = 1024  # positions a model's KV store starts with (it doubles past them)


class _Runner:
    """A static decoder, its KV state, its graphs and the per-width buffers they read (module terms)."""

    def __init__(self, static: StaticDecoder, capture: bool, lm: bool) -> None:
        avoid_replanning_attention(static.device)  # before any capture: no cuDNN attention plans inside a graph
        self.static = static
        self.bank = GraphBank(static.device, capture)
        self.kv = KVStore(static.new_kv(min(CAPACITY, static.max_positions), static.dtype, static.device))
        self.kv.banks.append(self.bank)
        self.lm = lm  # a causal LM's pass: token ids in, (states, logits) out, hidden states kept; else a head's
        self.arange = torch.arange(max(MAX_WIDTH, 1), device=static.device)  # (W,)
        self.io: dict[int, dict[str, Tensor]] = {}

    def _hidden(self, m: int) -> Tensor:
        """A buffer for the (L + 1, m, d) hidden states of a pass over m rows."""
        s = self.static
        return torch.empty(len(s.layers) + 1, m, s.hidden, dtype=s.dtype, device=s.device)

    def _body(self, x: Tensor, pos: Tensor, slots: Tensor, mask: Tensor, kv: Tensor, hidden: Tensor | None,
              keep: int = 0) -> Any:
        """What one pass computes from its rows x: a head's states (m, d); an LM's states (m, d) and logits (kept, V)."""
        s = self.static
        if not self.lm:
            return s.run(x, pos, slots, mask, kv, None)
        states = s.run(s.embed(x), pos, slots, mask, kv, hidden)  # (m, d)
        return states, s.logits(states[-keep:] if keep else states)

    def run(self, cache: KVBuffer, x: Tensor, positions: Tensor | None = None,
            seen: Tensor | None = None, keep: int = 0, want_hidden: bool = True) -> tuple[Any, Tensor | None]:
        """One pass over the m rows ``x`` at the cache's end -> (body outputs, hidden (L + 1, m, d) or None).
        positions (m,) and seen (m, length + m) bool: a tree pass; None: causal. An eager pass (a prompt) keeps the
        logits of its last ``keep`` rows (0: all) and hidden states if ``want_hidden`` (a long prompt's are big)."""
        m, n = int(x.shape[0]), cache.length
        s = self.static
        if n + m > s.max_positions:
            raise ValueError(f"a pass to position {n + m} is past the model's {s.max_positions} positions: "
                             "shorten the prompt or max_new_tokens")
        buf = cache.reserve(m)
        c = bucket(n + m, self.kv.capacity)
        kv = buf[:, :, :, :c]  # (L, 2, Hkv, c, D)
        if positions is None and seen is None and m <= MAX_WIDTH:
            io = self.io.get(m)
            if io is None:  # the width's static buffers
                io = self.io[m] = {"x": torch.empty_like(x), "pos": torch.empty(m, dtype=torch.long, device=s.device)}
                if self.lm:
                    io["hidden"] = self._hidden(m)
            io["x"].copy_(x)
            torch.add(self.arange[:m], n, out=io["pos"])

            def captured() -> Any:
                mask = causal_mask(io["pos"], c, s.groups, s.dtype)  # (G m, c)
                return self._body(io["x"], io["pos"], io["pos"], mask, kv, io.get("hidden"))

            out = self.bank.run((m, c), captured)
            cache.length = n + m
            return out, io.get("hidden")
        slots = torch.arange(n, n + m, device=s.device)  # (m,)
        pos = slots if positions is None else positions.reshape(-1).to(s.device)
        if seen is None:
            mask = causal_mask(slots, c, s.groups, s.dtype)
        else:
            wide = torch.zeros(m, c, dtype=torch.bool, device=s.device)
            wide[:, : n + m] = seen[..., : n + m].reshape(m, n + m)
            mask = additive_mask_over(wide, s.groups, s.dtype)
        hidden = self._hidden(m) if self.lm and want_hidden else None
        out = self._body(x, pos, slots, mask, kv, hidden, keep)
        cache.length = n + m
        return out, hidden

    @torch.inference_mode()
    def warm(self, widths: Any, rows: Any) -> None:
        """Capture the passes of ``widths`` on the first bucket now, on a scratch cache; rows(m) makes m input rows."""
        with self.kv.lock:
            cache = KVBuffer(self.kv)
            self.run(cache, rows(32))
            for m in widths:
                self.run(cache, rows(m))
                cache.crop(-m)


class GraphedLM(nn.Module):
    """A transformers causal LM whose passes replay CUDA graphs (module terms). Batch 1."""

    def __init__(self, model: nn.Module, capture: bool | None = None) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        dev = next(model.parameters()).device
        self._capture = graphs_wanted(dev) if capture is None else capture
        self._runner: _Runner | None = None  # built at the first pass (module terms: lazy)
        self._building = threading.Lock()  # two threads' first passes build it once
        self.ears_kernels = "cuda-graphs" if self._capture and dev.type == "cuda" else "static"

    @property
    def runner(self) -> _Runner:
        if self._runner is None:
            with self._building:
                if self._runner is None:
                    self._runner = _Runner(StaticDecoder.of_causal_lm(self.model), self._capture, lm=True)
        return self._runner

    @property
    def capture_failed(self) -> str | None:
        """Why passes run eagerly after all (cuda_graphs.py: fallback), or None."""
        return self._runner.bank.failed if self._runner is not None else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def capture_s(self) -> float:  # seconds spent capturing so far
        return self._runner.bank.capture_s if self._runner is not None else 0.0

    def warm(self, widths: Any) -> None:
        """Capture the passes over ``widths`` tokens now."""
        self.runner.warm(widths, lambda m: torch.zeros(m, dtype=torch.long, device=self.device))

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def new_cache(self) -> KVBuffer:
        return KVBuffer(self.runner.kv)

    @torch.inference_mode()  # the static buffers it updates in place are inference tensors once made there
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values: KVBuffer | None = None, use_cache: bool = True, logits_to_keep: int = 0,
                output_hidden_states: bool = False, **unused: Any) -> PassOutput:
        _, cache, seen = pass_inputs(self, input_ids, attention_mask, past_key_values, "a graphed model", self.runner.kv)
        with cache.kv.lock:  # the pass and the copies of its outputs (kv_cache.py: threads)
            (states, logits), hidden = self.runner.run(cache, input_ids[0], position_ids, seen, logits_to_keep,
                                                       output_hidden_states)
            keep = logits[-logits_to_keep:] if logits_to_keep else logits  # (kept, V)
            states_out = (tuple(h[None].clone() for h in hidden[:-1]) + (states[None].clone(),)  # each (1, m, d)
                          if output_hidden_states else None)
            return PassOutput(keep[None].clone(), states_out, cache)

    @torch.inference_mode()
    def generate(self, input_ids: Tensor, max_new_tokens: int = 20, **kwargs: Any) -> Tensor:
        """The wrapped model's ``generate`` (eager): transformers' full options."""
        return self.model.generate(input_ids, max_new_tokens=max_new_tokens, **kwargs)


class GraphedHead:
    """An EAGLE head body's layers as captured passes, with ``HeadLayers``' interface (module terms)."""

    def __init__(self, body: nn.Module, capture: bool | None = None) -> None:
        static = StaticDecoder(list(body.layers), body.norm, body.rotary_emb, body.config)
        self.runner = _Runner(static, graphs_wanted(static.device) if capture is None else capture, lm=False)

    @property
    def capture_s(self) -> float:
        return self.runner.bank.capture_s

    def warm(self, widths: Any) -> None:
        """Capture the passes over ``widths`` rows now."""
        s = self.runner.static
        self.runner.warm(widths, lambda m: torch.zeros(m, s.hidden, dtype=s.dtype, device=s.device))

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVBuffer:
        if batch != 1:
            raise ValueError("a graphed draft head drafts one sequence at a time (batch 1)")
        return KVBuffer(self.runner.kv)

    @torch.inference_mode()
    def __call__(self, z: Tensor, cache: KVBuffer, positions: Tensor | None = None,
                 mask: Tensor | None = None) -> Tensor:
        """z (1, m, d) -> (1, m, d) predicted features; positions (m,) and mask (m, length + m) bool: a tree's rows."""
        with cache.kv.lock:
            out, _ = self.runner.run(cache, z[0], positions, mask)
            return out[None].clone()


def graphed_or_eager(model: nn.Module) -> nn.Module:
    """``model`` as a GraphedLM where passes on its device are captured (``EARS_CUDA_GRAPHS``) and the static
    pass can run it; else ``model`` itself, with ``ears_eager_reason`` saying why where capture was wanted."""
    dev = next(model.parameters()).device
    if not graphs_wanted(dev):
        return model
    reason = supports(model)
    if reason is not None:
        model.ears_eager_reason = reason
        return model
    return GraphedLM(model, capture=True)

