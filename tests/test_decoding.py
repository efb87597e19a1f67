"""The decode loop end to end on tiny random Llama pairs."""

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import PROMPTS, perturbed_copy, tiny_llama
from ears_core import (
    EARSRule, GreedyRule, StandardRule, autoregressive, generate, stream,
)
from ears_core.sampling import SamplingConfig, logits_to_probs


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: f"len{len(p)}")
def test_greedy_equals_the_targets_own_greedy_decoding(tiny_pair, prompt, k):
    target, draft = tiny_pair
    ref = hf_greedy(target, prompt, 40)
    out = generate(target, draft, prompt, rule=GreedyRule(), k=k, temperature=0, max_new_tokens=40)
    assert out.token_ids == ref
    assert 0 < out.stats.accepted < out.stats.drafted  # drafts were both kept and thrown away


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(0.3)], ids=repr)
def test_any_rule_at_temperature_zero_is_greedy(tiny_pair, rule):
    target, draft = tiny_pair
    out = generate(target, draft, PROMPTS[0], rule=rule, k=4, temperature=0, max_new_tokens=30)
    assert out.token_ids == hf_greedy(target, PROMPTS[0], 30)
    assert out.stats.pardoned == 0  # max P = 1 at T = 0, so the tolerance is 0


def test_autoregressive_greedy_equals_hf(tiny_pair):
    target, _ = tiny_pair
    for prompt in PROMPTS:
        out = autoregressive(target, prompt, temperature=0, max_new_tokens=25)
        assert out.token_ids == hf_greedy(target, prompt, 25)
        assert {e.kind for e in out.events} == {"target"}


def test_a_draft_identical_to_the_target_is_always_accepted(tiny_pair):
    # Both KV caches must roll back and extend correctly, or P_draft drifts from P_target.
    target, _ = tiny_pair
    out = generate(target, target, PROMPTS[2], rule=StandardRule(), k=4, temperature=0.9, max_new_tokens=41, seed=3)
    assert out.stats.acceptance_rate == 1.0
    assert [s.accepted for s in out.steps] == [4] * 8 + [0]  # the last round has k = 0
    assert [e.kind for e in out.events].count("bonus") == 8
    assert out.events[-1].kind == "target"  # nothing drafted in the last round
    assert out.stats.mean_distortion < 1e-5


def test_same_seed_same_tokens_other_seed_other_tokens(tiny_pair):
    target, draft = tiny_pair
    kw = dict(rule=EARSRule(0.1), k=4, temperature=0.9, max_new_tokens=40)
    a = generate(target, draft, PROMPTS[0], seed=5, **kw)
    b = generate(target, draft, PROMPTS[0], seed=5, **kw)
    c = generate(target, draft, PROMPTS[0], seed=6, **kw)
    assert a.token_ids == b.token_ids
    assert [e.kind for e in a.events] == [e.kind for e in b.events]
    assert a.token_ids != c.token_ids


def test_the_old_keyword_gamma_warns_and_gives_the_same_result_as_k(tiny_pair):
    from ears_core import RunConfig

    target, draft = tiny_pair
    kw = dict(rule=EARSRule(0.3), temperature=0.9, max_new_tokens=30, seed=2)
    new = generate(target, draft, PROMPTS[0], k=3, **kw)
    with pytest.warns(DeprecationWarning, match=r"gamma= is deprecated, use k=") as caught:
        old = generate(target, draft, PROMPTS[0], gamma=3, **kw)
    assert caught[0].filename == __file__  # the warning points at the caller's line, not into ears_core
    assert old.token_ids == new.token_ids and [e.kind for e in old.events] == [e.kind for e in new.events]
    assert old.stats.drafted == new.stats.drafted and max(s.drafted for s in old.steps) == 3
    with pytest.warns(DeprecationWarning):
        assert [e.token_id for e in stream(target, draft, PROMPTS[0], gamma=3, **kw)] == new.token_ids
    with pytest.warns(DeprecationWarning, match="RunConfig"):
        assert RunConfig(gamma=6).k == 6
    with pytest.raises(TypeError, match="pass k= only"):
        generate(target, draft, PROMPTS[0], k=2, gamma=3, **kw)


def test_beta_zero_equals_the_ordinary_rule_token_for_token(tiny_pair):
    target, draft = tiny_pair
    for seed in range(3):
        kw = dict(k=3, temperature=0.9, max_new_tokens=50, seed=seed)
        a = generate(target, draft, PROMPTS[1], rule=EARSRule(0.0), **kw)
        b = generate(target, draft, PROMPTS[1], rule=StandardRule(), **kw)
        assert a.token_ids == b.token_ids
        assert [e.kind for e in a.events] == [e.kind for e in b.events]


