"""The embedded target end to end: speculative greedy output equals its own greedy output."""

import pytest
import torch

from conftest import WORKER_THREADS

from ears_core import EARSRule, GreedyRule, autoregressive, generate
from ears_core.draft.drafters import NGramDrafter
from ears_core.model.loading.hub import encode_prompt
from ears_core.pair import load_pair


@pytest.fixture(scope="module")
def embedded():
    torch.set_num_threads(WORKER_THREADS)
    yield load_pair("embedded", device="cpu")
    torch.set_num_threads(1)


@pytest.mark.slow
def test_speculative_greedy_equals_the_targets_greedy_output(embedded):
    pair = embedded
    ids = encode_prompt(pair.tokenizer, "Repeat this list twice: apples, pears, plums, figs.")
    ref = pair.target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                               pad_token_id=pair.tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
    out = generate(pair.target, NGramDrafter(pair.vocab_size), ids, rule=GreedyRule(), k=4, temperature=0,
                   max_new_tokens=40, tokenizer=pair.tokenizer, vocab_size=pair.vocab_size)
    assert out.token_ids == ref
    assert out.stats.accepted > 0  # the list repeats: prompt lookup gets drafts accepted
    assert out.text == pair.tokenizer.decode(ref, skip_special_tokens=True)
    base = autoregressive(pair.target, ids, temperature=0, max_new_tokens=40, vocab_size=pair.vocab_size)
    assert base.token_ids == ref


@pytest.mark.slow
def test_ears_on_the_embedded_target_reports_pardons_and_distortion(embedded):
    pair = embedded
    ids = encode_prompt(pair.tokenizer, "Write a short poem about the sea, then repeat it.")
    out = generate(pair.target, NGramDrafter(pair.vocab_size), ids, rule=EARSRule(0.5), k=4, temperature=1.0,
                   max_new_tokens=48, seed=1, tokenizer=pair.tokenizer, vocab_size=pair.vocab_size)
    s = out.stats
    assert s.new_tokens == len(out.token_ids) > 0 and s.drafted > 0
    # A one-hot (n-gram) draft: r = p, so every accepted or pardoned event has ratio == p.
    for e in out.events:
        if e.kind in ("accepted", "pardoned"):
            assert e.ratio == pytest.approx(e.p, rel=1e-5) and e.q == 1.0


SHIPPED_HEAD_SETTINGS = [("0", ""), ("1", "bfloat16"), ("1", "int4")]  # EARS_LEAN, EARS_DRAFT_DTYPE


@pytest.mark.slow
@pytest.mark.parametrize("lean,draft_dtype", SHIPPED_HEAD_SETTINGS, ids=["float", "lean-bfloat16", "lean-int4"])
def test_the_shipped_draft_head_keeps_greedy_output(monkeypatch, worker_threads, lean, draft_dtype):
    """The shipped head loads on each target path and in each variant (the int4 one included), and its greedy
    speculative output is the target's own greedy output."""
    from ears_core.draft.eagle import EagleDrafter
    from ears_core.model.loading import lean_target

    if lean == "1" and not lean_target.supported():
        pytest.skip("this CPU has no native bfloat16 or int4 kernel: the lean target does not run here")
    monkeypatch.setenv("EARS_LEAN", lean)
    monkeypatch.setenv("EARS_DRAFT_DTYPE", draft_dtype)
    pair = load_pair("embedded", "embedded", device="cpu")
    assert isinstance(pair.draft, EagleDrafter)
    assert (pair.target.__class__.__name__ == "LeanLlama") == (lean == "1")
    int4 = any(type(m).__name__ == "Int4Linear" for m in pair.draft.head.modules())
    assert int4 == (draft_dtype == "int4")
    ids = encode_prompt(pair.tokenizer, "Why is the sky blue?")
    ref = autoregressive(pair.target, ids, temperature=0, max_new_tokens=32, vocab_size=pair.vocab_size)
    out = generate(pair.target, pair.draft.fresh(), ids, rule=GreedyRule(), k=3, temperature=0,
                   max_new_tokens=32, vocab_size=pair.vocab_size)
    assert out.token_ids == ref.token_ids
    assert out.stats.accepted > 0  # the trained head gets some drafts through
    assert all(d.token_id in set(pair.draft.vocab_ids.tolist()) for s in out.steps for d in s.drafts)


def test_the_embedded_tokenizer_loaded_as_its_own_class_is_the_one_autotokenizer_gives():
    """pair.py loads the embedded target's tokenizer as transformers' TokenizersBackend, not through AutoTokenizer
    (which reads the model's config first): the same class, vocabulary, specials, chat prompt and encodings."""
    from transformers import AutoTokenizer

    from ears_core.model.loading.embedded import prepare_embedded
    from ears_core.model.loading.hub import load_tokenizer

    folder = str(prepare_embedded())
    mine, auto = load_tokenizer("embedded", folder, True, "target", False, backend=True), AutoTokenizer.from_pretrained(folder)
    assert type(mine) is type(auto) and mine.get_vocab() == auto.get_vocab() and len(mine) == len(auto) == 49152
    assert (mine.eos_token_id, mine.pad_token_id, mine.all_special_ids) == (auto.eos_token_id, auto.pad_token_id,
                                                                            auto.all_special_ids)
    for prompt in ("Why is the sky blue?", "Write <|im_end|> a haiku\n\nabout  the sea."):
        assert torch.equal(encode_prompt(mine, prompt), encode_prompt(auto, prompt))
        assert mine(prompt).input_ids == auto(prompt).input_ids
