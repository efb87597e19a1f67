"""Which dtype and kernels a draft head computes with: the candidates, the measured choice, its cache."""

from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_llama
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.draft.head_kernels import MIN_GAIN, Variant, candidates, choose_head_variant, time_round

F32, F32P, BF, BFP = Variant("float32", False), Variant("float32", True), Variant("bfloat16", False), Variant("bfloat16", True)
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_candidates_follow_the_cpu_the_override_and_the_device():
    assert candidates(CPU, torch.float32, env={}, bf16=True, packing=True) == [F32, F32P, BF, BFP]
    assert candidates(CPU, torch.float32, env={}, bf16=False, packing=True) == [F32, F32P]  # emulated bf16: not tried
    assert candidates(CPU, torch.float32, env={}, bf16=True, packing=False) == [F32, BF]
    assert candidates(CPU, torch.bfloat16, env={}, bf16=True, packing=False) == [BF]  # the target's dtype
    assert candidates(CPU, torch.float32, env={"EARS_DRAFT_DTYPE": " BFloat16 "}, bf16=False, packing=True) == [BF, BFP]
    assert candidates(CUDA, torch.float32, env={}, bf16=True, packing=True) == [F32]  # a GPU: nothing to measure
    assert candidates(CUDA, torch.bfloat16, env={"EARS_DRAFT_DTYPE": "float32"}) == [F32]
    assert Variant("float16", False).torch_dtype == torch.float16
    with pytest.raises(ValueError, match="EARS_DRAFT_DTYPE='half' is not a draft dtype: use one of float32, bfloat16"):
        candidates(CPU, torch.float32, env={"EARS_DRAFT_DTYPE": "half"})


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(3)
    return DraftHead(head_config_from_target(tiny_llama(0).config), torch.arange(0, 96, 2)).eval()


def fakes(head, ms):
    made = []

    def make(v):
        made.append(v)
        return SimpleNamespace(head=head, variant=v)

    return make, made, (lambda d: ms[d.variant])


def test_the_fastest_variant_is_kept_and_cached(head, tmp_path):
    make, made, timer = fakes(head, {F32: 2.20, F32P: 2.76, BF: 2.55, BFP: 1.90})
    drafter, choice = choose_head_variant(None, make, [F32, F32P, BF, BFP], 96, cache_dir=tmp_path, timer=timer)
    assert drafter.variant == BFP and (choice.dtype, choice.packed) == ("bfloat16", True)
    assert choice.ms == {"float32": 2.2, "float32 packed": 2.76, "bfloat16": 2.55, "bfloat16 packed": 1.9}
    assert sorted(made, key=str) == sorted([F32, F32P, BF, BFP], key=str)
    (cached,) = (tmp_path / "kernels").glob("draft-*.json")
    assert "float32,float32 packed,bfloat16,bfloat16 packed" in cached.read_text()
    # The next load reads the choice: nothing is timed, only the first variant (for the key) and the winner are built.
    make, made, _ = fakes(head, {})
    drafter, again = choose_head_variant(None, make, [F32, F32P, BF, BFP], 96, cache_dir=tmp_path,
                                         timer=lambda d: pytest.fail("a cached choice is measured again"))
    assert drafter.variant == BFP and again.ms == choice.ms and made == [F32, BFP]
    # Other candidates (EARS_DRAFT_DTYPE set, say) are another key: measured afresh.
    make, made, timer = fakes(head, {F32: 2.0, F32P: 2.5})
    drafter, other = choose_head_variant(None, make, [F32, F32P], 96, cache_dir=tmp_path, timer=timer)
    assert drafter.variant == F32 and set(other.ms) == {"float32", "float32 packed"}


def test_another_variant_must_beat_the_targets_dtype_as_loaded_by_a_margin(head, tmp_path):
    close = 2.0 * (1 - MIN_GAIN / 2)  # faster, but by less than MIN_GAIN
    make, _, timer = fakes(head, {F32: 2.0, BF: close})
    drafter, choice = choose_head_variant(None, make, [F32, BF], 96, cache_dir=tmp_path, timer=timer)
    assert drafter.variant == F32 and choice.dtype == "float32" and choice.ms["bfloat16"] < choice.ms["float32"]


def test_one_candidate_is_built_without_a_measurement(head, tmp_path):
    make, made, _ = fakes(head, {})
    drafter, choice = choose_head_variant(None, make, [F32], 96, cache_dir=tmp_path, timer=lambda d: pytest.fail("timed"))
    assert drafter.variant == F32 and choice is None and made == [F32]
    assert not (tmp_path / "kernels").exists()


def test_a_timed_round_leaves_the_drafter_able_to_draft(head):
    # time_round prefills the drafter with made-up features; a generation prefills it again, so its
    # proposals afterwards are the same as a fresh drafter's.
    from ears_core import GreedyRule, generate

    target = tiny_llama(0)
    drafter = EagleDrafter(head, target)
    assert time_round(target, drafter, 96, cache_len=16) > 0
    prompt = [1, 5, 9, 14, 3]
    a = generate(target, drafter, prompt, rule=GreedyRule(), k=3, temperature=0, max_new_tokens=12)
    b = generate(target, EagleDrafter(head, target), prompt, rule=GreedyRule(), k=3, temperature=0, max_new_tokens=12)
    assert a.token_ids == b.token_ids and [s.accepted for s in a.steps] == [s.accepted for s in b.steps]


def test_the_session_profile_names_the_heads_measured_kernels(head, tmp_path):
    from ears_core.policy.costs import PriceCurve
    from ears_core.draft.head_kernels import HeadChoice
    from ears_core.pair import ModelPair
    from ears_core.serve.session import Session

    target = tiny_llama(0)
    drafter = EagleDrafter(head, target)
    curve = PriceCurve([10.0, 10.5, 11.0], 0.5, 0.2, measured_at="test")
    pair = ModelPair(target, drafter, None, CPU, torch.float32, "tiny", 96, "head")
    assert "draft head" not in Session(pair, prices=curve, cache_dir=tmp_path).profile_text()  # nothing measured
    drafter.kernel_choice = HeadChoice("bfloat16", True, {"float32": 2.0, "bfloat16 packed": 1.5})
    text = Session(pair, prices=curve, cache_dir=tmp_path).profile_text()
    assert text.startswith("verify price in steps") and text.endswith("; draft head in bfloat16 packed")