def test_the_first_divergence_between_ears_and_ordinary_is_a_pardon(tiny_pair):
    target, draft = tiny_pair
    diverged = 0
    for seed in range(6):
        kw = dict(k=4, temperature=1.0, max_new_tokens=40, seed=seed)
        e = generate(target, draft, PROMPTS[0], rule=EARSRule(0.5), **kw).events
        s = generate(target, draft, PROMPTS[0], rule=StandardRule(), **kw).events
        first = next((i for i, (x, y) in enumerate(zip(e, s)) if x.kind != y.kind), None)
        if first is None:
            assert [x.token_id for x in e] == [y.token_id for y in s]
            continue
        diverged += 1
        assert [x.token_id for x in e[:first]] == [y.token_id for y in s[:first]]
        assert e[first].kind == "pardoned" and s[first].kind == "resampled"
        assert e[first].u == s[first].u and e[first].ratio == s[first].ratio
        assert e[first].u - e[first].tolerance <= e[first].ratio < e[first].u
    assert diverged >= 3


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 13])
def test_max_new_tokens_is_exact(tiny_pair, n):
    target, draft = tiny_pair
    out = generate(target, draft, PROMPTS[0], rule=EARSRule(0.2), k=5, temperature=0.9, max_new_tokens=n, seed=n)
    assert len(out.token_ids) == n
    assert [e.position for e in out.events] == list(range(n))
    assert all(s.drafted <= 5 for s in out.steps)


def test_an_eos_inside_an_accepted_block_stops_generation_there():
    base = tiny_llama(0)
    greedy = hf_greedy(base, PROMPTS[0], 30)
    eos = greedy[7]  # stop at the 8th greedy token (its first occurrence)
    first = greedy.index(eos)
    target = tiny_llama(0, eos=eos)
    draft = perturbed_copy(target, 0.01, seed=1)  # accepts long blocks
    ref = hf_greedy(target, PROMPTS[0], 30)
    assert ref == greedy[: first + 1]
    for k in (2, 5):
        out = generate(target, draft, PROMPTS[0], rule=GreedyRule(), k=k, temperature=0, max_new_tokens=30)
        assert out.token_ids == ref
        assert out.events[-1].token_id == eos and out.stop == "eos"
    ar = autoregressive(target, PROMPTS[0], temperature=0, max_new_tokens=30)
    assert ar.token_ids == ref and ar.stop == "eos"
    # one token short of the EOS: the length ended it
    assert generate(target, draft, PROMPTS[0], rule=GreedyRule(), k=5, temperature=0, max_new_tokens=first).stop == "length"
    assert autoregressive(target, PROMPTS[0], temperature=0, max_new_tokens=first).stop == "length"


def test_stream_yields_events_as_they_are_decided(tiny_pair):
    target, draft = tiny_pair
    gen = stream(target, draft, PROMPTS[0], rule=EARSRule(0.1), k=4, temperature=0.9, max_new_tokens=20, seed=1)
    first = next(gen)
    assert first.position == 0 and len(gen.steps) == 1  # one round decided, not the whole answer
    rest = list(gen)
    res = gen.result()
    assert [first] + rest == res.events
    assert len(res.token_ids) == 20
    # Each round emits its stood drafts plus one token.
    assert sum(s.emitted for s in res.steps) == 20
    assert all(s.emitted == s.accepted + 1 for s in res.steps)
    for s in res.steps:
        assert s.drafts[-1].kind in ("rejected", "accepted", "pardoned")
        assert len(s.drafts) == min(s.accepted + 1, s.drafted)


def test_event_fields_are_consistent(tiny_pair):
    target, draft = tiny_pair
    out = generate(target, draft, PROMPTS[2], rule=EARSRule(0.3), k=4, temperature=0.9, max_new_tokens=60, seed=2)
    kinds = {e.kind for e in out.events}
    assert {"accepted", "resampled", "bonus"} <= kinds and "pardoned" in kinds
    for e in out.events:
        assert 0 < e.p <= e.max_p + 1e-6
        if e.kind == "accepted":
            assert e.ratio >= e.u
        elif e.kind == "pardoned":
            assert max(e.u - e.tolerance, 0) <= e.ratio < e.u and e.distortion > 0
        elif e.kind == "resampled":
            assert e.rejected_token is not None and e.ratio < max(e.u - e.tolerance, 0) + 1e-7
        elif e.kind == "bonus":
            assert e.q is None and e.distortion == 0.0
        if e.kind in ("accepted", "pardoned", "resampled"):
            assert e.tolerance == pytest.approx(0.3 * (1 - e.max_p), abs=1e-6)


