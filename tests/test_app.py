"""The Gradio app through its API (gradio_client), on a tiny random pair served in-process."""

from __future__ import annotations

import re
import socket

import pytest

from conftest import perturbed_copy, tiny_llama

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


def tiny_backend():
    import app
    target = tiny_llama(0)
    return app.Backend(target, perturbed_copy(target, 0.03, seed=1), tiny_tokenizer(), 96, "tiny random pair")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failing_loader():
    raise RuntimeError("weights not found: run `python -m ears_core.models --prepare`")


@pytest.fixture(scope="module")
def client():
    import app
    demo = app.build_app(pair_loader=tiny_backend)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **app.LAUNCH_KW)
    try:
        yield gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
    finally:
        demo.close()


def call(client, prompt="the water is long and the", beta=0.5, temperature=1.0, k=4, max_new=24, seed=0,
         rule="EARS", baseline=True):
    out = client.predict(prompt, beta, temperature, k, max_new, seed, rule, baseline, api_name="/generate")
    names = ("tokens", "message", "summary", "conf", "ratio", "tput", "hist", "details", "theory", "theory_k", "theory_c")
    assert len(out) == len(names)  # the gr.State output is not part of the API
    return dict(zip(names, out))


def test_generate_returns_kinds_and_metrics(client):
    r = call(client)
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
    assert r["message"] == "" and r["theory_k"] == 4
    assert r["conf"] is not None and r["ratio"] is not None and r["hist"] is not None
    # the same seed gives the same tokens; ordinary rule (beta ignored) has no pardons and no distortion
    again = call(client)["details"]
    assert again["kinds"] == d["kinds"] and again["text"] == d["text"]
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
    import app
    with pytest.raises(app.InputError, match="whole number"):
        app._check("hi", 0.1, 0.9, 4, 2.5, 0)
    with pytest.raises(app.InputError, match="temperature must be between"):
        app._check("hi", 0.1, 3.0, 4, 8, 0)
    assert app._check(" hi ", 0.1, 0.9, 4.0, 8.0, 1.0) == (" hi ", 0.1, 0.9, 4, 8, 1)


def test_race_and_export(client):
    a, b, c, md, plot = client.predict("the water is long and the", 0.5, 1.0, 4, 16, 0, api_name="/race")
    assert len(re.findall(r'data-kind="target"', c)) == 16
    assert "pardoned" not in re.findall(r'data-kind="(\w+)"', b)
    assert "| target-only |" in md and "1.00×" in md
    if "First divergence" in md:  # same draws: the runs agree up to a pardon
        pos = int(re.search(r"position (\d+)", md).group(1))
        kinds_a = re.findall(r'data-kind="(\w+)"', a)
        assert "pardoned" in kinds_a[: pos + 1]


def test_model_load_failure_is_shown():
    import app
    demo = app.build_app(pair_loader=failing_loader)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        c = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        r = call(c)
        assert "weights not found" in r["message"]
    finally:
        demo.close()


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
        futures = [pool.submit(call, client, seed=s, max_new=16, baseline=False) for s in (1, 2)]
        results = [f.result(timeout=120) for f in futures]
    for seed, r in zip((1, 2), results):
        assert r["message"] == "" and r["details"]["stats"]["new_tokens"] == 16
        # Concurrent runs share no decode state: each equals the same seed run alone.
        alone = call(client, seed=seed, max_new=16, baseline=False)
        assert re.findall(r"data-kind", r["tokens"]) and r["details"]["kinds"] == alone["details"]["kinds"]
        assert r["details"]["stats"]["accepted"] == alone["details"]["stats"]["accepted"]
