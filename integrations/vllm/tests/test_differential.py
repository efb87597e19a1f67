"""The patched vLLM acceptance against ears_core.verify, on identical probabilities and uniforms.

vLLM's own rejection sampler (its CPU C++ kernel here, the one vLLM's CPU build runs) is called
through the module attribute the plug-in patches, exactly as ``rejection_sample()`` calls it.
Compared: the number of accepted drafts per request and the accepted tokens, equal draw for draw.
Not compared token for token: the token after a rejection. vLLM draws its recovered token by an
exponential race (argmax of residual / Exp(1)), ears_core by inverse CDF over the same residual
norm(max(0, p - q)) (with one-hot q for a drafter that gives no probabilities), so the two draws
differ for the same seed. Checked instead: vLLM's recovered token always lies in the residual's
support, and over many draws its frequencies match ears_core's residual (``test_recovered_distribution``).
The bonus token is vLLM's input (drawn by the target's sampler), passed through unchanged.
"""

from __future__ import annotations

import types

import pytest
import torch

from ears_core import EARSRule, StandardRule, verify

import ears_vllm

rs = pytest.importorskip("vllm.v1.sample.rejection_sampler")


@pytest.fixture(scope="module", autouse=True)
def cpu_kernels():
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # what each CPU worker does at start
    yield
    ears_vllm.configure(None)


def _case(gen: torch.Generator, batch: int, vocab: int, with_draft: bool):
    ks = torch.randint(1, 6, (batch,), generator=gen).tolist()
    n = sum(ks)
    logits = torch.randn(n + batch, vocab, generator=gen) * 2.0
    # zeros in the target: a top-k cut of 1..vocab-1 tokens at some positions
    cut = torch.rand(n + batch, vocab, generator=gen) < 0.25
    cut[:, 0] = False
    logits = logits.masked_fill(cut, float("-inf"))
    target_all = torch.softmax(logits, dim=-1)  # float32
    draft_probs = None
    if with_draft:
        dl = torch.randn(n, vocab, generator=gen) * 2.0
        dl = dl.masked_fill(torch.rand(n, vocab, generator=gen) < 0.2, float("-inf"))
        dl[:, 1] = 0.0
        draft_probs = torch.softmax(dl, dim=-1)
        draft_tokens = torch.multinomial(draft_probs, 1, generator=gen).squeeze(1)
    else:  # an n-gram drafter: any token, even one outside the target's support
        draft_tokens = torch.randint(0, vocab, (n,), generator=gen)
    u = torch.rand(n, dtype=torch.float64, generator=gen)
    return ks, target_all, draft_probs, draft_tokens, u


def _vllm_decide(ks, target_probs, draft_probs, draft_tokens, u, bonus):
    batch = len(ks)
    cu = torch.tensor(ks, dtype=torch.int32).cumsum(0).to(torch.int32)
    max_spec = max(ks)
    out = torch.full((batch, max_spec + 1), -1, dtype=torch.int32)
    draft_i32 = draft_tokens.to(torch.int32).contiguous()
    meta = types.SimpleNamespace(generators={})
    recovered = rs.sample_recovered_tokens(max_spec, ks, cu, draft_i32, draft_probs, target_probs, meta,
                                           torch.device("cpu"))
    rs._rejection_random_sample(out, cu, draft_i32, draft_probs, target_probs, bonus.view(-1, 1).contiguous(),
                                recovered, u, torch.zeros(batch, dtype=torch.bool), max_spec, None)
    return out, recovered


@pytest.mark.parametrize("with_draft", [True, False], ids=["draft_probs", "no_draft_probs"])
@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5])
def test_same_decisions_as_ears_core(beta, with_draft):
    gen = torch.Generator().manual_seed(1000 + int(beta * 100) + with_draft)
    ears_vllm.configure("ears", beta)
    rule = EARSRule(beta) if beta > 0 else StandardRule()
    total = pardons = mismatches = 0
    for _ in range(40):
        batch, vocab = 16, 12
        ks, target_all, draft_probs, draft_tokens, u = _case(gen, batch, vocab, with_draft)
        n = sum(ks)
        target_probs = target_all[:n].contiguous()  # vLLM's rows: the drafted positions only
        bonus = torch.randint(0, vocab, (batch,), generator=gen)
        out, recovered = _vllm_decide(ks, target_probs, draft_probs, draft_tokens, u, bonus)
        start = 0
        for b, k in enumerate(ks):
            rows = slice(start, start + k)
            tp = torch.cat([target_probs[rows], target_all[n + b:n + b + 1]]).unsqueeze(0)  # (1, K+1, V)
            dt = draft_tokens[rows].unsqueeze(0)
            dp = (draft_probs[rows] if with_draft
                  else torch.nn.functional.one_hot(dt[0], vocab).to(torch.float32)).unsqueeze(0)
            verdict = verify(tp, dp, dt, rule, uniforms=u[rows].unsqueeze(0),
                             sample_uniforms=torch.rand(1, generator=gen), check=with_draft)
            n_lib = int(verdict.num_accepted[0])
            emitted = [t for t in out[b].tolist() if t != -1]
            n_vllm = len(emitted) - 1
            mismatches += n_lib != n_vllm
            assert emitted[:n_vllm] == dt[0, :n_vllm].tolist()
            if n_vllm == k:
                assert emitted[k] == int(bonus[b])
            else:  # vLLM's recovered token: in the support of the library's residual at n
                res = rule.residual(tp[0, n_vllm], dp[0, n_vllm])
                assert res[emitted[n_vllm]] > 0, (beta, with_draft, b)
            pardons += int((verdict.kinds[0, :n_lib] == 1).sum())
            total += 1
            start += k
    assert mismatches == 0, f"{mismatches} of {total} requests decided differently"
    if beta > 0:
        assert pardons > 0  # the cases exercise the tolerance


