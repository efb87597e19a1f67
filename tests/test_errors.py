"""Bad input gets a ValueError that names the problem and the fix; nothing is silently clamped."""

import pytest

from conftest import PROMPTS, tiny_llama
from ears_core import EARSRule, autoregressive, generate, stream
from ears_core.rules import make_rule


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(k=0), r"k \(K, drafts per round"),
        (dict(k=2.5), r"k \(K, drafts per round"),
        (dict(temperature=-0.5), "temperature"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(rule="ears"), "AcceptanceRule"),
    ],
)
def test_bad_settings(tiny_pair, kwargs, match):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match=match):
        generate(target, draft, PROMPTS[0], **kwargs)


def test_bad_settings_raise_before_any_work(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError):
        stream(target, draft, PROMPTS[0], k=-1)  # raised at the call, not at the first next()


def test_negative_beta():
    with pytest.raises(ValueError, match="beta must be a number >= 0"):
        EARSRule(-0.1)


def test_empty_prompt(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(target, draft, [])
    with pytest.raises(ValueError, match="prompt is empty"):
        autoregressive(target, [])


def test_batch_of_prompts_is_refused_with_the_reason(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="one prompt at a time"):
        generate(target, draft, [[1, 2], [3, 4]])


def test_prompt_beyond_the_context_length(tiny_pair):
    target, draft = tiny_pair  # max_position_embeddings = 256
    with pytest.raises(ValueError, match="context length \\(256\\)"):
        generate(target, draft, list(range(1, 90)) * 2, max_new_tokens=100)
    with pytest.raises(ValueError, match="context length"):
        autoregressive(target, [1] * 250, max_new_tokens=10)


def test_token_ids_outside_the_vocabulary(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(target, draft, [1, 500])


def test_vocabularies_that_differ(tiny_pair):
    target, _ = tiny_pair
    other = tiny_llama(9, vocab=80)
    with pytest.raises(ValueError, match="vocabularies differ \\(80 vs 96"):
        generate(target, other, PROMPTS[0])
    # A head padded beyond the tokenizer is fine when the shared size is given.
    out = generate(target, other, PROMPTS[0], vocab_size=80, temperature=0, max_new_tokens=5)
    assert len(out.token_ids) == 5 and max(out.token_ids) < 80


def test_missing_draft_points_to_autoregressive(tiny_pair):
    target, _ = tiny_pair
    with pytest.raises(ValueError, match="autoregressive"):
        generate(target, None, PROMPTS[0])


def test_unknown_rule_name():
    with pytest.raises(ValueError, match="unknown rule .fast.; choose one of: standard, ears, greedy, ears-entropy, typical"):
        make_rule("fast")
    assert make_rule("ordinary").name == "standard"
    assert make_rule("EARS", beta=0.2).beta == 0.2
