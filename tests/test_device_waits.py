"""Waits counted on the CPU (decode/waits.py): the counter sees each kind, the device rounds make exactly one read
a round and nothing else for every rule, and the fixed tree's device tables (draft/fixed_tables.py) give today's
draws, masks and positions."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from conftest import PROMPTS, perturbed_copy, tiny_llama
from ears_core import EARSRule, generate
from ears_core.decode.api import tree_generate
from ears_core.decode.device_round import DeviceChainShape, HostReader
from ears_core.decode.device_tree import DeviceTreeShape
from ears_core.decode.tree import TreeShape
from ears_core.decode.verify_tree import children_table
from ears_core.decode.waits import counting, counting_rounds
from ears_core.draft.eagle import EagleDrafter
from ears_core.draft.fixed_trees import FixedTreeSpec, tables_for
from ears_core.draft.trees import (DraftTree, TreeDraws, TreeSpec, accept_uniforms, additive_mask, draft_pass,
                                   tree_position_ids, tree_visibility)
from ears_core.gpu_check.waits import baseline_waits, round_waits
from ears_core.pair import ModelPair
from ears_core.rules import RULES, make_rule
from ears_core.decode.tree_walk import walk_tree
from ears_core.rules import EntropyEARSRule, TypicalRule
from ears_core.rules.tree_distortion import MAX_STATES, node_emitted_distribution, path_distortions
from ears_core.serve.session import Session
from test_device_round import RULE_PARAMS, head_pair  # noqa: F401 (a fixture)
from test_tree_verify import exact_ears_tree
from test_tree_walk import random_trees

CPU = torch.device("cpu")


def test_the_counter_counts_each_kind_exactly():
    x = torch.arange(6.0)
    patched = (torch.tensor, torch.as_tensor, torch.nonzero, torch.Tensor.to, torch.Tensor.item, torch.Tensor.__getitem__,
               torch.Tensor.__bool__)
    with counting() as w:
        x.sum().item(), x.tolist(), bool(x[0] > 1), int(x[1]), float(x[2]), x.nonzero(), x.cpu()  # 7 reads
        torch.tensor([1, 2]), torch.as_tensor((3,)), x.new_tensor([1.0]), x[[0, 2]]  # 5 tensors from Python data
        x[[1]] = 0.0
        x.to("cpu")  # a copy, by the CPU's convention
        x.to(torch.float64), torch.as_tensor(x), x[1:3], x[0], x * 2, torch.zeros(3, device=CPU)  # none of them
    assert (w.read, w.python, w.copy, w.total) == (7, 5, 1, 13)
    assert all(s.startswith("tests/test_device_waits.py:") for k in w.sites for s in w.sites[k])
    assert len(set(w.sites["read"])) == 1 and len(w.sites["read"]) == 7  # each call, at its line
    assert (torch.tensor, torch.as_tensor, torch.nonzero, torch.Tensor.to, torch.Tensor.item, torch.Tensor.__getitem__,
            torch.Tensor.__bool__) == patched  # restored
    with counting() as after:
        pass
    x.sum().item()
    assert after.total == 0


def test_only_the_blocks_own_thread_is_counted():
    x = torch.ones(3)
    with counting() as w:
        t = threading.Thread(target=lambda: (x.sum().item(), torch.tensor([1])))
        t.start()
        t.join()
        x.sum().item()
    assert (w.read, w.python) == (1, 0)


def test_on_cuda_a_host_tensors_reads_are_not_waits():
    """With the round's device CUDA (module terms: device), a CPU tensor's read and move are host work; a tensor
    made from Python data still counts."""
    x = torch.arange(4.0)
    with counting("cuda") as w:
        x.sum().item(), x.tolist(), x.to("cpu"), x.cpu()
        torch.tensor([1, 2])
    assert (w.read, w.python, w.copy) == (0, 1, 0)


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0)
    return target, perturbed_copy(target, 0.03, seed=1)


def assert_one_read_a_round(rounds, steps):
    assert len(rounds) == len(steps) >= 4  # the bracket saw every round
    for i, w in enumerate(rounds[1:], start=2):
        assert (w.read, w.python, w.copy) == (1, 0, 0), f"round {i}: {w}"


def _spec(name: str) -> tuple[int, int, int]:
    """A tree that branches at the root and goes two deep; ears-budget decides on the device on one level only."""
    return (3, 1, 3) if name == "ears-budget" else (6, 2, 2)


@pytest.mark.parametrize("with_distortion", [True, False])
@pytest.mark.parametrize("name", list(RULES))
def test_a_device_tree_round_makes_one_read_and_nothing_else(pair, name, with_distortion):
    budget, depth, width = _spec(name)
    rule = make_rule(name, **RULE_PARAMS)
    assert DeviceTreeShape.takes(rule, TreeSpec(budget, depth, width))
    with counting_rounds(DeviceTreeShape) as rounds:
        out = tree_generate(*pair, PROMPTS[2], rule=rule, budget=budget, depth=depth, width=width,
                            temperature=0 if name == "greedy" else 0.9, max_new_tokens=16, seed=3, device_round=True,
                            with_distortion=with_distortion)
    assert_one_read_a_round(rounds, out.steps)
    if with_distortion and not rule.lossless:  # the distortion was computed on the device (rules/tree_distortion.py)
        assert any(e.distortion > 0 for e in out.events)


@pytest.mark.parametrize("with_distortion", [True, False])
@pytest.mark.parametrize("name", list(RULES))
def test_a_device_chain_round_makes_one_read_and_nothing_else(pair, name, with_distortion):
    rule = make_rule(name, **RULE_PARAMS)
    with counting_rounds(DeviceChainShape) as rounds:
        out = generate(*pair, PROMPTS[2], rule=rule, k=4, temperature=0 if name == "greedy" else 0.9, max_new_tokens=16,
                       seed=3, device_round=True, with_distortion=with_distortion)
    assert_one_read_a_round(rounds, out.steps)


def test_an_eagle_heads_device_rounds_make_one_read_and_nothing_else(head_pair):
    target, head = head_pair
    kw = dict(rule=EARSRule(0.4), temperature=0.9, max_new_tokens=16, seed=2, device_round=True)
    with counting_rounds(DeviceTreeShape) as rounds:
        out = tree_generate(target, EagleDrafter(head, target), PROMPTS[2], budget=8, depth=4, width=2, **kw)
    assert_one_read_a_round(rounds, out.steps)
    with counting_rounds(DeviceChainShape) as rounds:
        out = generate(target, EagleDrafter(head, target), PROMPTS[2], k=4, **kw)
    assert_one_read_a_round(rounds, out.steps)


def test_todays_tree_round_is_seen_waiting(pair):
    """The counter's power: today's tree round (best-first on the host) makes tensors from lists and reads."""
    with counting_rounds(TreeShape) as rounds:
        tree_generate(*pair, PROMPTS[2], rule=EARSRule(0.4), budget=6, depth=2, width=2, max_new_tokens=16, seed=3)
    assert all(w.read > 1 and w.python > 0 for w in rounds[1:])


SPECS = [(6, 2, 2), (14, 3, 2), (3, 1, 3), (4, 4, 1), (8, 4, 2), (8, 4, None), (5, 1, None)]


@pytest.mark.parametrize("budget,depth,width", SPECS)
def test_the_tables_give_todays_structure_draws_masks_and_positions(budget, depth, width):
    spec = FixedTreeSpec.of(TreeSpec(budget, depth, width))
    t = tables_for(spec, CPU)
    assert t is tables_for(spec, CPU)  # made once per shape and device
    parents, depths, ranks = spec.structure()
    entries = list(range(len(parents) + 1))
    assert (t.parents, t.depths, t.ranks) == (parents, depths, ranks)
    assert torch.equal(t.children, children_table(parents)) and t.parent_entry.tolist() == [p + 1 for p in parents]
    plain = DraftTree(torch.zeros(len(parents), dtype=torch.long), torch.zeros(len(parents), 4), parents, depths, ranks,
                      [], "sampled")  # the same tree without its tables: today's list-built answers
    for seed, start in ((0, 0), (7, 13), (-3, 1 << 20)):
        assert torch.equal(t.accept_uniforms(seed, start), accept_uniforms(seed, depths, ranks, start, CPU))
        for branching in (False, True):
            draws = TreeDraws(seed, start, branching)
            today = draws.uniforms([(depths[i], plain.path_ranks(i)) for i in range(len(parents))], CPU)
            assert torch.equal(t.draft_uniforms(draws), today)
    for length in (1, 9):
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(t.target_mask(length, dtype),
                               additive_mask(tree_visibility(parents, length, entries, entries), dtype))
        assert torch.equal(t.positions(length), tree_position_ids(depths, length, entries, CPU))
        for first, m in t.levels[:-1]:  # a drafter's pass over one level, on the levels above
            slots, ids = list(range(first)), list(range(first, first + m))
            plain.tables = None
            want = draft_pass(plain, ids, slots, length, CPU)
            plain.tables = t
            got = draft_pass(plain, ids, slots, length, CPU)
            if want[0] is None:  # the chain's next node: an ordinary causal step either way
                assert got == (None, None)
            else:
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_kept_histories_give_the_whole_enumeration_when_they_all_fit():
    """Three sampled siblings from a draft with three tokens of mass over V = 8 (rules/tree_distortion.py:
    histories): 3 histories after one draw, 6 after two. Room for 6 (of 8, then 48 states) gives the definition's
    distribution (tests/test_tree_verify.py: exact_ears_tree); room for 5 is too little (None: the bound)."""
    p = np.array([0.3, 0.05, 0.2, 0.1, 0.15, 0.05, 0.1, 0.05])
    q = np.array([0.0, 0.5, 0.0, 0.3, 0.0, 0.2, 0.0, 0.0])
    beta, v = 0.5, len(p)
    expected = exact_ears_tree(p, q, beta, 3, fixed=False)
    tol = torch.tensor(beta * (1 - p.max()), dtype=torch.float64)
    args = (EARSRule(beta), torch.tensor(p), torch.tensor([1, 3, 5]), torch.tensor(q)[None].expand(3, v), tol, "sampled")
    for room in (6, v, 1000):
        got = node_emitted_distribution(*args, max_states=room * v)
        assert got is not None and np.allclose(got.numpy(), expected, atol=1e-12), room
    assert node_emitted_distribution(*args, max_states=5 * v) is None
    assert 0.5 * np.abs(expected - p).sum() > 0.05  # power: far from P_target


@pytest.mark.parametrize("max_states", [MAX_STATES, 200])  # 200: past it for many entries (the bound)
@pytest.mark.parametrize("siblings", ["sampled", "fixed"])
@pytest.mark.parametrize("rule", [EARSRule(0.3), EntropyEARSRule(0.4), TypicalRule()], ids=repr)
def test_the_distortion_without_reads_is_the_host_walks_to_the_last_bit(rule, siblings, max_states, monkeypatch):
    """rules/tree_distortion.py (histories): every position at fixed shapes, with no wait, gives the host's values
    and exact flags bit for bit."""
    import ears_core.rules.tree_distortion as td

    monkeypatch.setattr(td, "MAX_STATES", max_states)
    parents = [-1, -1, -1, 0, 0, 3]
    tokens, target, draft, u, su = random_trees(parents, siblings, False)
    v = walk_tree(target, draft, tokens, parents, rule, uniforms=u, sample_uniforms=su, siblings=siblings)
    args = (rule, target, draft, tokens, children_table(parents), rule.tolerance(target, target.amax(-1)), v.path,
            v.num_accepted, v.is_bonus, siblings, torch.arange(0, 30, 2) if isinstance(rule, EARSRule) else None)
    host = path_distortions(*args)
    with counting() as w:
        fixed = path_distortions(*args, reads=False)
    assert w.total == 0, str(w)
    assert torch.equal(host[0], fixed[0]) and torch.equal(host[1], fixed[1])
    bounded = siblings == "sampled" and max_states < MAX_STATES  # some entries past the limit: the bound
    assert float(host[0].max()) > 0.01 and bool(host[1].all()) != bounded  # power


@pytest.fixture
def tiny_session(pair):
    """A session over the tiny pair on the CPU, as gpu_check's CPU form builds one."""
    return Session(ModelPair(*pair, None, CPU, torch.float32, "tiny", 96, "tiny-draft"))


