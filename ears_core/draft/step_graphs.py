"""A chain drafter's draft step as one captured CUDA graph (model/cuda/cuda_graphs.py).

Terms
-----
draft step    per drafted position: for a later position the model's pass over one row (eagle.py: drafting),
              then the logits, the confidence, the drawing distribution and the token drawn with the position's
              uniform. Eagerly some twenty small kernels; captured, one replay.
first / next  a round's first position reads the head's last output (no pass); later ones run it.
key           a graph per (first or next, KV bucket, ``probs_fn.sampling_key``); without a key the step runs eagerly.
bounded       a bank keeps the graphs of ``MAX_SAMPLINGS`` samplings at most, evicting the least recently used.
same numbers  the captured step runs the eager step's operations in its order (off CUDA the bank just calls).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

from ears_core.model.cuda.cuda_graphs import GraphBank, bucket
from ears_core.model.passes.kv_cache import KVBuffer
from ears_core.model.passes.static_decoder import causal_mask
from ears_core.sampling import sample_with_uniforms

__all__ = ["StepGraphs", "LMStepGraphs", "MAX_SAMPLINGS"]

MAX_SAMPLINGS = 4  # samplings whose draft-step graphs a bank keeps (module terms: bounded)


class _Steps:
    """What both kinds of captured draft step hold: a bank over the graphed model's KV and the step's inputs."""

    def __init__(self, runner: Any) -> None:
        s = runner.static
        self.runner, self.static = runner, s
        self.bank = GraphBank(s.device, capture=runner.bank.capture)
        runner.kv.banks.append(self.bank)  # captured over the model's KV: dropped with its graphs when it grows
        self.tok = torch.zeros(1, dtype=torch.long, device=s.device)  # (1,) the token fed: the previous draft
        self.u = torch.zeros(1, dtype=torch.float32, device=s.device)  # (1,) the position's uniform
        self.pos = torch.zeros(1, dtype=torch.long, device=s.device)  # (1,) the new row's slot and position
        self.samplings: OrderedDict[Any, None] = OrderedDict()  # least recently used first

    def use_sampling(self, key: Any) -> Any:
        """Mark sampling ``key`` used now, dropping the least recently used one's graphs (module terms: bounded)."""
        self.samplings.pop(key, None)
        self.samplings[key] = None
        while len(self.samplings) > MAX_SAMPLINGS:
            old, _ = self.samplings.popitem(last=False)
            for graph_key in [g for g in self.bank.graphs if g[-1] == old]:
                del self.bank.graphs[graph_key]
        return key

    @staticmethod
    def usable(probs_fn: Any) -> bool:
        """Whether ``probs_fn`` names its sampling (module terms: key), so its steps can be captured."""
        return getattr(probs_fn, "sampling_key", None) is not None

    def replay(self, cache: KVBuffer, prev: Tensor | None, u: Tensor, probs_fn: Any, body: Any) -> tuple[Tensor, ...]:
        """One draft position on ``cache`` as the graph of (first or next, bucket, sampling), captured on first use
        -> ``body(run)``'s outputs, cloned. ``run(x)`` is the model's static pass over x (1, d) at the cache's end,
        with ``prev`` (1,) the token fed; None with ``prev`` None (module terms: first / next)."""
        with cache.kv.lock:  # model/passes/kv_cache.py: threads
            s, n, c, run = self.static, cache.length, None, None
            self.u.copy_(u)
            if prev is not None:
                c = bucket(n + 1, self.runner.kv.capacity)
                kv = cache.reserve(1)[:, :, :, :c]
                self.tok.copy_(prev)
                self.pos.fill_(n)

                def run(x: Tensor) -> Tensor:  # (1, d) -> (1, d)
                    return s.run(x, self.pos, self.pos, causal_mask(self.pos, c, s.groups, s.dtype), kv)

            out = self.bank.run((prev is None, c, self.use_sampling(probs_fn.sampling_key)), lambda: body(run))
            if prev is not None:
                cache.length = n + 1
            return tuple(t.clone() for t in out)


class StepGraphs(_Steps):
    """The captured draft steps of the drafters sharing one graphed head (module terms)."""

    def __init__(self, drafter: Any, runner: Any) -> None:
        super().__init__(runner)
        s = self.static
        self.drafter = drafter
        self.feat = torch.zeros(1, s.hidden, dtype=s.dtype, device=s.device)  # (1, d) the input feature

    @torch.inference_mode()
    def step(self, cache: KVBuffer, feat: Tensor, prev: Tensor | None, u: Tensor, probs_fn: Any
             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One draft position -> (feature (1, d), confidence (1,), probabilities (1, N), token (1,)). feat (1, d):
        the head's last output (``prev`` None) or the predicted feature the previous draft ``prev`` was drawn from."""
        d = self.drafter

        def body(run: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            f = self.feat
            if run is not None:
                f = run(d.head.inputs(f.to(d.dtype), d.embed(self.tok).to(d.dtype)))  # (1, d)
            sub = d._sub(f)  # (1, N) float32 logits on the head's tokens
            conf = torch.softmax(sub, dim=-1).amax(dim=-1)  # (1,) at T = 1
            pr = probs_fn(d._scaled(sub))  # (1, N)
            return f, conf, pr, d.vocab_ids[sample_with_uniforms(pr, self.u)]

        with cache.kv.lock:  # the feature buffer too is the head's, shared
            self.feat.copy_(feat)
            return self.replay(cache, prev, u, probs_fn, body)  # type: ignore[return-value]


class LMStepGraphs(_Steps):
    """A draft model's (GraphedLM's) draft step as one captured graph (module terms)."""

    def __init__(self, model: Any, vocab_size: int) -> None:
        super().__init__(model.runner)
        self.vocab_size = vocab_size

    @torch.inference_mode()
    def step(self, cache: KVBuffer, tok: Tensor, u: Tensor, probs_fn: Any) -> tuple[Tensor, Tensor, Tensor]:
        """Feed ``tok`` (1,) -> (confidence (1,), probabilities (1, V), the drawn token (1,))."""
        s = self.static

        def body(run: Any) -> tuple[Tensor, Tensor, Tensor]:
            logits = s.logits(run(s.embed(self.tok)))  # (1, V_model)
            conf = torch.softmax(logits[:, : self.vocab_size].float(), dim=-1).amax(dim=-1)  # (1,) at T = 1
            pr = probs_fn(logits)  # (1, V)
            return conf, pr, sample_with_uniforms(pr, self.u)

        return self.replay(cache, tok, u, probs_fn, body)  # type: ignore[return-value]
