"""The EAGLE-style draft head: plumbing of the target's hidden states, cache alignment, files."""

import pytest
import torch

from conftest import PROMPTS, tiny_llama
from ears_core import EARSRule, GreedyRule, generate, stream
from ears_core.draft.eagle import DraftHead, EagleDrafter, head_config_from_target


@pytest.fixture(scope="module")
def target_and_head():
    target = tiny_llama(0, vocab=96)
    torch.manual_seed(5)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2)).eval()  # even ids only
    return target, head


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                          pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_is_the_targets_with_a_head_draft(target_and_head, k):
    target, head = target_and_head
    for prompt in PROMPTS:  # PROMPTS[3] has one token: the first round has no feature to draft from
        out = generate(target, EagleDrafter(head, target), prompt, rule=GreedyRule(), k=k, temperature=0,
                       max_new_tokens=30)
        assert out.token_ids == hf_greedy(target, prompt, 30)


def test_the_head_proposes_only_its_vocabulary(target_and_head):
    target, head = target_and_head
    out = generate(target, EagleDrafter(head, target), PROMPTS[2], rule=EARSRule(0.2), k=4, temperature=1.0,
                   max_new_tokens=40, seed=1)
    drafted = [d for s in out.steps for d in s.drafts]
    assert drafted and all(d.token_id % 2 == 0 for d in drafted)


def test_incremental_head_state_equals_a_full_recompute(target_and_head):
    # After rounds of drafting, rollback and commits, the head's next prediction must equal the
    # head run once over the whole committed sequence with the target's true features.
    target, head = target_and_head
    drafter = EagleDrafter(head, target)
    gen = stream(target, drafter, PROMPTS[2], rule=EARSRule(0.3), k=3, temperature=1.0, max_new_tokens=25, seed=4)
    res = gen.result()
    assert any(s.accepted < s.drafted for s in res.steps) and any(s.accepted > 0 for s in res.steps)
    seq = torch.tensor([PROMPTS[2] + res.token_ids])  # (1, L+1)
    with torch.no_grad():
        feats = target(seq[:, :-1], output_hidden_states=True).hidden_states[-1]  # f_0 .. f_{L-1}
        full = head(feats, target.get_input_embeddings()(seq[:, 1:]))  # entries (f_j, x_{j+1})
    assert drafter._s.pending  # the last round's entries wait for the next draft (one batched forward)
    drafter.sync()
    assert drafter._s.cache_len == seq.shape[1] - 1 and not drafter._s.pending
    assert torch.allclose(drafter._s.next_feat, full[:, -1], atol=1e-4)


def test_rounds_without_drafts_are_fed_to_the_head_in_one_batch(target_and_head):
    # Plain target steps (k = 0) only queue their entries; the next proposal feeds them at once and
    # drafts exactly what a head fed one round at a time would.
    target, head = target_and_head
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[-1]  # (1, T, d)
    lazy, eager = EagleDrafter(head, target), EagleDrafter(head, target)
    for d in (lazy, eager):
        d.prefill(ids[:, :4], h[:, :3])
    u = torch.full((1, 2), 0.5)
    probs_fn = lambda logits: torch.softmax(logits, -1)  # noqa: E731
    for t in range(4, ids.shape[1]):  # one committed token per round, nothing drafted
        lazy.commit(0, ids[:, t], h[:, t - 1 : t])
        eager.commit(0, ids[:, t], h[:, t - 1 : t])
        eager.sync()
    assert len(lazy._s.pending) == ids.shape[1] - 4
    a, pa = lazy.propose(2, probs_fn, u)
    b, pb = eager.propose(2, probs_fn, u)
    assert torch.equal(a, b) and torch.allclose(pa, pb, atol=1e-5) and lazy._s.cache_len == eager._s.cache_len


