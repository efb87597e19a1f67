"""The Gradio app through its API (gradio_client), on a tiny random pair served in-process."""

from __future__ import annotations

import re
import socket
import time

import pytest
import torch

from conftest import perturbed_copy, tiny_llama
from ears_core.pair import ModelPair
from ears_core.serve.session import Session
from ears_core.serve.settings import Settings
from ears_core.studio import LAUNCH_KW, build_app
from ears_core.studio.controls import param_sliders_spec

gradio_client = pytest.importorskip("gradio_client")

_WORDS = ("<unk> the a of and to in is it that was for on are as with his they at be this from have or by one had "
          "not but what all were when we there can an your which their said if do will each about how up out them "
          "then she many some so these would other into has more her two like him see time could no make than "
          "first been its who now people my made over did down only way find use may water long little").split()


def tiny_tokenizer():
    """A 96-token word-level tokenizer built offline (90 words + punctuation + newline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = _WORDS[:90] + [".", ",", "!", "?", "\n", ":"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>")


def tiny_backend(target=None):
    """The tiny pair as ``load_pair`` returns a pair: a draft model, the word-level tokenizer."""
    target = target if target is not None else tiny_llama(0)
    return ModelPair(target, perturbed_copy(target, 0.03, seed=1), tiny_tokenizer(), torch.device("cpu"),
                     torch.float32, "tiny random pair", 96, "tiny-draft")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failing_loader():
    raise RuntimeError("weights not found: run `python -m ears_core.model.loading.embedded --prepare`")


def serve(demo):
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **LAUNCH_KW)
    return gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)


@pytest.fixture(scope="module")
def client():
    # "auto" drafts a tree where a wide verify pass is cheap on the session's measured price curve;
    # the tiny pair's curve is noise around that line, so here it counts as cheap (test_session_tree
    # tests the choice itself).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Session, "wide_passes_are_cheap", lambda self: True)
        demo = build_app(pair_loader=tiny_backend, settings=Settings())
        try:
            yield serve(demo)
        finally:
            demo.close()


def call(client, prompt="the water is long and the", beta=0.5, temperature=1.0, k=4, max_new=24, seed=0,
         rule="EARS", baseline=True, draft_length=None, tree=None, tree_budget=8):
    if draft_length is None and tree is not None:
        draft_length = "policy"  # the inputs before the tree's, at their defaults
    extra = () if draft_length is None else (*[p.default for p in param_sliders_spec()[1:]], draft_length)
    if tree is not None:
        extra = (*extra, tree, tree_budget)
    out = client.predict(prompt, beta, temperature, k, max_new, seed, rule, baseline, *extra, api_name="/generate")
    names = ("tokens", "message", "summary", "conf", "ratio", "tput", "hist", "details", "theory", "theory_k", "theory_c",
             "tree", "tree_round")
    assert len(out) == len(names)  # the gr.State output is not part of the API
    return dict(zip(names, out))


def test_generate_returns_kinds_and_metrics(client):
    r = call(client, draft_length="fixed")  # K drafts every round: the policy may draft nothing on a tiny pair
    d = r["details"]
    kinds = re.findall(r'data-kind="(\w+)"', r["tokens"])
    assert kinds == d["kinds"] and len(kinds) == 24
    assert set(kinds) <= {"accepted", "pardoned", "resampled", "bonus", "target"}
    s = d["stats"]
    assert s["new_tokens"] == 24 and s["method"].startswith("ears")
    assert s["accepted"] == kinds.count("accepted") + kinds.count("pardoned")
    assert s["pardoned"] == kinds.count("pardoned")
    assert 0.0 <= s["acceptance_rate"] <= 1.0 and s["mean_accept_length"] >= 1.0
    assert d["baseline_tokens_per_s"] > 0 and d["speedup"] == pytest.approx(s["tokens_per_s"] / d["baseline_tokens_per_s"])
    assert "acceptance rate" in r["summary"] and "speedup, measured" in r["summary"]
    # the wall clock from the request's arrival, beside the decode clock, and the time to first token
    assert s["wall_s"] >= s["decode_s"] > 0 and 0 < s["first_token_decode_s"] <= s["ttft_s"] <= s["wall_s"]
    assert "| time to first token |" in r["summary"] and "| wall clock |" in r["summary"]
    assert "| speedup, wall clock |" in r["summary"]
    assert r["message"] == "" and r["theory_k"] == 4
    assert r["conf"] is not None and r["ratio"] is not None and r["hist"] is not None
    # with a fixed draft length the same seed gives the same tokens (the policy learns between runs, so
    # which positions it verifies, and so the text at T > 0, may change: the distribution does not)
    fixed = call(client, draft_length="fixed")["details"]
    assert call(client, draft_length="fixed")["details"]["text"] == fixed["text"]
    policy = call(client, baseline=False)  # the default draft length: the measured policy
    assert "draft length: policy" in policy["summary"] and "this machine's profile: verify price in steps" in policy["summary"]
    assert "draft length: fixed" in r["summary"]
    ordinary = call(client, rule="ordinary", baseline=False)["details"]
    assert "pardoned" not in ordinary["kinds"] and ordinary["stats"]["mean_distortion"] < 1e-6  # float noise only


def test_greedy_matches_target_only(client):
    """Greedy (forced T = 0) emits the target's own argmax chain: only accepted / resampled / bonus."""
    d = call(client, rule="greedy", baseline=False)["details"]
    assert d["rule"].startswith("greedy") and "pardoned" not in d["kinds"]
    assert d["stats"]["new_tokens"] == 24


