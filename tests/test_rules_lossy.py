"""Lossy rules beside the ordinary one: FLy (a deferred rejection) and the distortion budget
(EARS whose beta a controller sets each round).

Terms
-----
chain model   the tests' stand-in for a model pair: over V = 3 tokens, P_target and P_draft of the
              next token depend on the previous token only (rows of T and D below). Small enough to
              enumerate every draft chain of K = 3 tokens and every outcome of the K uniform draws.
outcome       for a drafted chain, the pattern of native decisions (r_j >= U_j or not) at the K
              positions; pattern A has probability prod_j (a_j if A_j else 1 - a_j) with
              a_j = min(1, r_j). FLy's decision is a function of (chain, pattern), so enumerating
              both, then the token drawn after the round (residual or bonus), gives the EXACT
              distribution of the output; rounds are chained to get the first L = 4 tokens.
deferral      FLy keeps a token the ordinary rule rejects (reported with kind "pardoned").

Figures the enumeration gives (context token 0, gate 0.7 over the top 2 probabilities, K = 3;
the per-token probability that a deferral kept the token at output positions 1..4, its mean, and
the exact total-variation distance of the 4-token output from the target's):

    window 1: [0.18000, 0.10560, 0.04795, 0.06167], mean 0.09881; TV 4 tokens 0.26349, first 0.180
    window 2: [0.11400, 0.02120, 0.03292, 0.02991], mean 0.04951; TV 4 tokens 0.13522, first 0.114

FLy's reported per-position distortion (its acceptance_prob approximation) averages 0.186
(window 1) and 0.119 (window 2) at the first position of a round against the exact 0.180 and
0.114: close, not exact, because the chain after a token depends on the token. Where it does not
(the same P and Q at every position) the approximation is exact (tested).
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import PROMPTS
from ears_core import StandardRule, generate, verify
from ears_core.rules import BudgetEARSRule, FLyRule, make_rule
from ears_core.decode.verify import DraftKind

A, P_, R, N_ = (int(k) for k in (DraftKind.ACCEPTED, DraftKind.PARDONED, DraftKind.REJECTED,
                                 DraftKind.NOT_EVALUATED))

# ----------------------------------------------------------------------------- the chain model

T = np.array([[0.50, 0.30, 0.20], [0.20, 0.20, 0.60], [0.45, 0.45, 0.10]])  # P_target(next | previous)
D = np.array([[0.20, 0.60, 0.20], [0.50, 0.30, 0.20], [0.30, 0.20, 0.50]])  # P_draft(next | previous)
V, K, L = 3, 3, 4
GATE, TOP_N = 0.7, 2  # top-2 entropy: 0.708 after token 0, 0.628 after 1, 0.719 after 2: open, shut, open


def top_entropy(p: np.ndarray, n: int) -> float:
    top = np.sort(p)[::-1][:n]
    return float(-(top[top > 0] * np.log(top[top > 0])).sum())


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r = np.maximum(p - q, 0.0)
    return r / r.sum() if r.sum() > 1e-12 else p


def fly_reference(native: list[bool], gate_open: list[bool], window: int) -> tuple[int, list[bool]]:
    """FLy as documented, one position at a time: (drafts that stand, which of them were deferred)."""
    k, deferred = len(native), []
    for i in range(k):
        if native[i]:
            deferred.append(False)
        elif window > 0 and i + window < k and gate_open[i] and all(native[i + 1:i + window + 1]):
            deferred.append(True)
        else:
            break
    return len(deferred), deferred


def round_outcomes(rule, ctx: int, t: np.ndarray = T, d: np.ndarray = D, window: int | None = None):
    """Every (chain, native pattern) of one round from context ``ctx``, decided by verify() with
    uniforms that realise the pattern. -> (outcomes, verdict, weights): outcomes are (probability,
    emitted tokens, deferred flags) with the token after the round enumerated too; ``window``
    given: each decision is also checked against ``fly_reference``."""
    rows = []
    for chain in itertools.product(range(V), repeat=K):
        prev = (ctx, *chain)
        tp, dp = t[list(prev)], d[list(prev[:K])]  # (K+1, V), (K, V)
        p = tp[np.arange(K), chain]
        q = dp[np.arange(K), chain]
        a = np.minimum(1.0, p / q)
        w_chain = float(np.prod(q))
        for pattern in itertools.product([True, False], repeat=K):
            w = w_chain * float(np.prod(np.where(pattern, a, 1.0 - a)))
            if w > 0:  # accept: U = a/2 <= r; reject: U = (1 + a)/2 > r
                rows.append((chain, pattern, w, tp, dp, np.where(pattern, a / 2, (1 + a) / 2)))
    v = verify(torch.tensor(np.stack([r[3] for r in rows])), torch.tensor(np.stack([r[4] for r in rows])),
               torch.tensor([r[0] for r in rows]), rule, uniforms=torch.tensor(np.stack([r[5] for r in rows])),
               sample_uniforms=torch.zeros(len(rows), dtype=torch.float64), with_distortion=True)
    outcomes = []
    for i, (chain, pattern, w, tp, dp, _) in enumerate(rows):
        n = int(v.num_accepted[i])
        deferred = [k == P_ for k in v.kinds[i, :n].tolist()]
        if window is not None:
            gate = [top_entropy(tp[j], TOP_N) >= GATE for j in range(K)]
            assert (n, deferred) == fly_reference(list(pattern), gate, window), (chain, pattern)
        after = residual(tp[n], dp[n]) if n < K else tp[K]
        for y in np.flatnonzero(after):
            outcomes.append((w * after[y], (*chain[:n], int(y)), (*deferred, False)))
    return outcomes, v, np.array([r[2] for r in rows])


def output_distribution(rule, window: int | None = None, t: np.ndarray = T, d: np.ndarray = D):
    """The exact distribution of the first L output tokens from context 0, and the probability that
    the token at each output position was kept by a deferral: rounds chained by recursion."""
    memo: dict[tuple[int, int], dict[tuple[int, ...], tuple[float, np.ndarray]]] = {}
    rounds = {c: round_outcomes(rule, c, t, d, window)[0] for c in range(V)}

    def first(ctx: int, length: int) -> dict[tuple[int, ...], tuple[float, np.ndarray]]:
        if (ctx, length) in memo:
            return memo[ctx, length]
        out: dict[tuple[int, ...], list] = {}
        for w, emitted, deferred in rounds[ctx]:
            m = len(emitted)
            tails = {(): (1.0, np.zeros(0))} if m >= length else first(emitted[-1], length - m)
            for tail, (w2, d2) in tails.items():
                seq = (emitted + tail)[:length]
                flags = np.concatenate([np.array(deferred[:length], float) * w2, d2])  # expected, given tail
                e = out.setdefault(seq, [0.0, np.zeros(length)])
                e[0] += w * w2
                e[1] += w * flags
        memo[ctx, length] = {s: (e[0], e[1]) for s, e in out.items()}
        return memo[ctx, length]

    dist = first(0, L)
    probs = {s: w for s, (w, _) in dist.items()}
    deferral = sum((f for _, f in dist.values()), np.zeros(L))
    return probs, deferral


def target_distribution(t: np.ndarray = T) -> dict[tuple[int, ...], float]:
    return {s: float(np.prod([t[a, b] for a, b in zip((0, *s[:-1]), s)])) for s in itertools.product(range(V), repeat=L)}


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


def first_token_closed_form(window: int, t: np.ndarray = T, d: np.ndarray = D) -> tuple[np.ndarray, float]:
    """FLy's first output token from context 0, derived by hand: x stands if native, or deferred
    when the gate is open and the next ``window`` drafts stand natively; the chance of that given
    x is c_W(x), with c_0 = 1 and c_W(x) = sum_y min(T[x, y], D[x, y]) c_{W-1}(y).
    -> (distribution, probability of a deferral at the first position)."""
    c = np.ones(V)
    for _ in range(window):
        c = np.minimum(t, d) @ c
    p, q = t[0], d[0]
    a0 = np.minimum(1.0, p / q)
    gate = float(top_entropy(p, TOP_N) >= GATE)
    a = a0 + (1 - a0) * gate * c
    emit = q * a + (1 - (q * a).sum()) * residual(p, q)
    return emit, float((q * (1 - a0) * gate * c).sum())


# ----------------------------------------------------------------------------- FLy: decisions


def test_fly_parameters_from_the_registry():
    rule = make_rule("fly", gate=0.5, window=3.0, top_n=2.0)  # slider and flag values arrive as floats
    assert isinstance(rule, FLyRule) and (rule.gate, rule.window, rule.top_n) == (0.5, 3, 2)
    assert (make_rule("fly").gate, make_rule("fly").window, make_rule("fly").top_n) == (0.3, 2, 3)
    for bad in (dict(window=1.5), dict(window=-1), dict(window=float("inf")), dict(top_n=0), dict(gate=-0.1)):
        with pytest.raises(ValueError, match="FLy"):
            make_rule("fly", **bad)
    # lossless exactly when no deferral is possible: window 0, or a gate above the largest top-n entropy
    assert make_rule("fly", window=0).lossless and not make_rule("fly").lossless
    assert make_rule("fly", gate=1.1, top_n=3).lossless and not make_rule("fly", gate=1.09, top_n=3).lossless
    assert make_rule("fly", gate=0.74, top_n=2).lossless and not make_rule("fly", gate=0.73, top_n=2).lossless
    uniform = torch.full((1, 1, 3), 1 / 3)  # top-3 entropy log 3 = 1.0986, the maximum
    assert FLyRule(gate=1.098, top_n=3).gate_open(uniform).item() and not FLyRule(gate=1.099, top_n=3).gate_open(uniform).item()


# Four rows, K = 3, V = 4, window 2, top 3. Row 0: the draft at position 0 (token 3, p 0.1, q 0.5,
# r 0.2, U 0.9) fails natively where the target is uncertain (top-3 entropy 1.08), and both drafts
# after it stand (r > 1): deferred. Row 1: as row 0, but the draft at position 2 fails (r 2/3 < U
# 0.99): not confirmed. Row 2: as row 0, but the target is sure at position 0 (entropy 0.12): gate
# shut. Row 3: the native failure is at position 1, with one draft after it (< window): never
# deferred at the end of the chain.
FLAT, SURE, EVEN = [0.3, 0.3, 0.3, 0.1], [0.97, 0.01, 0.01, 0.01], [0.25] * 4
Q0 = [0.1, 0.1, 0.3, 0.5]
P1, Q1 = [0.7, 0.1, 0.1, 0.1], [0.6, 0.2, 0.1, 0.1]
P2, Q2 = [0.1, 0.6, 0.2, 0.1], [0.1, 0.5, 0.3, 0.1]
HAND = dict(
    target=[[FLAT, P1, P2, EVEN], [FLAT, P1, P2, EVEN], [SURE, P1, P2, EVEN], [P1, FLAT, P2, EVEN]],
    draft=[[Q0, Q1, Q2], [Q0, Q1, Q2], [Q0, Q1, Q2], [P1, Q0, Q2]],
    tokens=[[3, 0, 1], [3, 0, 2], [3, 0, 1], [0, 3, 1]],
    u=[[0.9, 0.5, 0.99]] * 4,
    su=[[0.6, 0.6, 0.6, 0.6]] * 4,  # residual [0.5, 0.5, 0, 0] -> token 1; bonus (even) -> token 2
)


def hand_verdict(rule):
    return verify(torch.tensor(HAND["target"]), torch.tensor(HAND["draft"]), torch.tensor(HAND["tokens"]), rule,
                  uniforms=torch.tensor(HAND["u"]), sample_uniforms=torch.tensor(HAND["su"]), with_distortion=True)


def emitted(v, tokens) -> list[list[int]]:
    return [tokens[b][:n] + [t] for b, (n, t) in enumerate(zip(v.num_accepted.tolist(), v.next_token.tolist()))]


def test_fly_defers_a_rejection_in_a_hand_made_case():
    fly, std = hand_verdict(FLyRule(gate=0.3, window=2, top_n=3)), hand_verdict(StandardRule())
    assert fly.kinds.tolist() == [[P_, A, A], [R, N_, N_], [R, N_, N_], [A, R, N_]]
    assert emitted(fly, HAND["tokens"]) == [[3, 0, 1, 2], [1], [0], [0, 1]]
    # the ordinary rule on the same draws: row 0 stops at the deferred position
    assert std.kinds.tolist() == [[R, N_, N_], [R, N_, N_], [R, N_, N_], [A, R, N_]]
    assert emitted(std, HAND["tokens"]) == [[1], [1], [0], [0, 1]]
    assert fly.tolerance.abs().sum().item() == 0.0  # FLy has no tolerance: TokenEvent.tolerance stays 0
    # the same row with window 3 (> the 2 drafts that follow) or a gate above its entropy: rejected
    for rule in (FLyRule(gate=0.3, window=3), FLyRule(gate=1.09, window=2)):
        assert hand_verdict(rule).kinds[0].tolist() == [R, N_, N_]
    # window 1 confirms with the next draft only: row 1 is deferred at 0 (then rejected at its last
    # position, which is never deferred), and row 3 at 1, which now has enough drafts after it
    one = hand_verdict(FLyRule(gate=0.3, window=1))
    assert one.kinds.tolist() == [[P_, A, A], [P_, A, R], [R, N_, N_], [A, P_, A]]
    assert emitted(one, HAND["tokens"]) == [[3, 0, 1, 2], [3, 0, 1], [0], [0, 3, 1, 2]]


def random_round(b: int, k: int, v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    tp = torch.softmax(torch.randn(b, k + 1, v, generator=g), dim=-1)
    dp = torch.softmax(torch.randn(b, k, v, generator=g), dim=-1)
    tokens = torch.multinomial(dp.reshape(-1, v), 1, generator=g).reshape(b, k)
    u, su = torch.rand(b, k, generator=g), torch.rand(b, k + 1, generator=g)
    return tp, dp, tokens, u, su


@pytest.mark.parametrize("rule", [FLyRule(window=0, gate=0.0), FLyRule(gate=1.1, window=2, top_n=3),
                                  FLyRule(gate=0.74, window=1, top_n=2)], ids=repr)
def test_fly_that_cannot_defer_is_the_ordinary_rule_in_verify(rule):
    assert rule.lossless
    tp, dp, tokens, u, su = random_round(600, 5, 6, seed=3)
    kw = dict(uniforms=u, sample_uniforms=su, with_distortion=True)
    mine, std = verify(tp, dp, tokens, rule, **kw), verify(tp, dp, tokens, StandardRule(), **kw)
    for field in ("kinds", "num_accepted", "next_token", "tolerance"):
        assert torch.equal(getattr(mine, field), getattr(std, field)), field
    # FLy enumerates its emitted distribution, the ordinary rule has the closed form (exactly 0)
    assert torch.allclose(mine.distortion, std.distortion, atol=1e-6) and not std.distortion.any()
    # the same draws with the gate open and window 1 defer somewhere: the comparison above has power
    open_ = verify(tp, dp, tokens, FLyRule(gate=0.0, window=1), **kw)
    assert (open_.kinds == P_).sum() > 20 and not torch.equal(open_.num_accepted, std.num_accepted)
    assert bool((open_.num_accepted >= std.num_accepted).all())  # a deferral only ever keeps more


def test_fly_that_cannot_defer_is_the_ordinary_rule_end_to_end(tiny_pair):
    target, draft = tiny_pair
    kw = dict(k=4, temperature=0.9, max_new_tokens=32)
    for seed, prompt in enumerate(PROMPTS[:2]):
        std = generate(target, draft, prompt, rule=StandardRule(), seed=seed, **kw)
        for rule in (make_rule("fly", window=0), make_rule("fly", gate=1.2)):
            res = generate(target, draft, prompt, rule=rule, seed=seed, **kw)
            assert res.token_ids == std.token_ids and res.events == std.events
        on = generate(target, draft, prompt, rule=make_rule("fly", gate=0.0, window=1), seed=seed, **kw)
        assert any(e.kind == "pardoned" for e in on.events) and on.token_ids != std.token_ids


# ----------------------------------------------------------------------------- FLy: exact distribution

PINNED = {  # window -> (per-position deferral probabilities, TV of the 4 tokens, TV of the first)
    1: ([0.18000, 0.10560, 0.04795, 0.06167], 0.26349, 0.180),
    2: ([0.11400, 0.02120, 0.03292, 0.02991], 0.13522, 0.114),
}


def test_the_enumeration_gives_the_target_for_the_ordinary_rule():
    probs, deferral = output_distribution(StandardRule())
    assert abs(sum(probs.values()) - 1) < 1e-12 and len(probs) == V ** L
    assert tv(probs, target_distribution()) < 1e-12 and not deferral.any()


@pytest.mark.parametrize("window", [1, 2])
def test_fly_exact_output_distribution_by_enumeration(window, capsys):
    rule = FLyRule(gate=GATE, window=window, top_n=TOP_N)
    probs, deferral = output_distribution(rule, window=window)  # also checks every decision against the loop
    assert abs(sum(probs.values()) - 1) < 1e-12
    first = np.zeros(V)
    for s, w in probs.items():
        first[s[0]] += w
    closed, deferral_0 = first_token_closed_form(window)
    assert np.allclose(first, closed, atol=1e-12) and deferral[0] == pytest.approx(deferral_0, abs=1e-12)
    tv_all, tv_first = tv(probs, target_distribution()), 0.5 * np.abs(first - T[0]).sum()
    per_token, tv_pin, first_pin = PINNED[window]
    assert np.allclose(deferral, per_token, atol=5e-6)
    assert tv_all == pytest.approx(tv_pin, abs=5e-6) and tv_first == pytest.approx(first_pin, abs=5e-6)
    # the per-position approximation FLy reports, averaged over the chains of a round from token 0
    _, v, w = round_outcomes(rule, 0)
    reported = float((torch.tensor(w) * v.distortion[:, 0]).sum())
    with capsys.disabled():
        print(f"\nFLy window {window}: P(deferral kept the token) per output position {np.round(deferral, 5).tolist()}, "
              f"mean {deferral.mean():.5f}; exact TV {tv_all:.5f} (4 tokens), {tv_first:.5f} (first); "
              f"reported first-position distortion {reported:.5f}")
    assert reported == pytest.approx(tv_first, rel=0.1)  # measured: +3.3 % (window 1), +4.3 % (window 2)


def sample_outputs(rule, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n independent runs of the chain model through verify() with random draws, rounds chained
    until L tokens are out: -> (first L tokens (n, L), kept-by-deferral flags (n, L))."""
    g = torch.Generator().manual_seed(seed)
    tt, dd = torch.tensor(T), torch.tensor(D)
    out = torch.zeros(n, L + K + 1, dtype=torch.long)
    flags = torch.zeros(n, L + K + 1, dtype=torch.bool)
    length = torch.zeros(n, dtype=torch.long)
    ctx = torch.zeros(n, dtype=torch.long)
    rows = torch.arange(n)
    while bool((length < L).any()):
        prev = [ctx]
        for _ in range(K):  # the draft chain, token by token
            prev.append(torch.multinomial(dd[prev[-1]], 1, generator=g).squeeze(-1))
        chain = torch.stack(prev[1:], dim=1)  # (n, K)
        prevs = torch.stack(prev, dim=1)  # (n, K+1)
        v = verify(tt[prevs], dd[prevs[:, :K]], chain, rule, generator=g)
        live, na = length < L, v.num_accepted
        toks = torch.cat([chain, v.next_token[:, None]], dim=1).scatter(1, na[:, None], v.next_token[:, None])
        kinds = torch.cat([v.kinds, torch.full((n, 1), N_, dtype=v.kinds.dtype)], dim=1)
        for j in range(K + 1):
            put = live & (j <= na)
            out[rows[put], length[put] + j] = toks[put, j]
            flags[rows[put], length[put] + j] = (kinds[put, j] == P_) & (j < na[put])
        ctx = torch.where(live, v.next_token, ctx)
        length = torch.where(live, length + na + 1, length)
    return out[:, :L].numpy(), flags[:, :L].numpy()


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-squared goodness of fit, cells with expected count < 5 pooled into one."""
    exp = probs * counts.sum()
    big = exp >= 5
    obs_c, exp_c = np.append(counts[big], counts[~big].sum()), np.append(exp[big], exp[~big].sum())
    keep = exp_c > 0
    return float(stats.chisquare(obs_c[keep], exp_c[keep] * obs_c[keep].sum() / exp_c[keep].sum()).pvalue)


@pytest.mark.parametrize("window", [1, 2])
def test_fly_draws_follow_the_enumerated_distribution(window):
    """The decisions verify() makes with random draws (and the kinds it reports) agree with the
    enumeration: the enumeration is the distribution the rule really has."""
    rule, n = FLyRule(gate=GATE, window=window, top_n=TOP_N), 30_000
    probs, deferral = output_distribution(rule)
    seqs, flags = sample_outputs(rule, n, seed=window)
    cells = list(itertools.product(range(V), repeat=L))
    index = {s: i for i, s in enumerate(cells)}
    counts = np.bincount([index[tuple(s)] for s in seqs.tolist()], minlength=len(cells))
    assert chi2_pvalue(counts, np.array([probs.get(s, 0.0) for s in cells])) > 1e-3
    target = target_distribution()
    assert chi2_pvalue(counts, np.array([target[s] for s in cells])) < 1e-12  # and the test has power
    rate = flags.mean(axis=0)  # reported deferrals per output position
    assert np.all(np.abs(rate - deferral) <= 4 * np.sqrt(deferral * (1 - deferral) / n))


def test_fly_reported_distortion_is_exact_when_positions_do_not_depend_on_the_path():
    """Same P and Q at every position: what FLy reports for the first position is its exact TV."""
    t, d = np.tile(T[0], (V, 1)), np.tile(D[0], (V, 1))
    rule = FLyRule(gate=GATE, window=2, top_n=TOP_N)
    probs, _ = output_distribution(rule, t=t, d=d)
    first = np.zeros(V)
    for s, w in probs.items():
        first[s[0]] += w
    exact = 0.5 * np.abs(first - t[0]).sum()
    _, v, _ = round_outcomes(rule, 0, t, d)
    assert exact > 0.05
    assert torch.allclose(v.distortion[:, 0], torch.full_like(v.distortion[:, 0], exact), atol=1e-12)


# ----------------------------------------------------------------------------- the distortion budget


def test_budget_registry_state_and_fresh():
    rule = make_rule("ears-budget", epsilon=0.02)
    assert isinstance(rule, BudgetEARSRule) and make_rule("budget").epsilon == 0.01
    assert rule.epsilon == 0.02 and rule.tokens == 0 and rule.slack == 0.0 and rule.beta == 0.0
    rule.observe_round([SimpleNamespace(distortion=0.01), SimpleNamespace(distortion=0.0)])
    assert rule.tokens == 2 and rule.distortion == 0.01 and rule.slack == pytest.approx(0.03)
    new = rule.fresh()
    assert type(new) is BudgetEARSRule and new.epsilon == 0.02 and new.tokens == 0 and new.distortion == 0.0
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="epsilon"):
            make_rule("ears-budget", epsilon=bad)
    assert make_rule("ears-budget", epsilon=0).lossless and not rule.lossless


def test_budget_beta_is_the_largest_safe_value():
    rule = BudgetEARSRule(epsilon=0.02, beta_max=1.0)
    rule.tokens, rule.distortion = 10, 0.1  # slack 0.2 - 0.1 = 0.1
    max_p = torch.tensor([[0.5, 0.8, 0.0], [0.2, 0.2, 0.2], [1.0, 1.0, 1.0]])  # u = 1 - max_p
    beta = rule.round_beta(max_p)
    s, e = 0.1, 0.02 - rule.SLOP
    # by hand: min over L of (s + e L) / (u_0 + ... + u_{L-1}), clamped to [0, beta_max]
    row0 = min((s + e) / 0.5, (s + 2 * e) / 0.7, (s + 3 * e) / 1.7)
    row1 = min((s + e) / 0.8, (s + 2 * e) / 1.6, (s + 3 * e) / 2.4)
    assert beta.tolist() == pytest.approx([row0, row1, 1.0])  # no uncertainty: no constraint, beta_max
    rule.distortion = 1.0  # overspent: beta 0
    assert rule.round_beta(max_p).tolist() == [0.0, 0.0, 0.0]
    rule.tokens, rule.distortion = 10_000, 0.0
    assert rule.round_beta(max_p).tolist() == [1.0, 1.0, 1.0]  # capped at beta_max


def test_budget_holds_when_every_position_distorts_as_much_as_its_bound():
    """The worst case the bound allows (each position's distortion equal to its tolerance, rounds
    cut at random as by an EOS): the running mean never exceeds epsilon, and the controller spends
    the budget rather than sitting at beta = 0."""
    eps = 0.02
    rule, g = BudgetEARSRule(epsilon=eps), torch.Generator().manual_seed(5)
    for _ in range(400):
        k = int(torch.randint(0, 6, (1,), generator=g))
        tp, dp, tokens, u, su = random_round(1, k, 8, seed=int(torch.randint(0, 10**6, (1,), generator=g)))
        v = verify(tp, dp, tokens, rule, uniforms=u, sample_uniforms=su)
        n = int(v.num_accepted)
        cut = int(torch.randint(1, n + 2, (1,), generator=g))  # 1..n+1 tokens kept
        rule.observe_round([SimpleNamespace(distortion=float(v.tolerance[0, j]) if j < k else 0.0)
                            for j in range(cut)])
        assert rule.distortion <= eps * rule.tokens + 1e-9
    assert rule.mean_distortion > 0.9 * eps and max(rule.betas) > 5 * eps


def test_budget_epsilon_zero_is_the_ordinary_rule():
    tp, dp, tokens, u, su = random_round(300, 4, 6, seed=9)
    kw = dict(uniforms=u, sample_uniforms=su, with_distortion=True)
    zero, std = verify(tp, dp, tokens, BudgetEARSRule(0.0), **kw), verify(tp, dp, tokens, StandardRule(), **kw)
    for field in ("kinds", "num_accepted", "next_token", "tolerance", "distortion"):
        assert torch.equal(getattr(zero, field), getattr(std, field)), field
    some = verify(tp, dp, tokens, BudgetEARSRule(0.05), **kw)  # a budget > 0 pardons on the same draws
    assert (some.kinds == P_).any() and bool((some.num_accepted >= std.num_accepted).all())


def test_budget_epsilon_zero_is_the_ordinary_rule_end_to_end(tiny_pair):
    target, draft = tiny_pair
    for seed, prompt in enumerate(PROMPTS[:3]):
        kw = dict(k=4, temperature=0.9, max_new_tokens=32, seed=seed)
        std = generate(target, draft, prompt, rule=StandardRule(), **kw)
        zero = generate(target, draft, prompt, rule=make_rule("ears-budget", epsilon=0.0), **kw)
        assert zero.token_ids == std.token_ids and zero.events == std.events


@pytest.mark.slow
def test_budget_keeps_the_mean_distortion_on_a_tiny_pair(tiny_pair):
    """T = 0.9, 12 generations of 64 tokens (>= 200 rounds). The margin on the realised mean is
    1e-6: the controller's bound is deterministic (no statistical margin is needed) and 1e-6 covers
    float32 rounding of the per-position TV. Acceptance is pooled over the same prompts and seeds as
    the ordinary rule's; the gap (about 0.05 here) is many times the paired noise."""
    target, draft = tiny_pair
    eps = 0.05
    rounds, totals = 0, {"budget": [0, 0, 0.0, 0], "ordinary": [0, 0, 0.0, 0]}  # drafted, stood, distortion, tokens
    for prompt in PROMPTS:
        for seed in range(3):
            kw = dict(k=4, temperature=0.9, max_new_tokens=64, seed=seed)
            rule = make_rule("ears-budget", epsilon=eps)
            res = generate(target, draft, prompt, rule=rule, **kw)
            std = generate(target, draft, prompt, rule=StandardRule(), **kw)
            s = res.stats
            assert s.total_distortion <= eps * s.new_tokens + 1e-6  # this generation's running mean
            assert rule.tokens == s.new_tokens and rule.distortion == pytest.approx(s.total_distortion)
            for ev in res.events:  # the tolerance in force is the round's beta times (1 - max P)
                if ev.tolerance is not None:
                    assert ev.tolerance == pytest.approx(rule.betas[ev.step] * (1 - ev.max_p), rel=1e-4, abs=1e-7)
            rounds += s.steps
            for name, st in (("budget", s), ("ordinary", std.stats)):
                t = totals[name]
                t[0] += st.drafted
                t[1] += st.accepted
                t[2] += st.total_distortion
                t[3] += st.new_tokens
    assert rounds >= 200
    b, o = totals["budget"], totals["ordinary"]
    assert b[2] / b[3] <= eps + 1e-6 and b[2] / b[3] > 0.5 * eps  # within budget, and the budget is used
    assert b[1] / b[0] >= o[1] / o[0] + 0.02