def test_save_and_load_round_trip(tmp_path, target_and_head):
    target, head = target_and_head
    head.save(tmp_path / "h", meta={"note": "test"})
    back = DraftHead.load(tmp_path / "h")
    assert torch.equal(back.vocab_ids, head.vocab_ids)
    x, e = torch.randn(1, 5, 32), torch.randn(1, 5, 32)
    with torch.no_grad():  # stored in bfloat16: close, not equal
        assert torch.allclose(back(x, e), head(x, e), atol=0.1)
    from safetensors.torch import load_file

    assert not any("embed_tokens" in k for k in load_file(str(tmp_path / "h" / "head.safetensors")))


def test_fresh_drafters_share_weights_not_state(target_and_head):
    target, head = target_and_head
    a = EagleDrafter(head, target)
    gen = stream(target, a, PROMPTS[0], k=3, temperature=0.9, max_new_tokens=6)
    next(gen)
    b = a.fresh()
    assert b.head is a.head and b.w_sub is a.w_sub and b._s is None and a._s is not None


def test_the_draft_length_policy_stops_before_drawing_and_stays_exact(target_and_head):
    from ears_core.policy.costs import Calibration, DraftPolicy, PriceCurve

    target, head = target_and_head
    prompt, kw = PROMPTS[2], dict(rule=GreedyRule(), k=4, temperature=0, max_new_tokens=30)
    expected = hf_greedy(target, prompt, 30)
    plain = generate(target, EagleDrafter(head, target), prompt, **kw)
    cheap = PriceCurve([10.0] * 5, 0.0, 0.0)  # drafting and verifying are free: every round drafts K
    every = generate(target, EagleDrafter(head, target), prompt, policy=DraftPolicy(cheap, 4),
                     calibration=Calibration(), **kw)
    assert every.token_ids == expected and [s.drafted for s in every.steps] == [s.drafted for s in plain.steps]
    dear = PriceCurve([10.0 * m for m in range(1, 6)], 1.0, 0.0)  # verifying never pays
    never = generate(target, EagleDrafter(head, target), prompt, policy=DraftPolicy(dear, 4),
                     calibration=Calibration(), **kw)
    assert never.token_ids == expected
    assert sum(s.drafted for s in never.steps) == 0 and {e.kind for e in never.events} == {"target"}
    mixed = []  # curves where some rounds stop early and some draft all K
    for slope in (0.05, 0.1, 0.2, 0.3, 0.5):
        curve = PriceCurve([10.0 + slope * 10 * (m - 1) for m in range(1, 6)], 0.5, 0.0)
        d = EagleDrafter(head, target)
        out = generate(target, d, prompt, policy=DraftPolicy(curve, 4), calibration=Calibration(), **kw)
        assert out.token_ids == expected
        assert all(len(s.estimates) == s.drafted for s in out.steps)
        if len({s.drafted for s in out.steps[1:]}) > 1:
            mixed.append(slope)
    assert mixed


def test_a_depth_that_would_not_pay_on_average_is_never_computed(target_and_head):
    """keep(None): before the head computes draft 2, the policy asks whether an average draft at depth
    2 would pay; where depth 2's drafts never stand the round stops without that head step, and the
    output is unchanged."""
    from ears_core.policy.costs import Calibration, DepthCalibration, DraftPolicy, PriceCurve

    target, head = target_and_head
    prompt, kw = PROMPTS[2], dict(rule=GreedyRule(), k=4, temperature=0, max_new_tokens=30)
    first = Calibration(bins=10, stood=[1e6] * 10, seen=[1e6] * 10)  # a first draft always stands
    hopeless = Calibration(bins=10, stood=[0.0] * 10, seen=[1e6] * 10)  # a later one never does
    curve = PriceCurve([10.0, 10.5, 11.0, 11.5, 12.0], 0.5, 0.0)

    def run(mean_of_depth_2):
        cal = DepthCalibration([first, hopeless])
        cal.means = lambda k: [1.0] + [mean_of_depth_2] * (k - 1)  # what keep(None) and the priors read
        d = EagleDrafter(head, target)
        calls = []
        inner = d._head
        d._head = lambda feats, tokens: calls.append(feats.shape[1]) or inner(feats, tokens)
        out = generate(target, d, prompt, policy=DraftPolicy(curve, 4), calibration=cal, **kw)
        return out, len(calls)

    skipped, n_skipped = run(hopeless.mean())
    computed, n_computed = run(1.0)  # told depth 2 pays on average: the head computes it, then the policy declines
    assert skipped.token_ids == computed.token_ids == hf_greedy(target, prompt, 30)
    assert {s.drafted for s in skipped.steps} <= {0, 1} and {s.drafted for s in computed.steps} <= {0, 1}
    drafting_rounds = sum(1 for s in computed.steps if s.drafted)
    assert drafting_rounds > 3 and n_computed - n_skipped >= drafting_rounds - 1


