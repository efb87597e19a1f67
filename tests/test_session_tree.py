"""session: a tree run through RunConfig / Session / summary_rows / run_record, and the CLI flags."""
from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, stand_in_for
from ears_core.policy.costs import PriceCurve
from ears_core.draft.drafters import NGramDrafter
from ears_core.pair import ModelPair
from ears_core.serve.session import RunConfig, Session
from ears_core.serve.summary import run_record, summary_rows, summary_text

PRICES = PriceCurve([10.0, 10.4, 10.8, 11.4, 12.2, 13.4, 15.0, 17.0, 19.5], 0.4, 0.3, measured_at="test")


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture()
def session(tiny_pair, tmp_path):
    target, draft = tiny_pair
    pair = ModelPair(target, draft, None, torch.device("cpu"), torch.float32, "tiny", 96, "tiny-draft")
    return Session(pair, prices=PRICES, cache_dir=tmp_path)  # a profile measured again goes to tmp_path


def run(session, ids, cfg):
    tracked = session.speculative(torch.tensor([ids]), cfg)
    for _ in tracked:  # through Tracked: the session learns from the run when it ends
        pass
    return tracked.gen


@pytest.mark.parametrize("kw, needle", [
    (dict(draft_shape="bush"), "draft shape must be one of auto, chain, tree"),
    (dict(tree_budget=0), "tree budget .* from 1 to 16"),  # "auto" with the policy may become a tree
    (dict(draft_shape="tree", tree_budget=0), "tree budget .* from 1 to 16"),
    (dict(draft_shape="tree", tree_budget=17), "tree budget .* from 1 to 16"),
    (dict(draft_shape="tree", tree_budget=True), "tree budget"),
    (dict(draft_shape="tree", tree_width=0), "tree width"),
    (dict(draft_shape="tree", draft_length="threshold"), "threshold draft length is for chains"),
])
def test_bad_tree_settings_are_refused_with_the_fix(kw, needle):
    with pytest.raises(ValueError, match=needle):
        RunConfig(**kw).validate()
    RunConfig(draft_length="threshold", tree_budget=0).validate()  # a chain ignores the tree's settings


def test_a_greedy_tree_run_with_the_cost_budget_is_the_targets_greedy_output(session, tiny_pair):
    target, _ = tiny_pair
    cfg = RunConfig(rule="greedy", params={}, temperature=0, k=5, max_new_tokens=40, draft_shape="tree",
                    tree_budget=12)
    before = list(session.prices.verify_ms), session.prices.draft_ms
    gen = run(session, PROMPTS[2], cfg)
    assert [e.token_id for e in gen.events] == hf_greedy(target, PROMPTS[2], 40)
    assert "tree(budget=12, depth=5" in gen.method and len(gen.trees) == len(gen.steps)
    sizes = [s.drafted for s in gen.steps]
    assert len(set(sizes)) >= 2 and max(sizes) <= 12  # sized per round by the cost model
    assert any(s.expected is not None for s in gen.steps)
    # the run taught the session: a tree calibration apart from the chain's, verify prices only
    assert ("greedy", 0.0, "tree") in session._calibrations and ("greedy", 0.0) not in session._calibrations
    learnt = session.prices  # (the tiny pair's steps are faster: folded in, never measured again here)
    assert learnt.draft_ms == before[1] and learnt.verify_ms != before[0]

    stats = gen.stats()
    rows = dict(summary_rows(stats, shape="tree"))
    assert rows["draft shape"].startswith(f"tree: {stats.drafted / stats.steps:.2f} nodes per round")
    assert rows["mean accepted per round"].startswith(f"{stats.accepted / stats.steps:.2f}")
    assert "nodes stood" in rows["acceptance rate"] and "drafted a tree" in rows["speedup, theory S = E/(kc+1)"]
    assert "tree" not in dict(summary_rows(stats))["draft shape"]  # a chain's rows by default
    assert "mean accepted per round" in summary_text(summary_rows(stats, shape="tree"))

    rec = run_record(gen.result(), cfg, prompt="p", model="m", device="cpu", trees=gen.trees)
    assert rec["settings"]["draft_shape"] == "tree" and rec["settings"]["tree_budget"] == 12
    assert len(rec["trees"]) == stats.steps and rec["trees"][0]["tokens"] == gen.trees[0].tokens


