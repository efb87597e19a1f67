"""Target-only decoding reads the host once every few tokens off the CPU (decode/baseline.py: read, end): the
same events as a read a token, one read per ``read_every`` tokens or per ``READ_MS``, and an end-of-sequence
token inside a batch ends the stream there."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import PROMPTS, tiny_llama
from ears_core.decode import baseline
from ears_core.decode.rounds import DecodeConfig
from ears_core.decode.text import Detokenizer
from ears_core.decode.waits import counting
from ears_core.sampling import SamplingConfig


def run(target, temperature: float, n: int, read_every: int | None, eos: frozenset[int] = frozenset()):
    cfg = DecodeConfig(SamplingConfig(temperature), n, 3, 96, eos, False)
    steps: list = []
    ids = torch.tensor([PROMPTS[2]])
    with counting("cpu") as waits:
        events = list(baseline.target_only_events(target, ids, cfg, steps, Detokenizer(None), read_every))
    return events, steps, waits


def fields(events):
    return [(e.position, e.token_id, e.kind, e.p, e.max_p) for e in events]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_read_every_eight_tokens_gives_the_events_of_a_read_a_token(monkeypatch, temperature):
    monkeypatch.setattr(baseline, "READ_MS", 1e9)  # the token count alone decides
    target = tiny_llama(0)
    each, each_steps, each_waits = run(target, temperature, 21, 1)
    batched, steps, waits = run(target, temperature, 21, 8)
    assert fields(batched) == fields(each) and len(steps) == len(each_steps) == 21
    assert each_waits.read == 21 and waits.read == math.ceil(21 / 8) == 3  # 8 + 8 + the last 5
    assert waits.python == each_waits.python and all(s.target_ms > 0 for s in steps)


def test_reads_come_at_least_every_read_ms(monkeypatch):
    monkeypatch.setattr(baseline, "READ_MS", 0.0)  # every pass outlasts it: a read a token again
    _, _, waits = run(tiny_llama(0), 0.9, 12, 8)
    assert waits.read == 12


def test_an_end_of_sequence_token_inside_a_read_ends_the_stream_there(monkeypatch):
    monkeypatch.setattr(baseline, "READ_MS", 1e9)
    target = tiny_llama(0)
    greedy = [e.token_id for e in run(target, 0.0, 20, 1)[0]]
    eos = greedy[5]
    stop = greedy.index(eos)  # its first occurrence: inside the first read of 8
    events, steps, waits = run(target, 0.0, 20, 8, frozenset([eos]))
    assert [e.token_id for e in events] == greedy[: stop + 1] and len(steps) == stop + 1 and waits.read == 1


def test_a_greedy_token_is_the_target_s_argmax_with_p_and_max_p_one():
    """At T = 0 the baseline takes the logits' first argmax and records p = max P = 1 without building the one-hot
    distribution: the tokens of transformers' greedy search."""
    target = tiny_llama(0)
    events, _, _ = run(target, 0.0, 12, 1)
    ids = torch.tensor([PROMPTS[2]])
    with torch.inference_mode():
        want = target.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert [e.token_id for e in events] == want
    assert all(e.p == 1.0 and e.max_p == 1.0 and e.kind == "target" for e in events)