def test_empty_prompt_is_a_message_not_a_crash(client):
    r = call(client, prompt="   ")
    assert "prompt is empty" in r["message"] and r["message"].startswith("⚠️")
    assert not (r["details"] or {}).get("kinds")  # nothing ran (the panel is left as it was)
    assert call(client, max_new=4, baseline=False)["details"]["stats"]["new_tokens"] == 4  # still serving


@pytest.mark.parametrize("args, needle", [(dict(beta=1.5), "maximum"), (dict(k=0), "minimum"), (dict(max_new=10**6), "maximum")])
def test_out_of_range_values_are_refused_and_the_app_keeps_serving(client, args, needle):
    """Gradio's own bounds check refuses API values outside a slider / number range (the page shows
    the same error as a toast); the app answers the next request."""
    with pytest.raises(gradio_client.exceptions.AppError, match=needle):
        call(client, **args)
    assert call(client, max_new=4, baseline=False)["details"]["stats"]["new_tokens"] == 4


def test_input_checks_in_the_callback():
    """The callback's own checks (for values that reach it unvalidated, e.g. a direct call)."""
    from ears_core.rules import rule_spec
    from ears_core.studio.errors import InputError, Request, check_params, check_request, resolve_rule
    with pytest.raises(InputError, match="whole number"):
        check_request("hi", 0.9, 4, 2.5, 0)
    with pytest.raises(InputError, match="temperature must be between"):
        check_request("hi", 3.0, 4, 8, 0)
    assert check_request(" hi ", 0.9, 4.0, 8.0, 1.0) == Request(" hi ", 0.9, 4, 8, 1)
    with pytest.raises(InputError, match="beta must be between 0 and 1"):
        check_params(rule_spec("ears"), {"beta": 1.5})
    assert check_params(rule_spec("typical"), {"beta": 9.0, "eps": 0.2}) == {"eps": 0.2, "delta": 0.3}
    # the selector's old values, registry names, aliases and labels all name a rule
    assert [resolve_rule(n).name for n in ("EARS", "ordinary", "greedy", "ears-entropy", "typical acceptance")] == \
        ["ears", "standard", "greedy", "ears-entropy", "typical"]
    with pytest.raises(InputError, match="Unknown rule 'nope': choose one of standard, ears"):
        resolve_rule("nope")


