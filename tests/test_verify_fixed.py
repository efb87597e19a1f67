"""verify(): hand-made p, q and U with known answers, one case per kind and guard.

Values are dyadic (exact in binary) so that band edges are exact in float32.
"""

import pytest
import torch

from ears_core import DraftKind, EARSRule, GreedyRule, StandardRule, verify

A, P, R, N = (int(k) for k in (DraftKind.ACCEPTED, DraftKind.PARDONED, DraftKind.REJECTED, DraftKind.NOT_EVALUATED))

# One position over a 4-token vocabulary: the draft proposes token 0 with q = 0.5, p = 0.25, so
# r = 0.5; max P_target = 0.5, so EARSRule(beta=0.25) has tolerance 0.25 * (1 - 0.5) = 0.125.
T0 = [0.25, 0.5, 0.125, 0.125]
D0 = [0.5, 0.25, 0.25, 0.0]
BONUS = [0.0, 0.0, 0.0, 1.0]


def one(target_rows, draft_rows, tokens, rule, u, su=0.0):
    """verify() on a single row; target_rows has K+1 rows, draft_rows K."""
    return verify(
        torch.tensor([target_rows]), torch.tensor([draft_rows]), torch.tensor([tokens]), rule,
        uniforms=torch.tensor([u]), sample_uniforms=torch.tensor([su]), with_distortion=True,
    )


@pytest.mark.parametrize(
    "u, rule, kind",
    [
        (0.5, StandardRule(), A),  # r == U: accepted
        (0.5 + 2**-20, StandardRule(), R),  # just above r: the ordinary rule rejects
        (0.5 + 2**-20, EARSRule(0.25), P),  # ... and EARS pardons
        (0.625, EARSRule(0.25), P),  # U - tol == r exactly: the edge of the band is inside
        (0.625 + 2**-20, EARSRule(0.25), R),  # just past the band: rejected
        (0.625, EARSRule(0.0), R),  # beta = 0 is the ordinary rule
        (0.3, EARSRule(0.25), A),  # r >= U: accepted, not pardoned
    ],
)
def test_pardon_band_edges(u, rule, kind):
    v = one([T0, BONUS], [D0], [0], rule, [u])
    assert v.kinds.tolist() == [[kind]]
    assert v.num_accepted.tolist() == [0 if kind == R else 1]
    assert v.ratio.tolist() == [[0.5]]
    assert v.tolerance.tolist() == [[0.125 if isinstance(rule, EARSRule) and rule.beta else 0.0]]
    assert v.max_p.tolist() == [[0.5, 1.0]]


def test_rejection_resamples_from_the_normalised_residual():
    # residual = max(0, p - q) = [0, 0.25, 0, 0.125] -> norm [0, 2/3, 0, 1/3]
    low = one([T0, BONUS], [D0], [0], StandardRule(), [0.9], su=0.6)
    high = one([T0, BONUS], [D0], [0], StandardRule(), [0.9], su=0.7)
    assert low.next_token.tolist() == [1] and high.next_token.tolist() == [3]
    assert low.next_p.tolist() == [0.5] and low.next_q.tolist() == [0.25]
    assert not low.is_bonus.item()


def test_all_accepted_draws_the_bonus_from_the_last_position():
    v = one([T0, BONUS], [D0], [0], StandardRule(), [0.1], su=0.3)
    assert v.num_accepted.tolist() == [1] and v.is_bonus.tolist() == [True]
    assert v.next_token.tolist() == [3]  # BONUS is one-hot on token 3
    assert v.next_q.tolist() == [0.0]


@pytest.mark.parametrize("rule, u", [(StandardRule(), 0.0), (EARSRule(1.0), 0.3), (EARSRule(1.0), 0.0)])
def test_a_token_outside_the_target_support_is_never_accepted(rule, u):
    # p = 0 gives r = 0; with U = 0 (or U - tol clamped to 0) the comparison r >= 0 holds,
    # yet the token is outside the target's support (e.g. cut by top-k): it must be rejected.
    t = [0.0, 0.5, 0.25, 0.25]
    v = one([t, BONUS], [[0.5, 0.5, 0.0, 0.0]], [0], rule, [u], su=0.1)
    assert v.kinds.tolist() == [[R]]
    # residual = max(0, p - q) = [0, 0, .25, .25] -> norm [0, 0, .5, .5]
    assert v.next_token.tolist() == [2]
    v2 = one([t, BONUS], [[0.5, 0.5, 0.0, 0.0]], [0], rule, [u], su=0.6)
    assert v2.next_token.tolist() == [3]