@pytest.fixture(scope="module")
def target_and_fused_head():
    """A head reading three of the target's hidden states (EAGLE-3's fusion): layer 1, the
    embeddings and the final one."""
    target = tiny_llama(0, vocab=96)
    torch.manual_seed(6)
    head = DraftHead(head_config_from_target(target.config), torch.arange(0, 96, 2), feature_layers=(1, 0, -1)).eval()
    return target, head


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_output_is_the_targets_with_a_fused_head(target_and_fused_head, k):
    target, head = target_and_fused_head
    assert head.fc.in_features == 4 * target.config.hidden_size
    for prompt in PROMPTS:
        out = generate(target, EagleDrafter(head, target), prompt, rule=GreedyRule(), k=k, temperature=0,
                       max_new_tokens=24)
        assert out.token_ids == hf_greedy(target, prompt, 24)


def test_a_fused_head_reads_its_layers_and_zeros_for_predicted_features(target_and_fused_head):
    # The incremental state after rounds equals one run over the committed sequence with the
    # three layers side by side; a d-wide (predicted) input reads as zeros for the lower layers.
    target, head = target_and_fused_head
    drafter = EagleDrafter(head, target)
    res = stream(target, drafter, PROMPTS[2], rule=EARSRule(0.3), k=3, temperature=1.0, max_new_tokens=20,
                 seed=2).result()
    assert any(s.accepted > 0 for s in res.steps)
    seq = torch.tensor([PROMPTS[2] + res.token_ids])
    with torch.no_grad():
        hs = target(seq[:, :-1], output_hidden_states=True).hidden_states
        feats = torch.cat([hs[1], hs[0], hs[-1]], dim=-1)  # (1, L, 3d)
        full = head(feats, target.get_input_embeddings()(seq[:, 1:]))
        drafter.sync()
        assert torch.allclose(drafter._s.next_feat, full[:, -1], atol=1e-4)
        d = target.config.hidden_size
        f, e = hs[-1][:, :3], target.get_input_embeddings()(seq[:, 1:4])
        padded = torch.cat([torch.zeros(1, 3, 2 * d), f], dim=-1)
        assert torch.allclose(head.inputs(f, e), head.inputs(padded, e))
        assert not torch.allclose(head.inputs(feats[:, :3], e), head.inputs(padded, e))


def test_a_fused_head_round_trips_its_layers(tmp_path, target_and_fused_head):
    _, head = target_and_fused_head
    head.save(tmp_path / "h")
    back = DraftHead.load(tmp_path / "h")
    assert back.feature_layers == (1, 0, -1) and back.fc.in_features == head.fc.in_features


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.9), dict(temperature=1.3, top_k=5),
                                      dict(temperature=0.7, top_p=0.8)])