def test_race_and_export(client):
    """The old call (no rules named) races EARS against the ordinary rule."""
    a, b, c, md, plot = client.predict("the water is long and the", 0.5, 1.0, 4, 16, 0, api_name="/race")
    assert len(re.findall(r'data-kind="target"', c)) == 16
    assert "pardoned" not in re.findall(r'data-kind="(\w+)"', b)
    assert "| target-only |" in md and "1.00×" in md and "| EARS (beta=0.5) |" in md
    assert "| time to first token |" in md and re.search(r"\| \d+\.\d\d s \|", md)  # each run's, on the wall clock
    if "First divergence" in md:  # same draws: the runs agree up to a pardon
        pos = int(re.search(r"position (\d+)", md).group(1))
        kinds_a = re.findall(r'data-kind="(\w+)"', a)
        assert "pardoned" in kinds_a[: pos + 1]


def test_race_any_two_registered_rules(client):
    """Rule A and rule B are any registry names (or labels); each run equals the same rule in /generate with
    a fixed draft length (the race drafts K every round so both rules see the same draws)."""
    a, b, c, md, _ = client.predict("the water is long and the", 0.5, 1.0, 4, 12, 3, "ears-entropy", "typical",
                                    api_name="/race")
    assert "| EARS, entropy tolerance (beta=0.5) |" in md and "| typical acceptance (eps=0.09, delta=0.3) |" in md
    alone = call(client, seed=3, max_new=12, rule="ears-entropy", baseline=False, draft_length="fixed")["details"]
    assert re.findall(r'data-kind="(\w+)"', a) == alone["kinds"]


def test_model_load_failure_is_shown():
    demo = build_app(pair_loader=failing_loader, settings=Settings())
    try:
        demo.ears_slot.preloader.join(30)  # the load the build started has failed
        text, timer = refresh_status(demo)()
        assert "Not loaded" in text and "weights not found" in text and timer.active is False
        r = call(serve(demo))  # a Generate tries again, and says why it cannot run
        assert "weights not found" in r["message"]
    finally:
        demo.close()


def api_parameters(client, endpoint):
    return [p["parameter_name"] for p in client.view_api(print_info=False, return_format="dict")["named_endpoints"][endpoint]["parameters"]]


def test_the_api_names_every_parameter(client):
    """A gradio_client user reads (and may send by name) every parameter of /generate and /race."""
    rule_params = [p.name for p in param_sliders_spec()[1:]]  # every registered rule's, after beta
    assert {"eps", "gate", "epsilon"} <= set(rule_params)
    request = ["prompt", "beta", "temperature", "k", "max_new", "seed"]
    generate = api_parameters(client, "/generate")
    race = api_parameters(client, "/race")
    for names in (generate, race):
        assert not [n for n in names if re.fullmatch(r"param_\d+", n)], names
    assert generate == [*request, "rule_name", "with_baseline", *rule_params, "draft_length", "shape", "tree_budget"]
    assert race == [*request, "rule_a", "rule_b", *rule_params]
    # the names work as keywords: the rest takes the page's defaults
    out = client.predict(prompt="the water is long and the", max_new=6, rule_name="typical", eps=0.2,
                         with_baseline=False, draft_length="fixed", shape="chain", api_name="/generate")
    d = out[7]
    assert d["stats"]["new_tokens"] == 6 and d["draft_shape"] == "chain" and d["rule"] == "typical(eps=0.2, delta=0.3)"
    *_, md, _ = client.predict(prompt="the water is long and the", max_new=6, rule_a="typical", rule_b="ears",
                               eps=0.2, beta=0.4, api_name="/race")
    assert "| typical acceptance (eps=0.2, delta=0.3) |" in md and "| EARS (beta=0.4) |" in md