def test_the_gpu_checks_round_waits_pass_on_the_cpu_and_fail_a_round_that_waits(tiny_session, monkeypatch):
    session, ids = tiny_session, torch.tensor([PROMPTS[2]])
    check = round_waits(session, ids, new_tokens=16)
    assert check.status == "pass", check.detail
    assert len(check.figures) == 6 and all(f["read"] == f["rounds"] > 0 and f["python"] == f["copy"] == 0
                                           for f in check.figures.values())
    read = HostReader.read
    monkeypatch.setattr(HostReader, "read", lambda self, packed: (packed.sum().item(), read(self, packed))[1])
    check = round_waits(session, ids, new_tokens=16)
    assert check.status == "fail" and "6 of 6 runs" in check.detail and "2 read" in check.detail


def test_the_gpu_checks_target_only_waits_pass_on_the_cpu_and_fail_a_step_that_reads_more(tiny_session, monkeypatch):
    from ears_core.decode import baseline

    session, ids = tiny_session, torch.tensor([PROMPTS[2]])
    check = baseline_waits(session, ids, new_tokens=12)
    assert check.status == "pass", check.detail
    assert check.figures["read"] == check.figures["allowed_reads"] == 11 and check.figures["python"] == 0
    first_argmax = baseline.first_argmax  # a step that reads its token on the host, as the loop once did
    monkeypatch.setattr(baseline, "first_argmax", lambda probs: torch.tensor([int(first_argmax(probs))]))
    check = baseline_waits(session, ids, new_tokens=12)
    assert check.status == "fail" and "python" in check.detail
