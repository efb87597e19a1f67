"""The verify pass's head walked row by row (decode/row_walk.py): the same tokens and events as the whole pass for
every rule that decides row by row, fewer head rows, the rules that read other rows kept off it, and where the
head's growth turns it on (model/kernels/exact_head.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import tiny_llama
from ears_core import generate
from ears_core.decode.row_walk import walks
from ears_core.decode.verify import decide_drafts
from ears_core.draft.drafters import ModelDrafter
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.model.kernels import cpu_forms
from ears_core.model.kernels.exact_head import HeadForm
from ears_core.model.loading.lean_target import from_float_model
from ears_core.model.passes.lean_llama import LeanLlama
from ears_core.rules import StandardRule
from ears_core.rules.registry import RULES, make_rule

needs_int4 = pytest.mark.skipif(not cpu_forms.int4_runs(), reason="needs PyTorch's CPU int4 kernel running with "
                                "bfloat16 activations")
V = 96
HEAD_LOGITS = LeanLlama.head_logits  # the method itself, whatever a test patches over it


@pytest.fixture(scope="module")
def lean_pair():
    ref = tiny_llama(0, vocab=V, std=0.3)
    with torch.no_grad():
        ref.lm_head.weight.copy_(ref.model.embed_tokens.weight)  # the lean target ties its head
    draft = copy.deepcopy(ref)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.03 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return from_float_model(ref), draft


def _decode(lean, draft, rule, temperature: float, walk: bool, monkeypatch) -> tuple[list, list, int]:
    """Tokens, events and head rows of one speculative run, the walk forced on or off; ``draft`` a model, or a
    DraftHead (an EAGLE-style drafter: it reads the verify pass's hidden states)."""
    rows = []
    monkeypatch.setattr(LeanLlama, "head_grows_with_rows", property(lambda self: walk))
    monkeypatch.setattr(LeanLlama, "head_logits", lambda self, h: rows.append(h.shape[0]) or HEAD_LOGITS(self, h))
    drafter = EagleDrafter(draft, lean) if isinstance(draft, DraftHead) else ModelDrafter(draft, V)
    g = generate(lean, drafter, torch.tensor([[3, 17, 17, 60, 2, 88, 11, 4]]), rule=rule,
                 temperature=temperature, max_new_tokens=40, k=4, seed=3)
    events = [(e.kind, e.token_id, e.p, e.q, e.ratio, e.u, e.tolerance, e.max_p, e.distortion) for e in g.events]
    return g.token_ids, events, sum(rows)


@needs_int4
@pytest.mark.parametrize("name", [n for n, spec in RULES.items() if spec.cls.row_by_row])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_walked_head_gives_the_whole_pass_s_tokens_and_events_for_fewer_rows(lean_pair, name, temperature,
                                                                                monkeypatch) -> None:
    lean, draft = lean_pair
    rule = make_rule(name)
    whole = _decode(lean, draft, rule, temperature, False, monkeypatch)
    walked = _decode(lean, draft, make_rule(name), temperature, True, monkeypatch)
    assert walked[:2] == whole[:2]
    assert any(kind == "resampled" for kind, *_ in whole[1])  # some rounds stopped early...
    assert walked[2] < whole[2]  # ... and those paid fewer head rows


@needs_int4
def test_a_walked_head_feeds_an_eagle_head_the_whole_pass_s_hidden_states(lean_pair, monkeypatch) -> None:
    lean, _ = lean_pair
    torch.manual_seed(5)
    head = DraftHead(head_config_from_target(lean.config), torch.arange(0, V, 2)).eval()  # even ids only
    for name, temperature in (("greedy", 0.0), ("ears", 0.9)):
        whole = _decode(lean, head, make_rule(name), temperature, False, monkeypatch)
        walked = _decode(lean, head, make_rule(name), temperature, True, monkeypatch)
        assert walked[:2] == whole[:2] and walked[2] < whole[2]


@pytest.mark.parametrize("name", list(RULES))
def test_row_by_row_says_whether_a_position_s_decision_reads_later_rows(name) -> None:
    """A rule that decides row by row decides positions before j alike when the rows from j on are zeroed (what
    the walk leaves there); FLy and the budget read later rows, and some seed shows it."""
    rule_at = lambda: make_rule(name, **({"epsilon": 0.5} if name == "ears-budget" else {}))
    differs = False
    for seed in range(60):  # FLy parts on 16 cases, the budget on 5
        g = torch.Generator().manual_seed(seed)
        k = 4
        logits = 3 * torch.randn(1, k + 1, V, generator=g)
        target = torch.softmax(logits, -1)  # (1, K+1, V)
        draft = torch.softmax(logits[:, :k] + 1.5 * torch.randn(1, k, V, generator=g), -1)  # near the target
        tokens = torch.multinomial(draft[0], 1, generator=g).T  # (1, K)
        u = torch.rand(1, k, generator=g)
        full = decide_drafts(target, draft, tokens, rule_at(), u, check=False).kinds
        for j in range(1, k):
            cut = target.clone()
            cut[:, j + 1:] = 0
            part = decide_drafts(cut, draft, tokens, rule_at(), u, check=False).kinds
            differs |= not torch.equal(part[:, :j], full[:, :j])
    assert differs != RULES[name].cls.row_by_row


def test_a_rule_that_reads_other_rows_but_claims_row_by_row_is_caught_with_the_fix(lean_pair, monkeypatch) -> None:
    if not cpu_forms.int4_runs():
        pytest.skip("needs PyTorch's CPU int4 kernel running with bfloat16 activations")

    class Wider(StandardRule):  # accepts only when it sees more than one position at once
        def decide(self, x, tolerance):
            accepted = torch.full_like(x.p, x.p.shape[-1] > 1, dtype=torch.bool)
            return accepted, torch.zeros_like(accepted)

    lean, draft = lean_pair
    with pytest.raises(RuntimeError, match="row_by_row = False"):
        _decode(lean, draft, Wider(), 0.9, True, monkeypatch)


def test_the_walk_is_taken_where_the_head_grows_and_the_rule_allows() -> None:
    def form(layout: str, width: int, ms: dict) -> HeadForm:
        return HeadForm(layout, width, [[1]], {layout: width}, {layout: ms} if ms else {})

    assert form("linear", 16, {"1": 1.7, "2": 3.0}).grows_with_rows()  # bfloat16 emulated on AVX2
    assert not form("packed", 16, {"1": 1.8, "2": 2.0}).grows_with_rows()  # native bfloat16, packed
    assert form("packed", 1, {"1": 1.8}).grows_with_rows()  # one row a call: every row its own price
    assert not form("packed", 16, {}).grows_with_rows() and form("linear", 16, {}).grows_with_rows()  # unmeasured

    class Ctx:  # what walks() reads of a RoundContext
        def __init__(self, target, rule, device="cpu"):
            self.target, self.rule, self.device = target, rule, torch.device(device)

    class Target:
        head_grows_with_rows = True

        def head_logits(self, h):
            return h

    assert walks(Ctx(Target(), make_rule("ears")))
    assert not walks(Ctx(Target(), make_rule("fly"))) and not walks(Ctx(Target(), make_rule("ears-budget")))
    assert not walks(Ctx(Target(), make_rule("ears"), "meta"))  # off the CPU
    assert not walks(Ctx(object(), make_rule("ears")))  # a target that runs its head itself
    flat = Target()
    flat.head_grows_with_rows = False
    assert not walks(Ctx(flat, make_rule("ears")))


@needs_int4
def test_a_pass_without_its_head_gives_the_states_whose_head_rows_are_its_logits(lean_pair) -> None:
    lean, _ = lean_pair
    ids = torch.tensor([[5, 9, 2, 40, 7, 1]])
    with torch.inference_mode():
        whole = lean(ids, logits_to_keep=3)
        bare = lean(ids, logits_to_keep=3, head=False)
        assert bare.logits is None and bare.states.shape == (1, 3, lean.config.hidden_size)
        rows = torch.cat([lean.head_logits(bare.states[0, j: j + 1]) for j in range(3)])
    assert torch.equal(rows[None], whole.logits)