def test_a_draft_token_with_q_zero_is_the_drafters_mistake():
    # q = 0: the drafter cannot have drawn this token (vLLM rejects it; the old code accepted it).
    with pytest.raises(ValueError, match="draft probability 0"):
        one([T0, BONUS], [[0.0, 0.5, 0.5, 0.0]], [0], StandardRule(), [0.99])
    # with the guard off (the decode loop on CUDA) the eps clamp still avoids a division by zero
    v = verify(torch.tensor([[T0, BONUS]]), torch.tensor([[[0.0, 0.5, 0.5, 0.0]]]), torch.tensor([[0]]),
               StandardRule(), uniforms=torch.tensor([[0.99]]), sample_uniforms=torch.tensor([0.5]), check=False)
    assert v.ratio.item() == pytest.approx(0.25 / 1e-10, rel=1e-6)


def test_a_draft_token_outside_the_vocabulary_is_a_clear_error():
    for bad in (4, -1):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            one([T0, T0, BONUS], [D0, D0], [1, bad], StandardRule(), [0.5, 0.5])


def test_an_empty_residual_falls_back_to_the_target():
    # q >= p everywhere (an over-confident, unnormalised draft): max(0, p - q) has no mass.
    t = [0.0, 0.5, 0.25, 0.25]
    v = one([t, BONUS], [[0.5, 0.5, 0.5, 0.5]], [0], StandardRule(), [0.5], su=0.6)
    assert v.kinds.tolist() == [[R]]
    assert v.next_token.tolist() == [2]  # CDF of P_target: [0, .5, .75, 1] at 0.6 -> token 2


def test_greedy_rule_accepts_only_the_argmax_and_emits_the_argmax():
    v = one([T0, T0, BONUS], [D0, D0], [1, 0], GreedyRule(), [0.99, 0.0], su=0.99)
    assert v.kinds.tolist() == [[A, R]]
    assert v.next_token.tolist() == [1]  # argmax of T0, whatever the draw
    assert v.next_p.tolist() == [0.5]


def test_k_equals_one_and_k_equals_eight():
    # K = 1 was covered above; K = 8 with a rejection at position 5.
    k = 8
    t = [[0.25, 0.25, 0.25, 0.25]] * k + [BONUS]
    d = [[0.25, 0.25, 0.25, 0.25]] * k  # r = 1 everywhere ...
    u = [0.5] * k
    toks = [0, 1, 2, 3, 0, 0, 2, 3]
    t[5] = [0.0, 0.5, 0.25, 0.25]  # ... except at position 5, where token 0 has p = 0
    v = one(t, d, toks, StandardRule(), u, su=0.1)
    assert v.num_accepted.tolist() == [5]
    assert v.kinds.tolist() == [[A, A, A, A, A, R, N, N]]
    # residual at 5: max(0, [0, .5, .25, .25] - .25) = [0, .25, 0, 0] -> token 1
    assert v.next_token.tolist() == [1]
    allgood = one([[0.25] * 4] * k + [BONUS], d, toks, StandardRule(), u, su=0.1)
    assert allgood.num_accepted.tolist() == [8] and allgood.next_token.tolist() == [3]


def test_four_rows_stop_at_different_positions():
    # K = 3; row b rejects at position b (row 3 accepts everything and takes the bonus).
    k, b = 3, 4
    good = [0.25, 0.25, 0.25, 0.25]
    bad = [0.0, 0.5, 0.25, 0.25]  # token 0 has p = 0
    target = torch.tensor([[bad if i == row else good for i in range(k)] + [BONUS] for row in range(b)])
    draft = torch.full((b, k, 4), 0.25)
    tokens = torch.zeros((b, k), dtype=torch.long)
    v = verify(target, draft, tokens, EARSRule(0.1), uniforms=torch.full((b, k), 0.5), sample_uniforms=torch.full((b,), 0.1))
    assert v.num_accepted.tolist() == [0, 1, 2, 3]
    assert v.kinds.tolist() == [[R, N, N], [A, R, N], [A, A, R], [A, A, A]]
    assert v.next_token.tolist() == [1, 1, 1, 3]
    assert v.is_bonus.tolist() == [False, False, False, True]


def test_distortion_is_zero_for_the_ordinary_rule_and_exact_for_ears():
    ears = one([T0, BONUS], [D0], [0], EARSRule(0.25), [0.9])
    std = one([T0, BONUS], [D0], [0], StandardRule(), [0.9])
    assert std.distortion.item() == pytest.approx(0.0, abs=1e-7)
    # By hand: a = min(1, p/q + 0.125) = [0.625, 1, 0.625, 0 (q = 0 -> ratio huge, 1? no: p > 0)]
    # token 3 has q = 0 so q * a = 0 whatever a is. kept = q * a = [0.3125, 0.25, 0.15625, 0]
    # reject mass = 1 - 0.71875 = 0.28125, residual norm = [0, 2/3, 0, 1/3]
    emit = [0.3125, 0.25 + 0.28125 * 2 / 3, 0.15625, 0.28125 / 3]
    tv = 0.5 * sum(abs(e - p) for e, p in zip(emit, T0))
    assert ears.distortion.item() == pytest.approx(tv, abs=1e-6)
    assert tv > 0.05


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match="K\\+1"):
        verify(torch.rand(1, 2, 4), torch.rand(1, 2, 4), torch.zeros(1, 2, dtype=torch.long), StandardRule())
    with pytest.raises(ValueError, match="vocabulary"):
        verify(torch.rand(1, 3, 4), torch.rand(1, 2, 5), torch.zeros(1, 2, dtype=torch.long), StandardRule())
    with pytest.raises(ValueError, match="long"):
        verify(torch.rand(1, 3, 4), torch.rand(1, 2, 4), torch.zeros(1, 2), StandardRule())


