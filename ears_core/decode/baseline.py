"""Target-only decoding, one token per forward pass: the baseline every speed ratio is measured against.

It stays a plain loop rather than the round loop with no drafts: the baseline must carry none of the
speculative machinery (no drafter calls, no round records, no verdict to unpack), so that a ratio measures
what speculation adds and nothing else. Its draws are the ones the round loop's plain target steps use
(the target stream at each output position), and at T = 0 it takes the argmax, as greedy verification does.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor
from transformers import PreTrainedModel

from ears_core.decode.rounds import DecodeConfig
from ears_core.decode.text import Detokenizer
from ears_core.events import StepRecord, TokenEvent
from ears_core.model.passes.attention import avoid_replanning_attention
from ears_core.model.passes.kv_cache import new_cache
from ears_core.sampling import Stream, counter_uniforms, first_argmax, logits_to_probs, sample_with_uniforms
from ears_core.timing import StepClock

__all__ = ["target_only_events"]


def target_only_events(target: PreTrainedModel, ids: Tensor, cfg: DecodeConfig, steps: list[StepRecord],
                       detok: Detokenizer) -> Iterator[TokenEvent]:
    """Decode ``ids`` (1, T) with the target alone; yields one "target" TokenEvent per pass."""
    avoid_replanning_attention(ids.device)  # as the speculative loop does: the same kernels, the same numerics
    clock = StepClock(ids.device)
    u_all = counter_uniforms(cfg.seed, torch.arange(cfg.max_new_tokens, device=ids.device), Stream.TARGET)  # (N,)
    cache = new_cache(target)
    inp = ids
    for n in range(cfg.max_new_tokens):
        with torch.inference_mode():
            t0 = clock.mark()
            logits = target(inp, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, : cfg.vocab_size]
            probs = logits_to_probs(logits, cfg.sampling)  # (1, V)
            # (1,): at T = 0 probs is one-hot, and the draw from it is its argmax
            tok = first_argmax(probs) if cfg.sampling.greedy else sample_with_uniforms(probs, u_all[n: n + 1])
            t1 = clock.mark()
            tok_id, p, max_p = torch.stack([tok[0].double(), probs[0, tok[0]].double(), probs[0].max().double()]).tolist()
        ev = TokenEvent(n, n, int(tok_id), "", "target", p, None, None, None, None, max_p, 0.0)
        steps.append(StepRecord(n, 0, 0, 0, 1, 0.0, clock.ms(t0, t1)))
        ev.text = detok.add(ev.token_id)
        yield ev
        if ev.token_id in cfg.eos:
            return
        inp = tok.view(1, 1)
