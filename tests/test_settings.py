"""ears_core.serve.settings: environment variables -> Settings, errors that name the variable and the fix,
and the app using them for its limits, queue and launch."""

from __future__ import annotations

import math

import pytest

from ears_core.serve.settings import AUTO, NGRAM, Settings, SettingsError

ALL = {"EARS_TARGET": "Qwen/Qwen2.5-1.5B-Instruct", "EARS_DRAFT": "Qwen/Qwen2.5-0.5B-Instruct",
       "EARS_DEVICE": "CUDA:1", "HOST": "0.0.0.0", "PORT": "8080", "EARS_MAX_NEW_TOKENS": "256",
       "EARS_MAX_PROMPT_CHARS": "2000", "EARS_QUEUE_SIZE": "8", "EARS_CONCURRENCY": "3",
       "EARS_TIMEOUT_S": "45.5", "EARS_ALLOW_DOWNLOAD": "yes", "EARS_CUSTOM_MODELS": "0", "EARS_CACHE": "/data/ears"}


def test_defaults_from_an_empty_environment():
    s = Settings.from_env({})
    assert s == Settings()
    assert (s.target, s.draft, s.device, s.torch_device) == ("embedded", AUTO, "auto", None)
    assert (s.host, s.port) == ("127.0.0.1", 7860)
    assert (s.max_new_tokens, s.max_prompt_chars, s.queue_size, s.concurrency, s.timeout_s) == (512, 4000, 64, 1, 120.0)  # one decode at a time
    assert s.allow_download is False and s.custom_models is True and s.cache is None


def test_every_variable_is_read():
    s = Settings.from_env(ALL)
    assert s.target == "Qwen/Qwen2.5-1.5B-Instruct" and s.draft == "Qwen/Qwen2.5-0.5B-Instruct"
    assert s.device == "cuda:1" and s.torch_device == "cuda:1"
    assert (s.host, s.port, s.max_new_tokens, s.max_prompt_chars) == ("0.0.0.0", 8080, 256, 2000)
    assert (s.queue_size, s.concurrency, s.timeout_s) == (8, 3, 45.5)
    assert s.allow_download is True and s.custom_models is False and s.cache == "/data/ears"


@pytest.mark.parametrize("draft", ["ngram", "NONE", " none "])
def test_draft_ngram_means_prompt_lookup(draft):
    assert Settings.from_env({"EARS_DRAFT": draft}).draft == NGRAM


def test_blank_values_mean_the_default():
    s = Settings.from_env({"EARS_TARGET": "  ", "PORT": "", "EARS_DEVICE": ""})
    assert (s.target, s.port, s.device) == ("embedded", 7860, "auto")


@pytest.mark.parametrize("var, value, needle", [
    ("EARS_MAX_NEW_TOKENS", "abc", "EARS_MAX_NEW_TOKENS='abc' is not a whole number"),
    ("EARS_MAX_NEW_TOKENS", "0", "EARS_MAX_NEW_TOKENS=0 is out of range: set it between 1 and 8192"),
    ("PORT", "70000", "PORT=70000 is out of range"),
    ("PORT", "78.5", "PORT='78.5' is not a whole number"),
    ("EARS_QUEUE_SIZE", "-1", "EARS_QUEUE_SIZE=-1 is out of range"),
    ("EARS_CONCURRENCY", "0", "EARS_CONCURRENCY=0 is out of range"),
    ("EARS_TIMEOUT_S", "nan", "EARS_TIMEOUT_S='nan' is not a number"),
    ("EARS_TIMEOUT_S", "-5", "EARS_TIMEOUT_S=-5.0 is out of range"),
    ("EARS_DEVICE", "gpu", "EARS_DEVICE='gpu' is not a device: use auto, cpu, cuda or cuda:N"),
    ("EARS_ALLOW_DOWNLOAD", "maybe", "EARS_ALLOW_DOWNLOAD='maybe' is not a yes/no value: set it to 1 or 0"),
    ("EARS_MAX_PROMPT_CHARS", "1e3", "EARS_MAX_PROMPT_CHARS='1e3' is not a whole number"),
])
def test_bad_values_name_the_variable_and_the_fix(var, value, needle):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({var: value})
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


def test_infinite_timeout_is_refused():
    with pytest.raises(SettingsError, match="EARS_TIMEOUT_S"):
        Settings(timeout_s=math.inf)