def test_a_fixed_budget_drafts_that_many_nodes_every_round(session):
    cfg = RunConfig(rule="ears", params={"beta": 0.2}, temperature=0.9, k=3, max_new_tokens=30,
                    draft_length="fixed", draft_shape="tree", tree_budget=5, tree_width=2, seed=3)
    gen = run(session, PROMPTS[0], cfg)
    full = [s.drafted for s in gen.steps if sum(x.emitted for x in gen.steps[: s.step]) <= 26]
    assert full and set(full) == {5}  # every round with room for two levels drafts exactly 5 nodes
    assert all(sum(1 for p in tr.parents if p == q) <= 2 for tr in gen.trees for q in set(tr.parents))  # width 2
    # the same seed gives the same tokens through the session as tree_generate
    again = run(session, PROMPTS[0], cfg)
    assert [e.token_id for e in again.events] == [e.token_id for e in gen.events]


def test_a_draft_without_a_distribution_cannot_draft_a_tree(tiny_pair):
    target, _ = tiny_pair
    pair = ModelPair(target, NGramDrafter(96), None, torch.device("cpu"), torch.float32, "tiny", 96, "ngram")
    with pytest.raises(ValueError, match="ngram cannot draft a tree .* choose the chain draft shape"):
        Session(pair, prices=PRICES).speculative(torch.tensor([PROMPTS[0]]), RunConfig(draft_shape="tree"))