def refresh_status(demo):
    """The handler that refreshes the page's pair status (on page load and each timer tick)."""
    fns = [f.fn for f in demo.fns.values() if f.name == "refresh_status"]
    assert len(fns) == 2  # the page's load and the timer's tick
    return fns[0]


def test_the_pair_loads_from_the_build_on_and_the_page_says_loading_then_ready():
    """The build starts the load in the background (no request, no launch); the status line says
    "Loading" until it is ready, and a Generate sent meanwhile waits for it (saying so), then runs."""
    import threading

    from ears_core.studio.pairs import LOADING

    started, gate = threading.Event(), threading.Event()

    def gated_loader():
        started.set()
        assert gate.wait(60)
        return tiny_backend()

    demo = build_app(pair_loader=gated_loader, settings=Settings())
    try:
        assert started.wait(30)  # the build alone started it
        slot = demo.ears_slot
        assert slot.state == "loading" and slot.loaded is None
        by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
        assert "Loading" in by_id["pair_status"].value  # what the page shows first
        text, timer = refresh_status(demo)()
        assert "Loading" in text and "Ready" not in text and timer.active is True  # the page asks again
        c = serve(demo)
        job = c.submit("the water is long and the", 0.5, 1.0, 4, 8, 0, "EARS", False, api_name="/generate")
        deadline = time.monotonic() + 30
        while not any(LOADING in str(o[2]) for o in job.outputs()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(LOADING in str(o[2]) for o in job.outputs())  # the summary says it waits for the pair
        assert not job.done() and "Ready" not in refresh_status(demo)()[0]
        gate.set()
        out = job.result(timeout=120)
        assert out[1] == "" and out[7]["stats"]["new_tokens"] == 8  # then it ran, no error
        text, timer = refresh_status(demo)()
        assert "Ready" in text and "tiny random pair" in text and timer.active is False  # and stops asking
        assert slot.state == "ready"
    finally:
        gate.set()
        demo.close()


def test_the_tree_panel_shows_for_tree_runs_and_hides_for_chain_runs():
    """A chain run has no tree to draw: its panel (plot and round slider) is hidden, as before any run."""
    import gradio as gr

    from ears_core.serve.pair_slot import PairSlot
    from ears_core.studio.generate import OUT, make_generate

    demo = build_app(pair_loader=lambda: None, settings=Settings(), preload=False)
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    panel = by_id["tree_panel"]
    assert isinstance(panel, gr.Column) and panel.visible is False and by_id["tree_plot"] in panel.children
    generate = make_generate(PairSlot(Settings(), tiny_backend), [p.name for p in param_sliders_spec()])
    i = OUT.index("tree_panel")

    def panels(shape):
        outs = list(generate("the water is long and the", 0.5, 1.0, 3, 10, 0, "ordinary", False,
                             draft_length="fixed", shape=shape, tree_budget=5))
        assert outs[-1][OUT.index("message")] == ""
        return [o[i] for o in outs if not isinstance(o[i], dict)]  # dict: gr.skip()

    chain, tree = panels("chain"), panels("tree")
    assert len(chain) == 1 and isinstance(chain[0], gr.Column) and chain[0].visible is False
    assert len(tree) == 1 and isinstance(tree[0], gr.Column) and tree[0].visible is True


def test_export_writes_the_last_run(client):
    import csv
    import json
    d = call(client, max_new=12, baseline=False)["details"]
    csv_path, json_path, msg = client.predict(api_name="/export")
    assert msg == ""
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["kind"] for r in rows] == d["kinds"] and rows[0]["position"] == "0"
    with open(json_path, encoding="utf-8") as f:
        run = json.load(f)
    assert run["stats"] == d["stats"] and run["settings"]["K"] == 4 and len(run["steps"]) == d["stats"]["steps"]