def test_the_app_takes_its_limits_and_queue_from_settings():
    from ears_core.studio import build_app
    s = Settings(max_new_tokens=40, max_prompt_chars=30, queue_size=3, concurrency=2)
    demo = build_app(pair_loader=lambda: None, settings=s)
    assert demo._queue.max_size == 3 and demo._queue.default_concurrency_limit == 2
    # the decodes share one queue group of `concurrency` workers: they never time each other unseen
    fns = {fn.api_name: fn for fn in demo.fns.values()}
    assert {fns[n].concurrency_id for n in ("generate", "race", "tpp_sample")} == {"decode"}
    assert fns["generate"].concurrency_limit == 2
    numbers = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "max_new"]
    assert numbers and numbers[0].maximum == 40
    prompts = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "prompt"]
    assert prompts[0].max_length == 30
    assert demo.ears_slot.settings is s


def test_build_app_reads_the_environment(monkeypatch):
    from ears_core.studio import build_app
    monkeypatch.setenv("EARS_QUEUE_SIZE", "5")
    monkeypatch.setenv("EARS_MAX_NEW_TOKENS", "64")
    demo = build_app(pair_loader=lambda: None)
    assert demo._queue.max_size == 5 and demo.ears_slot.settings.max_new_tokens == 64
    assert demo._queue.default_concurrency_limit == 1


def test_the_launcher_stops_with_the_variable_named(monkeypatch):
    import app
    monkeypatch.setenv("PORT", "http")
    with pytest.raises(SystemExit) as info:
        app.main()
    assert "PORT='http' is not a whole number" in str(info.value)


def test_the_callback_limits():
    from ears_core.studio.errors import InputError, check_request
    with pytest.raises(InputError, match="at most 10"):
        check_request("x" * 11, 0.9, 4, 8, 0, max_prompt_chars=10)
    with pytest.raises(InputError, match="max new tokens must be between 1 and 32"):
        check_request("hi", 0.9, 4, 33, 0, max_new_tokens=32)
    assert check_request("x" * 10, 0.9, 4, 32, 0, max_prompt_chars=10, max_new_tokens=32).max_new == 32


def test_the_queue_polls_slowly_while_a_decode_runs():
    """Gradio's queue loop polls every 1 ms on Linux: ~1,000 wake-ups a second that take the
    interpreter and a core from the decode thread. The app slows it to QUEUE_POLL_S."""
    import types

    from ears_core.studio import PROGRESS_POLL_S, QUEUE_POLL_S, build_app, calm_queue
    demo = build_app(pair_loader=lambda: None, settings=Settings())
    assert demo._queue.sleep_when_free == QUEUE_POLL_S == 0.05
    assert demo._queue.progress_update_sleep_when_free == PROGRESS_POLL_S == 0.1
    with pytest.raises(AttributeError, match="update ears_core.studio.calm_queue"):
        calm_queue(types.SimpleNamespace(_queue=types.SimpleNamespace(sleep_when_free=0.001)))


def test_the_machine_panel_follows_a_run_instead_of_the_state_changing():
    """A listener on the State's change makes Gradio deep-hash the State (the last run's every
    token and round) twice per frame of every run; the panel redraws after /generate instead."""
    from ears_core.studio import build_app
    demo = build_app(pair_loader=lambda: None, settings=Settings())
    fns = list(demo.fns.values())
    states = {b._id for b in demo.blocks.values() if type(b).__name__ == "State"}
    assert states and not [f for f in fns if any(t[0] in states and t[1] == "change" for t in f.targets)]
    generate = next(f for f in fns if f.api_name == "generate")
    after = [f for f in fns if f.trigger_after == generate._id]
    assert any("rounds_plot" in [getattr(o, "elem_id", None) for o in f.outputs] for f in after)


def test_the_app_starts_its_pair_loading_and_builds_the_page_around_that_slot(tmp_path, monkeypatch):
    """``app.start`` (what ``python app.py`` does before serving): the configured pair loads and warms up in the
    background, started before Gradio's import, and the page it returns reads that one slot, ready once loaded."""
    import app
    from test_app import tiny_backend
    from conftest import tiny_llama

    pair = tiny_backend(tiny_llama(0, max_pos=1024))
    pair.target.save_pretrained(tmp_path / "pair")
    pair.tokenizer.save_pretrained(tmp_path / "pair")
    for name, value in (("EARS_TARGET", str(tmp_path / "pair")), ("EARS_DRAFT", "ngram"), ("EARS_DEVICE", "cpu"),
                        ("EARS_CACHE", str(tmp_path / "cache"))):
        monkeypatch.setenv(name, value)
    demo = app.start(Settings.from_env())
    try:
        slot = demo.ears_slot
        assert slot.preloader is not None and slot.choice == (str(tmp_path / "pair"), "ngram")
        slot.preloader.join(120)
        assert slot.state == "ready" and slot.loaded.pair.draft_spec == "ngram"
    finally:
        demo.close()
