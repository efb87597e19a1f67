"""The device round's decide as one graph per key (decode/verify_graphs.py), checked on the CPU through a bank that
acts as a CUDA graph does: the first call of a key runs and keeps its output tensors, every later call recomputes from
the static buffers into those same tensors. Whole runs through it decide as the plain device round for every rule that
can be captured, with one graph per key; the budget, which holds per-run state, is never keyed."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import PROMPTS, perturbed_copy, tiny_llama
from ears_core import generate
from ears_core.decode import device_round
from ears_core.decode.chain import RoundHost
from ears_core.decode.device_round import device_verify
from ears_core.decode.verify_graphs import VerifyGraphs, graphs_for, rule_key
from ears_core.draft.drafters import NGramDrafter
from ears_core.rules import RULES, EARSRule, make_rule

from test_device_round import RULE_PARAMS, same_run

CPU = torch.device("cpu")
CAPTURABLE = [name for name in RULES if name != "ears-budget"]


class ReplayingBank:
    """A graph bank as CUDA's replays behave: outputs fixed at the first call of a key, overwritten after."""

    def __init__(self) -> None:
        self.outputs: dict = {}
        self.calls: Counter = Counter()
        self.capture = True
        self.capture_s = 0.0

    def run(self, key, fn):
        self.calls[key] += 1
        fresh = fn()
        kept = self.outputs.setdefault(key, fresh)
        for old, new in zip(kept, fresh):
            old.copy_(new)
        return kept


def replaying_graphs() -> VerifyGraphs:
    graphs = VerifyGraphs(CPU, capture=False)
    graphs.bank = ReplayingBank()
    return graphs


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0)
    return target, perturbed_copy(target, 0.03, seed=1)


@pytest.mark.parametrize("temperature", [0.9, 0])
@pytest.mark.parametrize("name", CAPTURABLE)
def test_runs_through_the_decide_graphs_decide_as_the_plain_device_round(pair, monkeypatch, name, temperature):
    target, draft = pair
    kw = dict(k=4, temperature=temperature, max_new_tokens=30, device_round=True)
    plain = [generate(target, draft, p, rule=make_rule(name, **RULE_PARAMS), seed=s, **kw) for s, p in enumerate(PROMPTS[:3])]
    graphs = replaying_graphs()
    monkeypatch.setattr(device_round, "graphs_for", lambda device, rule: graphs)
    for seed, (prompt, want) in enumerate(zip(PROMPTS[:3], plain)):
        same_run(want, generate(target, draft, prompt, rule=make_rule(name, **RULE_PARAMS), seed=seed, **kw))
    calls = graphs.bank.calls
    ks = sorted(dict(key[2:])["tokens"][0][1] for key in calls)  # a key per k: 4, and the last rounds' fewer
    assert ks[-1] == 4 and len(ks) == len(set(ks)) and max(calls.values()) >= 10  # replayed round after round


def test_rounds_of_several_k_and_an_ngram_drafter_replay_a_graph_per_key(pair, monkeypatch):
    target, _ = pair
    rule = EARSRule(beta=0.3)
    kw = dict(temperature=0.9, max_new_tokens=21, seed=3, device_round=True)
    want = [generate(target, NGramDrafter(96), PROMPTS[1], rule=rule, k=k, **kw) for k in (2, 5)]
    graphs = replaying_graphs()
    monkeypatch.setattr(device_round, "graphs_for", lambda device, r: graphs)
    for k, w in zip((2, 5), want):
        same_run(w, generate(target, NGramDrafter(96), PROMPTS[1], rule=rule, k=k, **kw))
    assert len(graphs.bank.calls) >= 2  # k = 2 and 5 (and the shorter rounds an n-gram lookup offers) apart


def test_a_rules_key_holds_its_parameters_and_a_stateful_rule_has_none():
    for name in CAPTURABLE:
        assert rule_key(make_rule(name, **RULE_PARAMS)) is not None, name
    assert rule_key(EARSRule(beta=0.1)) == rule_key(EARSRule(beta=0.1)) != rule_key(EARSRule(beta=0.2))
    budget = make_rule("ears-budget", epsilon=0.05)
    assert rule_key(budget) is None and graphs_for(CPU, EARSRule()) is None  # the CPU decides eagerly
    probs = torch.full((1, 3, 8), 1 / 8)
    inputs = dict(target_probs=probs, draft_probs=probs[:, :2], tokens=torch.zeros(1, 2, dtype=torch.long),
                  uniforms=torch.rand(1, 2), sample_uniforms=torch.rand(1, 3), support=None, confidences=None)
    with pytest.raises(ValueError, match="per-run state"):
        VerifyGraphs(CPU, capture=False).decide(device_verify, budget, inputs, True, RoundHost.pack)


def test_a_decides_next_token_outlives_the_next_replay_and_its_packed_read_is_the_eager_one():
    graphs, rule = replaying_graphs(), EARSRule(beta=0.2)
    g = torch.Generator().manual_seed(0)

    def inputs():
        target = torch.softmax(3 * torch.randn(1, 4, 16, generator=g), -1)  # (1, k+1, V)
        draft = torch.softmax(3 * torch.randn(1, 3, 16, generator=g), -1)  # (1, k, V)
        return dict(target_probs=target, draft_probs=draft, tokens=torch.multinomial(draft[0], 1, generator=g).T,
                    uniforms=torch.rand(1, 3, generator=g), sample_uniforms=torch.rand(1, 4, generator=g),
                    support=None, confidences=None)

    runs = [inputs() for _ in range(6)]
    got = [graphs.decide(device_verify, rule, x, True, RoundHost.pack) for x in runs]  # one key, replayed
    for x, (packed, next_token) in zip(runs, got):
        v = device_verify(x["target_probs"], x["draft_probs"], x["tokens"], rule, x["uniforms"], x["sample_uniforms"],
                          with_distortion=True)
        assert next_token.tolist() == v.next_token.tolist()  # still this round's after five more replays
    last = device_verify(*(runs[-1][n] for n in ("target_probs", "draft_probs", "tokens")), rule, runs[-1]["uniforms"],
                         runs[-1]["sample_uniforms"], with_distortion=True)
    assert got[-1][0].tolist() == RoundHost.pack(last, runs[-1]["tokens"]).tolist()
    assert len({tuple(t.tolist()) for _, t in got}) > 1 and sum(graphs.bank.calls.values()) == 6


def test_the_gpu_checks_capture_line_names_the_decide_graphs():
    from ears_core.gpu_check.plan import _all_told
    from ears_core.pair import ModelPair

    target = tiny_llama(0)
    check = _all_told(ModelPair(target, None, None, CPU, torch.float32, "tiny", 96), CPU)
    assert check.status == "pass" and check.figures["decide"] == {"graphs": 0, "capture_s": 0.0, "failed": None}
    assert "0 decide graphs" in check.detail