def test_two_clients_at_once_both_get_their_answers(client):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(call, client, seed=s, max_new=16, baseline=False, draft_length="fixed") for s in (1, 2)]
        results = [f.result(timeout=120) for f in futures]
    for seed, r in zip((1, 2), results):
        assert r["message"] == "" and r["details"]["stats"]["new_tokens"] == 16
        # Concurrent runs share no decode state: each equals the same seed run alone.
        alone = call(client, seed=seed, max_new=16, baseline=False, draft_length="fixed")
        assert re.findall(r"data-kind", r["tokens"]) and r["details"]["kinds"] == alone["details"]["kinds"]
        assert r["details"]["stats"]["accepted"] == alone["details"]["stats"]["accepted"]


def slow_pair():
    """The tiny pair with a target that takes 10 ms per forward: two requests sent together overlap."""
    target = tiny_llama(0)
    target.register_forward_pre_hook(lambda *args: time.sleep(0.01))
    return tiny_backend(target)


def test_overlapping_requests_are_contended_and_their_baselines_never_cached():
    from concurrent.futures import ThreadPoolExecutor

    from ears_core.serve.session import RunConfig

    demo = build_app(pair_loader=slow_pair, settings=Settings(concurrency=2))
    try:
        c = serve(demo)
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(call, c, seed=s, max_new=30) for s in (1, 2)]
            results = [f.result(timeout=120) for f in futures]
        session = demo.ears_slot.loaded
        ids = session.encode("the water is long and the")
        cfgs = {s: RunConfig(rule="ears", params={"beta": 0.5}, temperature=1.0, k=4, max_new_tokens=30, seed=s)
                for s in (1, 2)}
        for seed, r in zip((1, 2), results):
            d = r["details"]
            assert d["contended"] is True and d["baseline_tokens_per_s"] > 0
            assert "contended" in r["summary"] and "not cached" in r["summary"]
            assert session.cached_baseline(ids, cfgs[seed]) is None
        # The same request alone is clean: its baseline is cached, and the next request reads it.
        alone = call(c, seed=1, max_new=30)
        assert alone["details"]["contended"] is False and "contended" not in alone["summary"]
        cached = session.cached_baseline(ids, cfgs[1])
        assert cached is not None and cached.tokens_per_s == alone["details"]["baseline_tokens_per_s"]
        again = call(c, seed=1, max_new=30)
        assert "(cached)" in again["summary"] and again["details"]["baseline_tokens_per_s"] == cached.tokens_per_s
    finally:
        demo.close()


def test_a_rule_registered_before_build_app_is_in_the_selector_and_runs():
    from ears_core import rules
    from ears_core.rules import AcceptanceRule, Param, register_rule

    @register_rule("toy-app", label="toy: constant slack", params=(Param("slack", 0.05, 0.0, 0.5, "constant tolerance"),))
    class ToySlack(AcceptanceRule):
        name = "toy-app"
        lossless = False

        def __init__(self, slack: float = 0.05) -> None:
            self.slack = slack

        def tolerance(self, target_probs, max_p):
            return torch.full_like(max_p, self.slack)

    try:
        demo = build_app(pair_loader=tiny_backend, settings=Settings())
        by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
        assert ("toy: constant slack", "toy-app") in [tuple(ch) for ch in by_id["rule"].choices]
        assert ("toy: constant slack", "toy-app") in [tuple(ch) for ch in by_id["race_rule_a"].choices]
        slider = by_id["param_slack"]
        assert (slider.minimum, slider.maximum, slider.value, slider.visible) == (0.0, 0.5, 0.05, False)
        props = {c["props"].get("elem_id"): c["props"] for c in demo.config["components"]}
        assert ["toy: constant slack", "toy-app"] in [list(ch) for ch in props["rule"]["choices"]]
        assert by_id["beta"].visible is True and by_id["param_eps"].visible is False
        try:
            from ears_core.studio.controls import param_sliders_spec
            client = serve(demo)
            extra = [0.4 if p.name == "slack" else p.default for p in param_sliders_spec()[1:]]  # after beta
            out = client.predict("the water is long and the", 0.1, 1.0, 4, 12, 0, "toy-app", False, *extra,
                                 "fixed", api_name="/generate")  # K drafts a round: the policy may draft none
            details = out[7]
            assert details["rule"] == "toy-app" and details["stats"]["new_tokens"] == 12
            import json
            with open(client.predict(api_name="/export")[1], encoding="utf-8") as f:
                run = json.load(f)
            tested = [e["tolerance"] for e in run["events"] if e["tolerance"] is not None]
            assert tested and all(t == pytest.approx(0.4) for t in tested)  # the slider reached the rule
            assert run["settings"]["slack"] == 0.4
        finally:
            demo.close()
    finally:
        rules.RULES.pop("toy-app")


