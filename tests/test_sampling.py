"""sampling.py: logits -> probabilities, counter-based draws, inverse-CDF sampling."""

import math

import pytest
import torch
from scipy import stats

from ears_core.sampling import SamplingConfig, Stream, counter_uniforms, logits_to_probs, sample_with_uniforms


def test_greedy_is_one_hot_on_the_first_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.0, -1.0, 5.0, 4.9]])
    probs = logits_to_probs(logits, SamplingConfig(temperature=0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]


def test_temperature_matches_softmax_of_scaled_logits():
    logits = torch.tensor([0.0, math.log(2.0), math.log(4.0)])
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0))
    assert torch.allclose(probs, torch.tensor([1 / 7, 2 / 7, 4 / 7]))
    hot = logits_to_probs(logits, SamplingConfig(temperature=2.0))  # weights 1, sqrt2, 2
    w = torch.tensor([1.0, math.sqrt(2.0), 2.0])
    assert torch.allclose(hot, w / w.sum())


def test_top_k_keeps_k_tokens_and_renormalises():
    logits = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(probs, torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))
    assert (probs == 0).sum() == 2


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: the two most likely tokens stay.
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # p = 1 keeps everything.
    full = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=1.0))
    assert torch.allclose(full, torch.tensor([0.5, 0.3, 0.15, 0.05]))


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_sampling_settings_raise(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


def test_counter_uniforms_are_a_pure_function_of_seed_position_stream():
    pos = torch.arange(0, 1000)
    a = counter_uniforms(7, pos, Stream.ACCEPT)
    assert torch.equal(a, counter_uniforms(7, pos, Stream.ACCEPT))
    # The draw for position n does not depend on which other positions are asked for.
    assert torch.equal(a[500:510], counter_uniforms(7, pos[500:510], Stream.ACCEPT))
    assert not torch.equal(a, counter_uniforms(8, pos, Stream.ACCEPT))
    assert not torch.equal(a, counter_uniforms(7, pos, Stream.TARGET))
    assert a.dtype == torch.float32 and a.min() >= 0 and a.max() < 1


def test_counter_uniforms_look_uniform_and_independent():
    pos = torch.arange(0, 50_000)
    a = counter_uniforms(123, pos, Stream.DRAFT).double().numpy()
    b = counter_uniforms(123, pos, Stream.TARGET).double().numpy()
    assert stats.kstest(a, "uniform").pvalue > 1e-3
    assert abs(stats.pearsonr(a, b).statistic) < 0.02  # streams uncorrelated
    assert abs(stats.pearsonr(a[:-1], a[1:]).statistic) < 0.02  # neighbours uncorrelated
    seeds = counter_uniforms(torch.arange(50_000).unsqueeze(1), torch.zeros(1, dtype=torch.long), Stream.ACCEPT)
    assert stats.kstest(seeds.squeeze(1).double().numpy(), "uniform").pvalue > 1e-3  # across seeds


def test_inverse_cdf_sampling_picks_the_right_bucket_and_never_a_zero():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    u = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999999])
    got = sample_with_uniforms(probs.expand(6, 6), u)
    assert got.tolist() == [1, 1, 3, 3, 4, 4]
    # An unnormalised row is scaled by its total; u * total rounding up to the total still
    # lands on the last token with mass, not on a trailing zero.
    assert sample_with_uniforms(torch.tensor([2.0, 0.0, 2.0, 0.0]), torch.tensor(1 - 2**-24)).item() == 2


def test_sampling_frequencies_follow_the_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    u = counter_uniforms(0, torch.arange(40_000), Stream.TARGET)
    counts = torch.bincount(sample_with_uniforms(probs.expand(40_000, 4), u), minlength=4).numpy()
    assert stats.chisquare(counts, (probs * 40_000).numpy()).pvalue > 1e-3


def test_host_uniforms_are_counter_uniforms_bit_for_bit():
    import random

    from ears_core.sampling import host_uniforms

    rng = random.Random(0)
    for _ in range(200):
        seed = rng.choice([0, 1, -5, (1 << 40) + 3, rng.randrange(-(1 << 63), 1 << 63)])
        positions = [rng.randrange(0, 1 << 62) if rng.random() < 0.5 else rng.randrange(0, 1000) for _ in range(5)]
        for stream in Stream:
            assert host_uniforms(seed, positions, stream) == counter_uniforms(seed, torch.tensor(positions), stream).tolist()


def test_first_argmax_is_argmax_ties_included():
    from ears_core.sampling import first_argmax

    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        v = int(torch.randint(2, 60000, (1,), generator=g))
        x = torch.randint(0, 4, (3, v), generator=g).float()  # many ties per row
        assert torch.equal(first_argmax(x), x.argmax(dim=-1))
        assert torch.equal(first_argmax(x, keepdim=True), x.argmax(dim=-1, keepdim=True))
    hot = torch.zeros(2, 7)
    hot[0, 3] = 1.0
    assert first_argmax(hot).tolist() == [3, 0]  # a row of equal values: the first index