def first_token_counts(fn, n_seeds):
    toks = [fn(seed) for seed in range(n_seeds)]
    return np.bincount(toks, minlength=16)


@pytest.mark.slow
def test_autoregressive_first_token_follows_the_target_distribution(small_vocab_pair):
    target, _ = small_vocab_pair
    prompt = [1, 2, 3]
    with torch.no_grad():
        p = logits_to_probs(target(torch.tensor([prompt])).logits[0, -1], SamplingConfig(0.9)).double().numpy()
    # 1,000 draws find a wrong token law (another vocabulary, the argmax); this nearly flat law does not tell
    # T = 1.0 from 0.9 with any affordable count (3,000 draws: power 2.5 %); tests/test_sampling.py checks the temperature
    c = first_token_counts(lambda s: autoregressive(target, prompt, temperature=0.9, max_new_tokens=1, seed=s).token_ids[0], 1000)
    assert stats.chisquare(c, p / p.sum() * c.sum()).pvalue > 1e-3


@pytest.mark.slow
def test_speculative_first_token_follows_the_target_distribution(small_vocab_pair):
    target, draft = small_vocab_pair
    prompt = [1, 2, 3]
    with torch.no_grad():
        p = logits_to_probs(target(torch.tensor([prompt])).logits[0, -1], SamplingConfig(0.9)).double().numpy()
        q = logits_to_probs(draft(torch.tensor([prompt])).logits[0, -1], SamplingConfig(0.9)).double().numpy()
    assert 0.5 * np.abs(p - q).sum() > 0.05  # the draft really differs
    c = first_token_counts(
        lambda s: next(stream(target, draft, prompt, rule=StandardRule(), k=2, temperature=0.9, max_new_tokens=3,
                              seed=s, with_distortion=False)).token_id,  # round 1 alone decides the first token
        1000,  # power 0.9999 at p 1e-3 against resampling from p instead of the residual; EARS 0.2 gives p 2e-8
    )
    assert stats.chisquare(c, p / p.sum() * c.sum()).pvalue > 1e-3


class RepeatDrafter:
    """A Drafter that is no model: it always proposes token 7, deterministically (q = 1)."""

    needs_target_hidden = False

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.commits = []

    def prefill(self, input_ids, target_hidden):
        self.prompt_len = input_ids.shape[1]

    def propose(self, k, probs_fn, uniforms):
        tokens = torch.full((1, k), 7, dtype=torch.long)
        probs = torch.zeros(1, k, self.vocab_size)
        probs[..., 7] = 1.0
        return tokens, probs

    def commit(self, num_accepted, next_token, target_hidden):
        self.commits.append((num_accepted, int(next_token[0])))


def test_any_drafter_plugs_into_the_loop(tiny_pair):
    target, _ = tiny_pair
    drafter = RepeatDrafter(96)
    out = generate(target, drafter, PROMPTS[0], rule=GreedyRule(), k=3, temperature=0, max_new_tokens=30)
    assert out.token_ids == hf_greedy(target, PROMPTS[0], 30)
    assert [n for n, _ in drafter.commits] == [s.accepted for s in out.steps]
    # At T > 0 with a one-hot draft the ordinary rule accepts token 7 with probability P_target(7).
    out = generate(target, RepeatDrafter(96), PROMPTS[0], rule=StandardRule(), k=3, temperature=0.9, max_new_tokens=30)
    for e in out.events:
        if e.kind == "accepted":
            assert e.token_id == 7 and e.q == 1.0 and e.ratio == pytest.approx(e.p)
        if e.kind == "resampled":
            assert e.rejected_token == 7 and e.token_id != 7  # the residual excludes the draft


def test_ngram_drafter_copies_repeats_and_keeps_greedy_output(tiny_pair):
    from ears_core.draft.drafters import NGramDrafter

    target, _ = tiny_pair
    d = NGramDrafter(96, max_ngram=2)
    d.prefill(torch.tensor([[5, 6, 7, 8, 5, 6]]))
    toks, probs = d.propose(3, None, torch.zeros(1, 3))
    assert toks.tolist() == [[7, 8, 5]] and probs[0, torch.arange(3), toks[0]].tolist() == [1.0, 1.0, 1.0]
    d.commit(1, torch.tensor([9]))  # kept 7, then 9: no 2-gram [7, 9] or 1-gram [9] seen before
    assert d.propose(3, None, torch.zeros(1, 3))[0].shape == (1, 0)
    # In the loop: greedy output unchanged; rounds with no match draft nothing.
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    out = generate(target, NGramDrafter(96), prompt, rule=GreedyRule(), k=4, temperature=0, max_new_tokens=30)
    assert out.token_ids == hf_greedy(target, prompt, 30)
    assert out.stats.drafted > 0