def plot_json(value):
    """A gr.Plot value as the client receives it -> the plotly figure as a dict."""
    import json
    return json.loads(value["plot"]) if isinstance(value, dict) else json.loads(value)


def test_a_tree_run_draws_its_rounds_beside_the_tokens(client):
    import json
    r = call(client, k=3, rule="ordinary", draft_length="fixed", tree="tree", tree_budget=6, baseline=False)
    d = r["details"]
    assert r["message"] == "" and d["draft_shape"] == "tree" and d["stats"]["new_tokens"] == 24
    assert "tree(budget=6, depth=3" in d["stats"]["method"] and re.findall(r'data-kind="(\w+)"', r["tokens"]) == d["kinds"]
    rounds = d["stats"]["steps"]
    assert "| draft shape | tree: " in r["summary"] and "nodes per round" in r["summary"]
    assert "| mean accepted per round |" in r["summary"] and "a tree of depth 3, 6 nodes" in r["summary"]
    last = plot_json(r["tree"])  # the last round's tree, nodes coloured by kind
    assert last["layout"]["title"]["text"].startswith(f"Round {rounds - 1}:")
    assert {t["name"] for t in last["data"]} >= {"root", "accepted path"} and r["tree_round"]["value"] == rounds - 1
    first = plot_json(client.predict(0, api_name="/tree_round"))  # any round, from the run's record
    assert first["layout"]["title"]["text"].startswith("Round 0: 6 nodes")
    kinds = {t["name"] for t in first["data"] if t.get("mode") == "markers+text"}
    assert kinds <= {"root", "accepted", "pardoned", "rejected", "untested", "resampled", "bonus"} and "untested" in kinds
    words = [w for t in first["data"] if t.get("mode") == "markers+text" for w in t["text"]]
    assert all(isinstance(w, str) and w for w in words)  # token text, not ids
    with open(client.predict(api_name="/export")[1], encoding="utf-8") as f:
        run = json.load(f)
    assert len(run["trees"]) == rounds and run["settings"]["draft_shape"] == "tree"
    assert [len(t["tokens"]) for t in run["trees"]][:-3] == [6] * (rounds - 3)  # a fixed budget (the end is capped)

    # greedy on a tree sized by the cost model is the chain's greedy output, token for token
    tree = call(client, rule="greedy", tree="auto", tree_budget=10, baseline=False)["details"]
    chain = call(client, rule="greedy", draft_length="fixed", tree="auto", baseline=False)
    assert tree["text"] == chain["details"]["text"] and tree["draft_shape"] == "tree"
    assert chain["tree"] is None and chain["details"]["draft_shape"] == "chain"
    bad = call(client, rule="ordinary", draft_length="threshold", tree="tree", baseline=False)
    assert "threshold draft length is for chains" in bad["message"]
    # the page's defaults (draft length policy, shape auto) draw a tree at T = 0 with this pair, and say so
    default = call(client, temperature=0, baseline=False)
    assert default["details"]["draft_shape"] == "tree" and "a tree of depth 4, 8 nodes" in default["summary"]
    assert call(client, baseline=False)["details"]["draft_shape"] == "chain"  # T = 1: a chain