def test_drafting_on_the_heads_tokens_draws_what_drafting_over_the_vocabulary_does(target_and_head, sampling):
    # A chain's draft step samples on the head's N tokens and widens once; it must draw the same
    # tokens from the same distributions as sampling over all V tokens with -inf elsewhere, also
    # for a head whose vocabulary is stored out of order (the drafter sorts it).
    from ears_core.sampling import SamplingConfig, logits_to_probs

    target, head = target_and_head
    shuffled = DraftHead(head.config, head.vocab_ids)
    shuffled.load_state_dict(head.state_dict())
    shuffled.vocab_ids = head.vocab_ids[torch.randperm(len(head.vocab_ids), generator=torch.Generator().manual_seed(3))]
    cfg = SamplingConfig(**sampling)
    probs_fn = lambda logits: logits_to_probs(logits[..., :96], cfg)  # noqa: E731  (as decoding's)
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[-1]  # (1, T, d)
    fast, slow = EagleDrafter(shuffled.eval(), target), EagleDrafter(shuffled.eval(), target)
    slow._n_space = False
    assert fast._n_space and bool((fast.vocab_ids[1:] > fast.vocab_ids[:-1]).all())
    gen = torch.Generator().manual_seed(0)
    for t in range(4, ids.shape[1]):
        for d in (fast, slow):
            d.prefill(ids[:, :t], h[:, : t - 1])
        u = torch.rand(1, 4, generator=gen)
        a, pa = fast.propose(4, probs_fn, u)
        b, pb = slow.propose(4, probs_fn, u)
        assert torch.equal(a, b) and pa.shape == pb.shape == (1, 4, 96)
        assert torch.allclose(pa, pb, atol=1e-6) and bool((pa[..., 1::2] == 0).all())


def scaled_copy(head, tau):
    other = DraftHead(head.config, head.vocab_ids)
    other.load_state_dict(head.state_dict())
    other.temperature_scale = tau
    return other.eval()


def test_a_temperature_scale_draws_chain_drafts_at_t_times_tau_with_raw_confidence(target_and_head):
    """tau = 0.5 at T = 0.9 must draw the tokens, and hand the rule the q, that tau = 1 draws at T = 0.45;
    the confidence the policy reads stays the raw T = 1 value; greedy output stays the target's."""
    from ears_core.sampling import SamplingConfig, logits_to_probs

    target, head = target_and_head
    ids = torch.tensor([PROMPTS[2] + PROMPTS[0]])  # 13 tokens: 9 drafting positions
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[-1]  # (1, T, d)
    fns = {t: (lambda cfg: lambda logits: logits_to_probs(logits[..., :96], cfg))(SamplingConfig(temperature=t))
           for t in (0.9, 0.45)}
    sharp, plain = EagleDrafter(scaled_copy(head, 0.5), target), EagleDrafter(head, target)
    assert sharp.tau == 0.5 and plain.tau == 1.0
    gen, differs = torch.Generator().manual_seed(0), 0
    for t in range(4, ids.shape[1]):
        confs = {}
        u = torch.rand(1, 3, generator=gen)
        out = {}
        for name, d, fn in (("sharp", sharp, fns[0.9]), ("plain", plain, fns[0.45]), ("at 0.9", plain, fns[0.9])):
            d.prefill(ids[:, :t], h[:, : t - 1])
            seen = []
            out[name] = d.propose(3, fn, u, keep=lambda c: seen.append(c) or True)
            confs[name] = seen
        assert torch.equal(out["sharp"][0], out["plain"][0]) and torch.allclose(out["sharp"][1], out["plain"][1], atol=1e-6)
        assert confs["sharp"] == confs["plain"] and confs["sharp"][0] == confs["at 0.9"][0]  # later: other tokens
        differs += not torch.allclose(out["sharp"][1], out["at 0.9"][1], atol=1e-3)
    assert differs == ids.shape[1] - 4 == 9  # tau is not ignored
    prompt = PROMPTS[2]
    out = generate(target, EagleDrafter(scaled_copy(head, 0.5), target), prompt, rule=GreedyRule(), k=3,
                   temperature=0, max_new_tokens=20)
    assert out.token_ids == hf_greedy(target, prompt, 20)