def test_fly_reports_the_same_distortion_with_emitted_only_as_without():
    """FLy's acceptance at a position looks at the drafts after it: verify's CPU path (emitted_only), which
    computes the distortion only where tokens are emitted, must still see the whole row."""
    g = torch.Generator().manual_seed(3)
    v, k = 12, 5
    tp = torch.softmax(torch.randn(1, k + 1, v, generator=g) * 0.3, dim=-1)  # an uncertain target: the gate opens
    dp = torch.softmax(torch.randn(1, k, v, generator=g), dim=-1)
    toks = tp[0, :k].argmin(dim=-1)[None]  # drafts the target finds unlikely: the first is rejected, n = 0
    rule = FLyRule(gate=0.0, window=2)
    kw = dict(uniforms=torch.full((1, k), 0.999), sample_uniforms=torch.full((1, k + 1), 0.5), with_distortion=True)
    full = verify(tp, dp, toks, rule, **kw)
    cpu = verify(tp, dp, toks, rule, emitted_only=True, **kw)
    n = int(full.num_accepted[0])
    assert n < k and float(full.distortion[0, n]) > 0  # FLy distorts at the emitted position
    assert torch.allclose(cpu.distortion[0, : n + 1], full.distortion[0, : n + 1])
    assert not cpu.distortion[0, n + 1:].any()
