"""On CUDA the decode loop, the baseline and the price measurement turn cuDNN's attention backend off (it
re-plans for every new pass width); on the CPU nothing changes."""

from __future__ import annotations

import torch

from ears_core import autoregressive, generate
from ears_core.model.passes import attention
def test_cudnn_attention_is_turned_off_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: True)
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda on: calls.append(on))
    attention.avoid_replanning_attention(torch.device("cpu"))
    assert calls == []
    attention.avoid_replanning_attention(torch.device("cuda"))
    assert calls == [False]


def test_both_decoders_ask_for_it_with_their_device(monkeypatch, tiny_pair):
    import ears_core.decode.baseline as baseline
    import ears_core.decode.rounds as rounds

    seen = []
    monkeypatch.setattr(rounds, "avoid_replanning_attention", lambda dev: seen.append(("speculative", dev.type)))
    monkeypatch.setattr(baseline, "avoid_replanning_attention", lambda dev: seen.append(("target-only", dev.type)))
    target, draft = tiny_pair
    ids = torch.tensor([[1, 5, 7]])
    generate(target, draft, ids, k=2, temperature=0.0, max_new_tokens=3)
    autoregressive(target, ids, temperature=0.0, max_new_tokens=3)
    assert seen == [("speculative", "cpu"), ("target-only", "cpu")]