def test_the_cli_takes_the_tree_flags(capsys):
    from ears_core.cli import build_parser, config_from_args, main

    cfg = config_from_args(build_parser().parse_args(["--tree", "--tree-budget", "6", "--tree-width", "2", "-K", "3"]))
    assert (cfg.draft_shape, cfg.tree_budget, cfg.tree_width, cfg.k) == ("tree", 6, 2, 3)
    assert config_from_args(build_parser().parse_args([])).draft_shape == "auto"
    assert config_from_args(build_parser().parse_args(["--chain"])).draft_shape == "chain"
    assert config_from_args(build_parser().parse_args(["--shape", "tree"])).draft_shape == "tree"
    with pytest.raises(SystemExit):  # one shape at a time
        build_parser().parse_args(["--tree", "--chain"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--tree" in text and "--tree-budget" in text and "--tree-width" in text and "--shape" in text
    assert main(["--tree", "--tree-budget", "40", "--no-baseline"]) == 2  # refused before any model loads
    assert "tree budget (nodes per round) must be a whole number from 1 to 16" in capsys.readouterr().err


@pytest.mark.parametrize("kw, shape", [
    (dict(temperature=0), "tree"),  # greedy with the policy and a draft model that can branch
    (dict(rule="greedy", params={}), "tree"),  # the greedy rule is T = 0 at any temperature asked
    (dict(), "chain"),  # EARS at T = 0.9: its tree was 2-3 % behind its chain
    (dict(rule="standard", params={}), "tree"),  # the ordinary rule at T = 0.9: the tree was ahead
    (dict(rule="ears", params={"beta": 0.0}), "tree"),  # EARS at beta 0 is the ordinary rule
    (dict(rule="standard", params={}, draft_length="fixed"), "chain"),
    (dict(temperature=0, draft_length="fixed"), "chain"),  # fixed K means K drafts in a row
    (dict(temperature=0, draft_length="threshold"), "chain"),
    (dict(draft_shape="chain", temperature=0), "chain"),
    (dict(draft_shape="tree", draft_length="fixed"), "tree"),
    (dict(rule="fly", params={}), "chain"),  # a tree would judge FLy as the ordinary rule
    (dict(rule="ears-budget", params={}), "chain"),  # a tree never updates its beta
    (dict(rule="fly", params={}, temperature=0), "tree"),  # T = 0: the greedy rule, whatever was asked
])
def test_auto_resolves_to_a_tree_only_where_a_tree_runs_the_request_as_asked(session, kw, shape):
    cfg = RunConfig(**kw)
    assert cfg.draft_shape == kw.get("draft_shape", "auto")
    resolved = session.resolved(cfg)
    assert resolved.draft_shape == shape and resolved.rule == cfg.rule and resolved.k == cfg.k
    assert session.resolved(resolved) == resolved


def test_auto_runs_a_tree_and_greedy_auto_is_the_targets_greedy_output(session, tiny_pair):
    target, _ = tiny_pair
    gen = run(session, PROMPTS[1], RunConfig(rule="greedy", params={}, temperature=0, k=4, max_new_tokens=32))
    assert "tree(" in gen.method and len(gen.trees) == len(gen.steps)
    assert [e.token_id for e in gen.events] == hf_greedy(target, PROMPTS[1], 32)


def test_auto_is_a_chain_for_a_draft_without_a_distribution(tiny_pair):
    target, _ = tiny_pair
    pair = ModelPair(target, NGramDrafter(96), None, torch.device("cpu"), torch.float32, "tiny", 96, "ngram")
    session = Session(pair, prices=PRICES)
    assert session.resolved(RunConfig()).draft_shape == "chain"
    gen = run(session, PROMPTS[0], RunConfig(max_new_tokens=12))
    assert "tree(" not in gen.method and not getattr(gen, "trees", None)


def test_warm_up_measures_the_prices_again_unless_the_caller_gave_them(tiny_pair, tmp_path, monkeypatch):
    """A cached profile is only a start: warm_up measures this machine again (its curve moves in a
    day), and that fresh curve is the one the session's policy reads: at once, or with
    background_prices between requests, in a thread of its own after the warm-up's decodes (the
    warm-up itself reads the cached profile). A curve given is kept."""
    import itertools
    import threading

    import ears_core.policy.profile as costs
    from ears_core.serve.runs import ActivityLog
    target, draft = tiny_pair
    pair = ModelPair(target, draft, None, torch.device("cpu"), torch.float32, "tiny", 96, "tiny-draft")
    curves = itertools.chain([PriceCurve([10.0] * 9, 0.4, measured_at="cached"),
                              PriceCurve([11.0 + m for m in range(9)], 0.4, measured_at="fresh")],
                             itertools.repeat(PriceCurve([12.0 + m for m in range(9)], 0.4, measured_at="between requests")))
    threads = []

    def measure(model, *a, **k):
        threads.append(threading.current_thread().name)
        return next(curves)

    monkeypatch.setattr(costs, "measure_prices", stand_in_for(target, measure))
    Session(pair, cache_dir=tmp_path).prices  # noqa: B018  (writes the "cached" profile)
    fresh = Session(pair, cache_dir=tmp_path)
    assert fresh.prices.measured_at == "cached"
    monkeypatch.setattr(Session, "encode", lambda self, prompt, chat=True: torch.tensor([PROMPTS[0]]))
    fresh.warm_up(4)
    assert fresh.prices.verify_ms[4:] == [15.0 + m for m in range(5)]  # m >= 5: as measured (the run moves m <= 3)
    served = Session(pair, ActivityLog(), cache_dir=tmp_path, background_prices=True)  # its own: no other test's decodes
    served.warm_up(4)
    assert served.pricing.wait(60) and threads[-1] == "ears-prices"  # measured in the background, not in warm_up
    assert served.prices.measured_at == "between requests" and served.prices.verify_ms == [12.0 + m for m in range(9)]
    measured = len(threads)
    given = Session(pair, ActivityLog(), prices=PRICES, cache_dir=tmp_path, background_prices=True)
    given.warm_up(4)
    assert not given.pricing.pending and given.prices.verify_ms[3:] == PRICES.verify_ms[3:]
    assert len(threads) == measured  # a curve given is not measured again
    served.close()


def test_auto_is_a_chain_where_a_wide_verify_pass_is_dear(tiny_pair, tmp_path):
    # A machine whose pass over 5 tokens costs 1.5 steps (an Intel Xeon here: 1.00 / 1.04 / 1.10 /
    # 1.45 / 1.53): the cost-model tree lost to the chain policy there, so "auto" drafts a chain.
    from ears_core.serve.session import TREE_MAX_STEPS, TREE_WIDTH_M

    target, draft = tiny_pair
    pair = ModelPair(target, draft, None, torch.device("cpu"), torch.float32, "tiny", 96, "tiny-draft")
    steep = PriceCurve([10.0, 10.4, 11.0, 14.5, 15.3, 15.5, 16.9, 16.9, 17.8], 0.4, 0.3, measured_at="test")
    flat = PriceCurve([10.0, 10.4, 11.0, 11.5, 10.0 * TREE_MAX_STEPS, 15.5, 16.9, 16.9, 17.8], 0.4, 0.3, measured_at="test")
    assert steep.steps(TREE_WIDTH_M) > TREE_MAX_STEPS
    for curve, shape in ((steep, "chain"), (flat, "tree")):
        session = Session(pair, prices=curve, cache_dir=tmp_path)
        for cfg in (RunConfig(temperature=0), RunConfig(rule="standard", params={})):
            assert session.resolved(cfg).draft_shape == shape
        assert session.resolved(RunConfig(draft_shape="tree")).draft_shape == "tree"  # asked for: kept
