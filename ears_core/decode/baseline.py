"""Target-only decoding, one token per forward pass: the baseline every speed ratio is measured against.

It stays a plain loop rather than the round loop with no drafts: the baseline must carry none of the
speculative machinery (no drafter calls, no round records, no verdict to unpack), so that a ratio measures
what speculation adds and nothing else. Its draws are the ones the round loop's plain target steps use
(the target stream at each output position), and at T = 0 it takes the argmax, as greedy verification does.

Terms
-----
read        the one wait of the loop (decode/waits.py): the decided tokens with their p and max P_target, kept
            on the device as they are decided (each pass's token feeds the next on the device), read in one
            ``tolist`` every ``read_every`` tokens or after ``READ_MS`` on the host clock, whichever comes first,
            and at the end. On a GPU ``READ_EVERY`` tokens a read (a read a token held the host to the device's
            pace: the floor of a captured step is a fraction of a read's round trip); on the CPU, where a read
            waits for nothing, every token (a stream token by token).
end         an end-of-sequence token among those read ends the stream there; the passes already run after it
            (fewer than ``read_every``) are dropped.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

import torch
from torch import Tensor

from ears_core.decode.rounds import DecodeConfig
from ears_core.decode.text import Detokenizer
from ears_core.events import StepRecord, TokenEvent
from ears_core.model.passes.attention import avoid_replanning_attention
from ears_core.model.passes.kv_cache import new_cache
from ears_core.sampling import Stream, counter_uniforms, first_argmax, logits_to_probs, sample_with_uniforms
from ears_core.timing import StepClock

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["READ_EVERY", "READ_MS", "reads_every", "target_only_events"]

READ_EVERY = 8  # tokens a read off the CPU (module terms: read)
READ_MS = 50.0  # ... or host milliseconds since the last read, whichever comes first: the stream stays smooth


def reads_every(device: torch.device) -> int:
    """Tokens a read by default on ``device`` (module terms: read): 1 on the CPU, ``READ_EVERY`` elsewhere."""
    return 1 if device.type == "cpu" else READ_EVERY


def target_only_events(target: PreTrainedModel, ids: Tensor, cfg: DecodeConfig, steps: list[StepRecord],
                       detok: Detokenizer, read_every: int | None = None) -> Iterator[TokenEvent]:
    """Decode ``ids`` (1, T) with the target alone; yields one "target" TokenEvent per pass. ``read_every``:
    tokens a read (module terms), default ``reads_every(device)``."""
    avoid_replanning_attention(ids.device)  # as the speculative loop does: the same kernels, the same numerics
    every = read_every or reads_every(ids.device)
    clock = StepClock(ids.device)
    u_all = counter_uniforms(cfg.seed, torch.arange(cfg.max_new_tokens, device=ids.device), Stream.TARGET)  # (N,)
    decided = torch.empty(cfg.max_new_tokens, 3, dtype=torch.float64, device=ids.device)  # (N, 3): token, p, max P
    certain = torch.ones(2, dtype=torch.float64, device=ids.device)  # p and max P of a greedy token
    marks: list[tuple[object, object]] = []  # each pass's clock marks, read with the tokens
    cache = new_cache(target)
    inp, first, last_read = ids, 0, time.perf_counter()  # first: the first position not read yet
    for n in range(cfg.max_new_tokens):
        with torch.inference_mode():
            t0 = clock.mark()
            logits = target(inp, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, : cfg.vocab_size]
            if cfg.sampling.greedy:  # (1,): the argmax, where the one-hot probabilities put p = max P = 1
                tok = first_argmax(logits.float())
                p_and_max = certain
            else:
                probs = logits_to_probs(logits, cfg.sampling)  # (1, V)
                tok = sample_with_uniforms(probs, u_all[n: n + 1])  # (1,)
                p_and_max = torch.cat([probs.gather(1, tok.view(1, 1))[0], probs.amax(1)]).double()  # (2,)
            marks.append((t0, clock.mark()))
            decided[n] = torch.cat([tok.double(), p_and_max])  # (3,), on the device
        inp = tok.view(1, 1)
        if n + 1 - first < every and n + 1 < cfg.max_new_tokens and (time.perf_counter() - last_read) * 1e3 < READ_MS:
            continue
        rows = decided[first: n + 1].tolist()  # the read (module terms)
        last_read = time.perf_counter()
        for j, (tok_id, p, max_p) in enumerate(rows, start=first):
            ev = TokenEvent(j, j, int(tok_id), "", "target", p, None, None, None, None, max_p, 0.0)
            steps.append(StepRecord(j, 0, 0, 0, 1, 0.0, clock.ms(*marks[j])))
            ev.text = detok.add(ev.token_id)
            yield ev
            if ev.token_id in cfg.eos:
                return
        first = n + 1