@pytest.mark.parametrize("beta", [-0.1, float("nan"), "0.1"])
def test_bad_beta_raises(beta):
    with pytest.raises(ValueError, match="beta"):
        EARSRule(beta)


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(0.3), GreedyRule()], ids=repr)
def test_emitted_only_and_draft_support_change_no_decision(rule):
    """The CPU decode loop's verify(emitted_only=True, draft_support=...) against the plain call:
    the same decisions and tokens, and the same distortion at every position that emits (0 .. n)."""
    g = torch.Generator().manual_seed(5)
    b, k, v = 300, 4, 40
    support = torch.arange(0, v, 3)  # the draft has mass on every third token only
    logits = 2 * torch.randn(b, k + 1, v, generator=g)
    logits[..., support] += 2.0  # most of the target's mass where the draft can propose
    tp = torch.softmax(logits, dim=-1)
    dp = torch.zeros(b, k, v)  # a draft near the target on its support
    dp[..., support] = torch.softmax(logits[:, :k, support] + 0.7 * torch.randn(b, k, len(support), generator=g), dim=-1)
    if isinstance(rule, GreedyRule):
        tp = torch.zeros_like(tp).scatter_(-1, tp.argmax(-1, keepdim=True), 1.0)
    tokens = torch.multinomial(dp.reshape(-1, v), 1, generator=g).reshape(b, k)
    if isinstance(rule, GreedyRule):  # most drafts the target's argmax, where the draft can propose it
        top = tp[:, :k].argmax(-1)
        tokens = torch.where((torch.rand(b, k, generator=g) < 0.8) & (dp.gather(-1, top[..., None])[..., 0] > 0), top, tokens)
    kw = dict(uniforms=torch.rand(b, k, generator=g), sample_uniforms=torch.rand(b, k + 1, generator=g),
              with_distortion=True)
    full = verify(tp, dp, tokens, rule, **kw)
    lean = verify(tp, dp, tokens, rule, emitted_only=True, draft_support=support, **kw)
    for field in ("num_accepted", "next_token", "kinds", "p", "q", "ratio", "tolerance", "max_p", "next_p", "next_q"):
        assert torch.equal(getattr(full, field), getattr(lean, field)), field
    emits = torch.arange(k)[None] <= full.num_accepted[:, None]  # (B, K) positions 0 .. n
    assert torch.allclose(lean.distortion[emits], full.distortion[emits], atol=1e-6)
    assert not lean.distortion[~emits].any()
    assert len(set(full.num_accepted.tolist())) == k + 1  # every n occurs: bonus rows and each rejection point
    if isinstance(rule, EARSRule):
        assert float(full.distortion[emits].max()) > 0.01


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(0.3)], ids=repr)
@pytest.mark.parametrize("emitted_only", [False, True])
def test_at_temperature_zero_the_ratio_rules_verify_as_greedy(rule, emitted_only):
    # What verifying_rule relies on: with one-hot P_target and q (T = 0), the ordinary rule and EARS
    # give GreedyRule's verdict field by field, draws of 0 included.
    from ears_core.rules import BudgetEARSRule, verifying_rule

    g = torch.Generator().manual_seed(2)
    v, k = 12, 4
    for trial in range(200):
        tgt = torch.randint(0, v, (1, k + 1), generator=g)
        toks = torch.where(torch.rand(1, k, generator=g) < 0.6, tgt[:, :k], torch.randint(0, v, (1, k), generator=g))
        tp = torch.zeros(1, k + 1, v).scatter_(-1, tgt[..., None], 1.0)
        dp = torch.zeros(1, k, v).scatter_(-1, toks[..., None], 1.0)
        u = torch.where(torch.rand(1, k, generator=g) < 0.2, 0.0, torch.rand(1, k, generator=g))
        kw = dict(uniforms=u, sample_uniforms=torch.rand(1, k + 1, generator=g), emitted_only=emitted_only)
        got = verify(tp, dp, toks, rule, with_distortion=True, **kw)
        ref = verify(tp, dp, toks, GreedyRule(), **kw)
        for field in ("num_accepted", "next_token", "kinds", "p", "q", "ratio", "u", "tolerance", "max_p", "next_p", "next_q"):
            assert torch.equal(getattr(got, field), getattr(ref, field)), (trial, field)
        assert not got.distortion.any()
    assert isinstance(verifying_rule(rule, True), GreedyRule) and verifying_rule(rule, False) is rule
    budget = BudgetEARSRule(0.1)  # a subclass keeps its own rule (it has state across rounds)
    assert verifying_rule(budget, True) is budget