def test_a_temperature_scale_draws_tree_drafts_at_t_times_tau_and_ranks_raw(target_and_head):
    from ears_core.sampling import SamplingConfig, logits_to_probs
    from ears_core.draft.trees import TreeDraws, TreeSpec

    target, head = target_and_head
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[-1]
    rank_fn = lambda logits: torch.softmax(logits[..., :96].float(), dim=-1)  # noqa: E731
    spec = TreeSpec(8, 3)
    trees = []
    for tau, t in ((0.5, 0.9), (1.0, 0.45), (1.0, 0.9)):
        d = EagleDrafter(scaled_copy(head, tau), target)
        d.prefill(ids, h[:, :-1])
        cfg = SamplingConfig(temperature=t)
        trees.append(d.propose_tree(spec, lambda logits: logits_to_probs(logits[..., :96], cfg),
                                    TreeDraws(7, ids.shape[1], spec.branching), rank_fn=rank_fn))
    sharp, plain, hot = trees
    assert torch.equal(sharp.tokens, plain.tokens) and sharp.parents == plain.parents
    assert torch.allclose(sharp.draft_probs, plain.draft_probs, atol=1e-6)
    assert not torch.allclose(sharp.draft_probs, hot.draft_probs, atol=1e-3)


def test_the_temperature_scale_round_trips_and_a_bad_one_is_refused(tmp_path, target_and_head):
    import json

    _, head = target_and_head
    scaled_copy(head, 0.8).save(tmp_path / "h")
    assert DraftHead.load(tmp_path / "h").temperature_scale == 0.8
    head.save(tmp_path / "old")
    info = json.loads((tmp_path / "old" / "head.json").read_text())
    del info["temperature_scale"]  # a head saved before the field existed
    (tmp_path / "old" / "head.json").write_text(json.dumps(info))
    assert DraftHead.load(tmp_path / "old").temperature_scale == 1.0
    info["temperature_scale"] = 0
    (tmp_path / "old" / "head.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="temperature_scale must be > 0"):
        DraftHead.load(tmp_path / "old")


def bf16_copy(head):
    other = DraftHead(head.config, head.vocab_ids)
    other.load_state_dict(head.state_dict())
    return other.to(torch.bfloat16).eval()


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_bfloat16_head_drafts_for_a_float32_target_and_greedy_stays_the_targets(target_and_head, shape):
    from ears_core.decode.api import tree_generate

    target, head = target_and_head
    d = EagleDrafter(bf16_copy(head), target)
    assert d.dtype == torch.bfloat16 and d.w_sub.dtype == torch.bfloat16
    for prompt in PROMPTS[:3]:
        if shape == "chain":
            out = generate(target, d, prompt, rule=GreedyRule(), k=3, temperature=0, max_new_tokens=20)
        else:
            out = tree_generate(target, d, prompt, rule=GreedyRule(), depth=3, budget=6, temperature=0,
                                max_new_tokens=20)
        assert out.token_ids == hf_greedy(target, prompt, 20)
        assert sum(s.drafted for s in out.steps) > 0


def test_a_bfloat16_heads_drafts_are_drawn_from_the_float32_q_it_returns(target_and_head):
    # What keeps every rule exact: q is the distribution each draft was drawn from. The head computes
    # in bfloat16, its logits come back as float32, and the draws use them.
    from ears_core.sampling import SamplingConfig, logits_to_probs, sample_with_uniforms

    target, head = target_and_head
    probs_fn = lambda logits: logits_to_probs(logits[..., :96], SamplingConfig(temperature=0.9))  # noqa: E731
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[-1]  # (1, T, d) float32
    d = EagleDrafter(bf16_copy(head), target)
    gen = torch.Generator().manual_seed(1)
    for t in range(3, ids.shape[1]):
        d.prefill(ids[:, :t], h[:, : t - 1])
        u = torch.rand(1, 4, generator=gen)
        tokens, q = d.propose(4, probs_fn, u)
        assert q.dtype == torch.float32 and torch.allclose(q.sum(-1), torch.ones(1, 4), atol=1e-5)
        assert bool((q[..., 1::2] == 0).all())  # only the head's (even) tokens
        assert torch.equal(sample_with_uniforms(q[0], u[0]), tokens[0])
