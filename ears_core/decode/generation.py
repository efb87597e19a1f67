"""What a decode run hands back (``Generation``, ``GenerationResult``) and the checks every request passes.

Terms
-----
generation   an iterator of TokenEvents as the decode loop decides them; ``events``, ``steps`` (one
             ``StepRecord`` per round) and, for a tree run, ``trees`` (one ``TreeRecord`` per round) grow live,
             so a UI can read them while iterating.
decode clock ``decode_s`` counts only the time spent inside ``next()`` (decoding), never the caller's time
             between tokens (rendering): a run that streams charts and one that does not are measured alike.
             ``samples`` holds (decode_s, tokens so far) after every token, for a throughput chart.
wall clock   what a user waits, from ``started_at`` (the Generation's creation, or the request's arrival when a
             front end sets it earlier) to the latest token: ``stats()`` gives ``wall_s``, time to first token
             ``ttft_s``, the decode clock's part of it (``first_token_decode_s``: the prefill and the first
             round), ``setup_s`` (until the first ``next()``) and ``waits``: labelled parts of the time
             outside the decoder that whoever caused them recorded (e.g. a wait for the model pair to load).
deadline     ``deadline_s`` seconds of decoding at most: once they are spent (and at least one token is out)
             iteration ends, ``timed_out`` is set and ``result()`` gives the tokens so far.
max_drafts   the most drafts one round may send: K for a chain, the node budget for a tree (0: target only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch
from torch import Tensor

from ears_core.draft.drafters import model_vocab_size, scored_vocab
from ears_core.events import StepRecord, TokenEvent
from ears_core.metrics import GenerationStats, summarize
from ears_core.threads import note_pool

if TYPE_CHECKING:  # annotations only: importing it loads transformers' modeling code (seconds)
    from transformers import PreTrainedModel

__all__ = ["GenerationResult", "Generation", "as_input_ids", "eos_set", "check_request", "shared_vocab"]


@dataclass
class GenerationResult:
    token_ids: list[int]  # new tokens only
    text: str
    events: list[TokenEvent]
    steps: list[StepRecord]
    stats: GenerationStats
    timed_out: bool = False  # the deadline stopped decoding: the tokens so far
    stop: str = "length"  # why decoding ended: "length" (max_new_tokens), "eos" (an end-of-sequence token), "deadline"


class Generation:
    """An iterator of TokenEvents as they are decided; ``result()`` once it is exhausted (or stopped)."""

    def __init__(self, method: str, max_drafts: int, steps: list[StepRecord], events_iter: Iterator[TokenEvent],
                 deadline_s: float | None = None, trees: list[Any] | None = None, eos: frozenset[int] = frozenset()
                 ) -> None:
        self.method = method
        self.eos = eos  # the end-of-sequence ids the decode stops at (for ``result().stop``)
        self.max_drafts = max_drafts
        self.events: list[TokenEvent] = []
        self.steps = steps  # appended to by the decode loop, one record per round
        self.trees = trees if trees is not None else []  # a tree run's TreeRecords, one per round
        self.samples: list[tuple[float, int]] = [(0.0, 0)]
        self.deadline_s = deadline_s
        self.decode_s = 0.0
        self.timed_out = False
        self.started_at = time.perf_counter()  # the wall clock's start (module terms)
        self.waits: dict[str, float] = {}  # labelled seconds outside the decoder, on the wall clock
        self._first_call: float | None = None  # perf_counter() at the first next()
        self._first_token: tuple[float, float] | None = None  # (perf_counter(), decode_s) at the first token
        self._last = self.started_at  # perf_counter() after the latest next()
        self._it = events_iter
        self._finished = False

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> TokenEvent:
        if self._finished:
            raise StopIteration
        if self.deadline_s is not None and self.events and self.decode_s >= self.deadline_s:
            self.timed_out = self._finished = True
            raise StopIteration
        t0 = time.perf_counter()
        if self._first_call is None:
            self._first_call = t0
            note_pool()  # this thread decodes: it holds torch's pool from here on (threads.py: pooled)
        try:
            ev = next(self._it)
        except StopIteration:
            self._finished = True
            raise
        finally:
            self._last = time.perf_counter()
            self.decode_s += self._last - t0
        if self._first_token is None:
            self._first_token = (self._last, self.decode_s)
        self.events.append(ev)
        self.samples.append((self.decode_s, len(self.events)))
        return ev

    def stats(self) -> GenerationStats:
        """Metrics of the tokens so far, on the decode clock, with the wall clock's fields (module terms)."""
        stats = summarize(self.method, self.events, self.steps, self.decode_s, self.max_drafts)
        if self._first_call is None:
            return stats
        first = self._first_token
        return replace(stats, wall_s=self._last - self.started_at, setup_s=self._first_call - self.started_at,
                       ttft_s=None if first is None else first[0] - self.started_at,
                       first_token_decode_s=None if first is None else first[1], waits=dict(self.waits))

    def result(self) -> GenerationResult:
        """Finish decoding (unless the deadline passed) and fold everything into a result."""
        for _ in self:
            pass
        ids = [e.token_id for e in self.events]
        text = "".join(e.text for e in self.events)
        stop = "deadline" if self.timed_out else "eos" if ids and ids[-1] in self.eos else "length"
        return GenerationResult(ids, text, self.events, self.steps, self.stats(), self.timed_out, stop)


# ----------------------------------------------------------------------------- request checks


def as_input_ids(input_ids: Any, device: torch.device) -> Tensor:
    """One prompt as a (1, T) long tensor on ``device``; a clear error for anything else."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(
            f"input_ids must be one prompt of shape (T,) or (1, T), got {tuple(ids.shape)}; the "
            "decoder runs one prompt at a time (verify() itself is batched)"
        )
    if ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token (type some text)")
    return ids.to(device)


def eos_set(target: PreTrainedModel, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    """The end-of-sequence ids: the ones given, else the target's generation config's."""
    if eos_token_id is None:
        gc = getattr(target, "generation_config", None)
        eos_token_id = getattr(gc, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(t) for t in eos_token_id)


def check_request(target: PreTrainedModel, ids: Tensor, max_new_tokens: Any, seed: Any, vocab_size: int) -> None:
    """The checks every decode loop makes of a request: length, seed, context, token ids."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"target's context length ({limit}); shorten the prompt or lower max_new_tokens"
        )
    if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        raise ValueError(f"input_ids hold token ids outside the vocabulary [0, {vocab_size})")


def shared_vocab(target: PreTrainedModel, draft_vocab: int, vocab_size: int | None) -> int:
    """The vocabulary draft and target share: ``vocab_size`` if given, else both sides' scored vocabularies
    (``scored_vocab``: a loaded pair's tokenizer length, else the heads' rows), which must agree."""
    if vocab_size is not None:
        rows = model_vocab_size(target)
        if vocab_size > min(rows, draft_vocab):
            raise ValueError(
                f"vocab_size={vocab_size} is larger than the target's ({rows}) or the "
                f"draft's ({draft_vocab}) output head"
            )
        return vocab_size
    target_vocab = scored_vocab(target)
    if target_vocab != draft_vocab:
        raise ValueError(
            f"draft and target vocabularies differ ({draft_vocab} vs {target_vocab} tokens): the "
            "models must share a tokenizer. If one only pads its output head, pass "
            "vocab_size=len(tokenizer)"
        )
    return target_vocab
