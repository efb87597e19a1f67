"""verify() against a plain reference loop written here, on scripted uniform draws."""

import pytest
import torch

from ears_core import DraftKind, EARSRule, GreedyRule, StandardRule, verify


def random_case(b, k, v, seed, sparse=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.softmax(3 * torch.randn(b, k + 1, v, generator=g), -1)
    # The draft is the target's logits plus noise: every row length from 0 to K occurs.
    d = torch.softmax(t[:, :k].log() + 1.5 * torch.randn(b, k, v, generator=g), -1)
    if sparse:  # zero out some target mass, as top-k would
        t = t * (torch.rand(b, k + 1, v, generator=g) > 0.3)
        t = t / t.sum(-1, keepdim=True)
    tokens = torch.multinomial(d.reshape(-1, v), 1, generator=g).reshape(b, k)
    u = torch.rand(b, k, generator=g)
    su = torch.rand(b, generator=g)
    return t, d, tokens, u, su


def reference(t, d, tokens, u, su, rule):
    """One row at a time, one position at a time, in float64 Python."""
    b, k = tokens.shape
    out = []
    for row in range(b):
        kinds, n = [], None
        for i in range(k):
            x = int(tokens[row, i])
            p, q = float(t[row, i, x]), float(d[row, i, x])
            m = float(t[row, i].max())
            if isinstance(rule, GreedyRule):
                ok_std, ok_all = x == int(t[row, i].argmax()), x == int(t[row, i].argmax())
            else:
                tol = rule.beta * (1 - m) if isinstance(rule, EARSRule) else 0.0
                r = p / max(q, 1e-10)
                ok_std = p > 0 and r >= float(u[row, i])
                ok_all = p > 0 and r >= max(float(u[row, i]) - tol, 0.0)
            if ok_std:
                kinds.append(DraftKind.ACCEPTED)
            elif ok_all:
                kinds.append(DraftKind.PARDONED)
            else:
                kinds.append(DraftKind.REJECTED)
                n = i
                break
        if n is None:
            n = k
            dist = t[row, k].double()
        else:
            res = (t[row, n].double() - d[row, n].double()).clamp(min=0)
            dist = res / res.sum() if res.sum() > 1e-6 else t[row, n].double()
        if isinstance(rule, GreedyRule):
            nxt = int(t[row, n].argmax())
        else:
            cdf = dist.cumsum(0)
            nxt = int((cdf <= float(su[row]) * float(cdf[-1])).sum())
        kinds += [DraftKind.NOT_EVALUATED] * (k - len(kinds))
        out.append((n, [int(c) for c in kinds], nxt))
    return out


@pytest.mark.parametrize("rule", [StandardRule(), EARSRule(0.1), EARSRule(0.5), GreedyRule()], ids=repr)
@pytest.mark.parametrize("k, sparse", [(1, False), (4, False), (6, True), (8, True)])
def test_verify_matches_the_reference_loop(rule, k, sparse):
    t, d, tokens, u, su = random_case(64, k, 12, seed=k * 10 + sparse, sparse=sparse)
    v = verify(t, d, tokens, rule, uniforms=u, sample_uniforms=su)
    ref = reference(t, d, tokens, u, su, rule)
    assert v.num_accepted.tolist() == [r[0] for r in ref]
    assert v.kinds.tolist() == [r[1] for r in ref]
    assert v.next_token.tolist() == [r[2] for r in ref]
    # The cases exercise short, long and complete rows, not just one outcome.
    assert len(set(v.num_accepted.tolist())) >= min(k + 1, 3)


def test_some_rows_are_pardoned_and_none_is_pardoned_by_the_ordinary_rule():
    t, d, tokens, u, su = random_case(256, 4, 12, seed=99)
    ears = verify(t, d, tokens, EARSRule(0.5), uniforms=u, sample_uniforms=su)
    std = verify(t, d, tokens, StandardRule(), uniforms=u, sample_uniforms=su)
    assert (ears.kinds == DraftKind.PARDONED).sum() > 0
    assert (std.kinds == DraftKind.PARDONED).sum() == 0
    # EARS accepts a superset: it never stops earlier than the ordinary rule on the same draws.
    assert bool((ears.num_accepted >= std.num_accepted).all())


def test_beta_zero_is_the_ordinary_rule_draw_for_draw():
    t, d, tokens, _, _ = random_case(512, 5, 20, seed=5)
    a = verify(t, d, tokens, EARSRule(0.0), generator=torch.Generator().manual_seed(11), with_distortion=True)
    b = verify(t, d, tokens, StandardRule(), generator=torch.Generator().manual_seed(11), with_distortion=True)
    for field in ("num_accepted", "next_token", "kinds", "u", "ratio"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert torch.equal(a.distortion, b.distortion)
