"""The device round (decode/device_round.py): today's decisions, draw for draw, with one host read a round."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import PROMPTS, perturbed_copy, tiny_llama
from ears_core import GreedyRule, generate
from ears_core.decode.chain import plain_step
from ears_core.decode.device_round import device_verify
from ears_core.decode.verify import check_read, verify
from ears_core.decode.waits import counting
from ears_core.draft.drafters import NGramDrafter
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target
from ears_core.policy.costs import Calibration, DraftPolicy, PriceCurve
from ears_core.rules import RULES, AcceptanceRule, make_rule
from ears_core.sampling import SamplingConfig, counter_uniforms, logits_to_probs, Stream

RULE_PARAMS = dict(beta=0.4, epsilon=0.05, gate=0.2, window=1)  # loose enough that rules pardon on tiny models


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def same_run(a, b):
    """Two generations made the same decisions: tokens, every event field, every round's record."""
    assert a.token_ids == b.token_ids
    assert [e.to_dict() for e in a.events] == [e.to_dict() for e in b.events]
    assert [(s.drafted, s.accepted, s.pardoned, s.emitted) for s in a.steps] == \
        [(s.drafted, s.accepted, s.pardoned, s.emitted) for s in b.steps]
    assert [[vars(d) for d in s.drafts] for s in a.steps] == [[vars(d) for d in s.drafts] for s in b.steps]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0)
    return target, perturbed_copy(target, 0.03, seed=1)


@pytest.mark.parametrize("temperature", [0.9, 0])
@pytest.mark.parametrize("name", list(RULES))
def test_the_device_round_decides_as_todays_chain_round_for_every_rule(pair, name, temperature):
    target, draft = pair
    kinds: Counter = Counter()
    for seed, prompt in enumerate(PROMPTS[:3]):  # each prompt its own seed (at T = 0 the seed changes no decision)
        kw = dict(k=4, temperature=temperature, max_new_tokens=30, seed=seed)
        today = generate(target, draft, prompt, rule=make_rule(name, **RULE_PARAMS), **kw)
        device = generate(target, draft, prompt, rule=make_rule(name, **RULE_PARAMS), device_round=True, **kw)
        same_run(today, device)
        kinds.update(e.kind for e in device.events)
    assert kinds["accepted"] > 0 and kinds["resampled"] > 0  # both outcomes were met
    assert kinds["bonus"] > 0 or (name == "greedy" and temperature)  # sampled drafts seldom all hit the argmax
    if temperature and name not in ("standard", "greedy"):
        assert kinds["pardoned"] > 0, kinds  # the rule's own decisions were exercised


def test_with_top_k_zeros_and_a_budget_the_device_round_is_todays(pair):
    target, draft = pair
    for rule in ("ears", "ears-budget", "typical"):
        kw = dict(k=5, temperature=1.0, top_k=6, max_new_tokens=40, seed=3)
        same_run(generate(target, draft, PROMPTS[2], rule=make_rule(rule, **RULE_PARAMS), **kw),
                 generate(target, draft, PROMPTS[2], rule=make_rule(rule, **RULE_PARAMS), device_round=True, **kw))


EMPTY_AT = 2  # where scripted_case's row B // 2 rejects with an empty residual