def test_standard_rule_is_vllms_own():
    """EARS_VLLM_RULE=standard makes the same decisions as vLLM unpatched (and as beta = 0)."""
    gen = torch.Generator().manual_seed(7)
    for with_draft in (True, False):
        ks, target_all, draft_probs, draft_tokens, u = _case(gen, 32, 20, with_draft)
        target_probs = target_all[: sum(ks)].contiguous()
        bonus = torch.randint(0, 20, (32,), generator=gen)
        ears_vllm.configure(None)
        plain, rec = _vllm_decide(ks, target_probs, draft_probs, draft_tokens, u, bonus)
        ears_vllm.configure("standard")
        std, rec2 = _vllm_decide(ks, target_probs, draft_probs, draft_tokens, u, bonus)
        ears_vllm.configure("ears", 0.0)
        zero, _ = _vllm_decide(ks, target_probs, draft_probs, draft_tokens, u, bonus)
        # the recovered draws are unseeded: compare the accepted counts and the accepted prefixes
        lengths = [(row != -1).sum().item() for row in plain]
        assert lengths == [(row != -1).sum().item() for row in std] == [(row != -1).sum().item() for row in zero]


def test_recovered_distribution():
    """vLLM's recovered token after a rejection follows ears_core's residual (TV < 0.03 over 20,000 draws)."""
    gen = torch.Generator().manual_seed(3)
    vocab, draws = 8, 20000
    target = torch.softmax(torch.randn(vocab, generator=gen), dim=-1)
    draft = torch.softmax(torch.randn(vocab, generator=gen), dim=-1)
    for with_draft in (True, False):
        ks = [1] * draws
        tp = target.expand(draws, vocab).contiguous()
        dp = draft.expand(draws, vocab).contiguous() if with_draft else None
        dt = torch.full((draws,), 2, dtype=torch.int32)
        cu = torch.arange(1, draws + 1, dtype=torch.int32)
        rec = rs.sample_recovered_tokens(1, ks, cu, dt, dp, tp, types.SimpleNamespace(generators={}),
                                         torch.device("cpu"))
        freq = torch.bincount(rec.to(torch.long), minlength=vocab).to(torch.float32) / draws
        q = draft if with_draft else torch.nn.functional.one_hot(torch.tensor(2), vocab).to(torch.float32)
        res = StandardRule().residual(target, q)
        assert 0.5 * (freq - res).abs().sum() < 0.03


def test_tolerance_matches_ears_rule():
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(64, 50, generator=gen), dim=-1)
    for beta in (0.1, 0.5):
        mine = ears_vllm.tolerance(ears_vllm.RuleConfig("ears", beta), probs)
        lib = EARSRule(beta).tolerance(probs.unsqueeze(1), probs.amax(-1).unsqueeze(1)).squeeze(1)
        assert torch.equal(mine, lib)


def test_entropy_tolerance_matches_library():
    import ears_core

    rule_cls = getattr(ears_core, "EntropyEARSRule", None)
    if rule_cls is None:
        pytest.skip("ears_core no longer exports EntropyEARSRule at the top level")
    gen = torch.Generator().manual_seed(6)
    probs = torch.softmax(torch.randn(64, 50, generator=gen), dim=-1)
    mine = ears_vllm.tolerance(ears_vllm.RuleConfig("ears-entropy", 0.2), probs)
    lib = rule_cls(0.2).tolerance(probs.unsqueeze(1), probs.amax(-1).unsqueeze(1)).squeeze(1)
    assert torch.allclose(mine, lib, rtol=0, atol=1e-7)