def scripted_case(seed: int, b: int = 6, k: int = 5, v: int = 24):
    """Hand-made rows: peaked target / draft pairs with top-k zeros, a drafted token the target gives probability
    0, and the counter-based draws. Row B // 2 has q == p, and at position EMPTY_AT (K > EMPTY_AT) a drafted id
    both give probability 0 (only unchecked: the guard refuses q = 0): a ratio rule rejects it there, and its
    residual max(0, p - q) is empty, so the next token is drawn from P_target (the fallback)."""
    gen = torch.Generator().manual_seed(seed)
    t_logits = 3 * torch.randn(b, k + 1, v, generator=gen)  # (B, K+1, V)
    d_logits = t_logits[:, :k] + torch.randn(b, k, v, generator=gen)  # (B, K, V)
    target = logits_to_probs(t_logits, SamplingConfig(1.0, top_k=8))
    draft = logits_to_probs(d_logits, SamplingConfig(1.0))
    draft[b // 2] = target[b // 2, :k]  # this row's q == p: every residual is empty
    tokens = torch.multinomial(draft.reshape(-1, v), 1, generator=gen).reshape(b, k)  # (B, K)
    if k > EMPTY_AT:
        tokens[b // 2, EMPTY_AT] = int((target[b // 2, EMPTY_AT] == 0).nonzero()[0])  # p = q = 0: rejected
    pos = torch.arange(b * (k + 1)).reshape(b, k + 1)
    u = counter_uniforms(seed, pos[:, :k], Stream.ACCEPT)  # (B, K)
    u_next = counter_uniforms(seed, pos, Stream.TARGET)  # (B, K+1)
    return target, draft, tokens, u, u_next


@pytest.mark.parametrize("name", list(RULES))
def test_device_verify_is_verify_row_by_row(name):
    """For the same draws, device_verify's Verdict is verify()'s on its CPU path (emitted_only: the tokens the
    decode loop emits) field by field, and its decisions are those of verify()'s all-rows path."""
    outcomes: Counter = Counter()
    fallbacks = 0
    for seed in range(8):
        target, draft, tokens, u, u_next = scripted_case(seed)
        rule = make_rule(name, **RULE_PARAMS)
        got = device_verify(target, draft, tokens, rule, u, u_next, with_distortion=True)
        cpu = verify(target, draft, tokens, make_rule(name, **RULE_PARAMS), uniforms=u, sample_uniforms=u_next,
                     with_distortion=True, check=False, emitted_only=True)
        rows = verify(target, draft, tokens, make_rule(name, **RULE_PARAMS), uniforms=u, sample_uniforms=u_next,
                      check=False)
        for field in ("num_accepted", "next_token", "kinds", "p", "q", "ratio", "u", "tolerance", "max_p",
                      "next_p", "next_q", "distortion"):
            assert torch.equal(getattr(got, field), getattr(cpu, field)), field
        assert torch.equal(got.kinds, rows.kinds) and torch.equal(got.num_accepted, rows.num_accepted)
        assert torch.equal(got.next_token, rows.next_token)
        outcomes.update((got.num_accepted < tokens.shape[1]).tolist())
        r = tokens.shape[0] // 2  # the row with an empty residual at EMPTY_AT
        if ordinary_residual(rule):
            assert int(got.num_accepted[r]) == EMPTY_AT  # q == p stands before it
            fallback = target[r, EMPTY_AT]  # P_target there: the fallback law
            assert int(got.next_token[r]) == inverse_cdf(fallback, float(u_next[r, EMPTY_AT]))
            fallbacks += 1
    assert outcomes[True] > 0 and outcomes[False] > 0  # rows that resample, rows that end on a bonus token
    assert fallbacks == (8 if ordinary_residual(make_rule(name)) else 0)


def ordinary_residual(rule) -> bool:
    """Whether ``rule`` draws from the ordinary residual max(0, p - q) after a rejection (not greedy's argmax, not
    typical acceptance's P_target) and rejects a token of probability 0."""
    return type(rule).residual is AcceptanceRule.residual and not rule.argmax_only


def inverse_cdf(probs, u: float) -> int:
    """The token an inverse-CDF draw picks from (V,) unnormalised probabilities with the draw u: the first whose
    cumulative mass (float32) is above u times the total, written out."""
    cdf = probs.float().cumsum(0)
    total = cdf[-1]
    above = [i for i in range(len(cdf)) if float(cdf[i]) > float(torch.tensor(u, dtype=torch.float32) * total)]
    return above[0] if above else int(probs.nonzero()[-1])


def test_a_round_with_no_drafts_is_todays_plain_step():
    for seed in range(4):
        target, draft, tokens, u, u_next = scripted_case(seed, b=1, k=0)
        for name in ("standard", "greedy", "typical"):
            got = device_verify(target, draft, tokens, make_rule(name), u, u_next)
            token, host = plain_step(make_rule(name), target, u_next[0])
            assert torch.equal(got.next_token, token)
            assert got.next_p.tolist() == [host.next_p] and got.max_p[0].tolist() == host.max_p


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_on_the_device_round_is_the_targets_own_greedy_decoding(pair, k):
    target, draft = pair
    for prompt in PROMPTS:
        out = generate(target, draft, prompt, rule=GreedyRule(), k=k, temperature=0, max_new_tokens=40,
                       device_round=True)
        assert out.token_ids == hf_greedy(target, prompt, 40)
        assert 0 < out.stats.accepted < out.stats.drafted


@pytest.fixture(scope="module")
def head_pair():
    target = tiny_llama(0, vocab=96)
    torch.manual_seed(5)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).eval()
    return target, head


def test_an_eagle_head_and_an_ngram_drafter_decide_as_today(head_pair):
    target, head = head_pair
    for rule, temperature in (("ears", 0.9), ("greedy", 0)):
        kw = dict(k=4, temperature=temperature, max_new_tokens=30, seed=2)
        same_run(generate(target, EagleDrafter(head, target), PROMPTS[2], rule=make_rule(rule, beta=0.3), **kw),
                 generate(target, EagleDrafter(head, target), PROMPTS[2], rule=make_rule(rule, beta=0.3),
                          device_round=True, **kw))
        prompt = [5, 6, 7, 5, 6, 7, 5, 6]  # repeats, so the n-gram lookup finds drafts
        same_run(generate(target, NGramDrafter(96), prompt, rule=make_rule(rule, beta=0.3), **kw),
                 generate(target, NGramDrafter(96), prompt, rule=make_rule(rule, beta=0.3), device_round=True, **kw))


def reads_per_round(fn):
    """(host reads inside the rounds, rounds) of a generation (decode/waits.py: read), less the request's own checks
    (2 reads of the prompt's ids in ``check_request``, outside the rounds)."""
    with counting("cpu") as waits:
        out = fn()
    return waits.read - 2, len(out.steps)


@pytest.mark.parametrize("temperature", [0.9, 0])
def test_the_device_round_reads_the_host_once_a_round(pair, temperature):
    target, draft = pair
    kw = dict(rule=make_rule("ears", beta=0.2), k=4, temperature=temperature, max_new_tokens=40, seed=1)
    device, rounds = reads_per_round(lambda: generate(target, draft, PROMPTS[0], device_round=True, **kw))
    assert device == rounds  # exactly the packed read, every round (the input guard reads what it holds)
    today, rounds_today = reads_per_round(lambda: generate(target, draft, PROMPTS[0], **kw))
    assert today >= 2 * rounds_today  # the input guard and the verdict at least (and n off the argmax path)


def test_the_device_rounds_input_guard_reads_nothing_of_its_own_and_refuses_a_broken_drafter(pair):
    """The guard (a drafter's token outside the vocabulary, or one it gave probability 0) checks the ids and q the
    packed read holds: one read a round whatever the device, and a broken drafter is a ValueError as today."""
    target, draft = pair
    kw = dict(rule=make_rule("ears", beta=0.2), k=4, temperature=0.9, max_new_tokens=40, seed=1)
    reads, rounds = reads_per_round(lambda: generate(target, draft, PROMPTS[0], device_round=True, **kw))
    assert reads == rounds
    for device_round in (True, False):
        with pytest.raises(ValueError, match="draft probability 0"):
            generate(target, BrokenDrafter(NGramDrafter(96)), [5, 6, 7, 5, 6, 7, 5, 6], device_round=device_round, **kw)
    with pytest.raises(ValueError, match="draft token id 96 at row 0, position 1 is outside the vocabulary"):
        check_read([3, 96], [0.5, 0.5], 96)
    with pytest.raises(ValueError, match="draft token 4 at row 0, position 2 has draft probability 0"):
        check_read([3, 5, 4], [0.5, 0.1, 0.0], 96)
    check_read([3, 5, 4], None, 96)  # a greedy tree: ids only
    with pytest.raises(ValueError, match="outside the vocabulary"):
        check_read([-1], None, 96)


class BrokenDrafter:
    """An n-gram drafter that reports the wrong distribution: each drafted token has probability 0 in it."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, k, probs_fn, uniforms, **kw):
        tokens, probs = self.inner.propose(k, probs_fn, uniforms, **kw)  # (1, k'), (1, k', V) one-hot
        return tokens, torch.roll(probs, 1, dims=-1)  # the drafted token now has q = 0


def policy_kw(curve: PriceCurve) -> dict:
    return dict(rule=GreedyRule(), k=4, temperature=0, max_new_tokens=30, policy=DraftPolicy(curve, 4),
                calibration=Calibration())


def test_with_a_size_policy_the_device_round_still_reads_once_and_stays_exact(pair, head_pair):
    curve = PriceCurve([10.0 + 1.0 * (m - 1) for m in range(1, 6)], 0.5, 0.0)  # drafting pays where drafts stand
    target, draft = pair
    device, rounds = reads_per_round(lambda: generate(target, draft, PROMPTS[2], device_round=True,
                                                      **policy_kw(curve)))
    today, rounds_today = reads_per_round(lambda: generate(target, draft, PROMPTS[2], **policy_kw(curve)))
    assert device == rounds and today > 2 * rounds_today  # today: a read per draft for the policy
    target, head = head_pair
    out = generate(target, EagleDrafter(head, target), PROMPTS[2], device_round=True, **policy_kw(curve))
    assert out.token_ids == hf_greedy(target, PROMPTS[2], 30)
    drafter = EagleDrafter(head, target)  # built outside the count: its construction reads its vocabulary once
    device, rounds = reads_per_round(lambda: generate(target, drafter, PROMPTS[2], device_round=True,
                                                      **policy_kw(curve)))
    assert device == rounds


def test_the_policy_plans_each_rounds_k_from_earlier_rounds_only(pair):
    """Each round drafts the k that keep_going picks from the calibration's means before the round (a probe
    planned at 0 drafts one), and the calibration learns from the confidences read with the verdict."""
    target, draft = pair
    cheap = PriceCurve([10.0] * 5, 0.0, 0.0)  # every draft pays: every round drafts K
    out = generate(target, draft, PROMPTS[2], device_round=True, **policy_kw(cheap))
    assert out.token_ids == hf_greedy(target, PROMPTS[2], 30)
    assert all(s.drafted == min(4, 30 - 1 - sum(t.emitted for t in out.steps[:i])) for i, s in enumerate(out.steps))
    assert all(len(s.estimates) == s.drafted for s in out.steps)  # an estimate per draft, from its confidence
    dear = PriceCurve([10.0 * m for m in range(1, 6)], 1.0, 0.0)  # verifying never pays
    kw = policy_kw(dear)
    out = generate(target, draft, PROMPTS[2], device_round=True, **kw)
    assert out.token_ids == hf_greedy(target, PROMPTS[2], 30)
    probes = [i for i, s in enumerate(out.steps) if s.drafted]
    assert probes == [0, 2, 6, 14, 22, 30][: len(probes)] and len(probes) >= 4  # backing off 2, 4, then 8 rounds
    assert {s.drafted for s in out.steps} == {0, 1}
    assert sum(kw["calibration"].seen) > 0  # the probes' drafts taught the calibration


def test_with_an_ngram_drafter_the_device_rounds_calibration_learns_as_todays(head_pair):
    """The n-gram lookup knows each draft's confidence on the host (n / max_ngram, no model step): the device
    round's calibration learns from it as today's round does, bin for bin, and each round reports its estimates."""
    target, _ = head_pair
    prompt = PROMPTS[1]  # greedy text that repeats itself: drafts found, some stand
    cheap = PriceCurve([10.0] * 5, 0.0, 0.0)  # every draft pays: both rounds draft what the lookup finds
    runs = {}
    for device_round in (False, True):
        cal = Calibration()
        out = generate(target, NGramDrafter(96), prompt, rule=GreedyRule(), k=4, temperature=0, max_new_tokens=30,
                       policy=DraftPolicy(cheap, 4), calibration=cal, device_round=device_round)
        runs[device_round] = out, cal
    (today, cal_today), (device, cal_device) = runs[False], runs[True]
    assert device.token_ids == today.token_ids
    assert sum(cal_device.seen) > 0 and sum(cal_device.stood) > 0  # it learned (it saw nothing before)
    assert (cal_device.seen, cal_device.stood) == (cal_today.seen, cal_today.stood)
    drafted = [s for s in device.steps if s.drafted]
    assert drafted and all(len(s.estimates) == s.drafted for s in drafted)


def test_a_round_with_no_drafts_adds_no_budget_beta(pair):
    """ears-budget records a beta for each round that drafted: on the device round as on today's, a round with no
    drafts (the last, capped by max_new_tokens) records none, and a k = 0 verify none."""
    target, draft = pair
    for device_round in (False, True):
        rule = make_rule("ears-budget", epsilon=0.05)
        out = generate(target, draft, PROMPTS[0], rule=rule, k=4, temperature=0.9, max_new_tokens=21, seed=2,
                       device_round=device_round)
        assert out.steps[-1].drafted == 0  # the capped last round
        assert len(rule.betas) == sum(1 for s in out.steps if s.drafted)
    target_probs, draft_probs, tokens, u, u_next = scripted_case(0, b=1, k=0)
    rule = make_rule("ears-budget", epsilon=0.05)
    device_verify(target_probs, draft_probs, tokens, rule, u, u_next)
    verify(target_probs, draft_probs, tokens, rule, uniforms=u, sample_uniforms=u_next)
    assert rule.betas == []


@pytest.mark.parametrize("n", [1, 2, 6, 13])
def test_max_new_tokens_is_exact_on_the_device_round(pair, n):
    target, draft = pair
    out = generate(target, draft, PROMPTS[0], rule=make_rule("ears", beta=0.2), k=5, temperature=0.9,
                   max_new_tokens=n, seed=n, device_round=True)
    assert len(out.token_ids) == n
