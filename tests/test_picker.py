"""The model picker and the public-server guards: a free-text pair loaded from folders, a clear
failure for a pair that is not cached (offline), one pair in memory, messages without paths or
tracebacks, exports in a temporary folder, the per-request timeout, the step clock.

Folders hold tiny random Llamas saved in Hugging Face format; nothing reaches a hub.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from conftest import tiny_llama
from ears_core import pair as em
from ears_core.model.loading.hub import describe_device, resolve_dtype
from ears_core.pair import AUTO, ModelPair
from ears_core.serve.pair_slot import PairSlot
from ears_core.serve.session import RunConfig
from ears_core.serve.settings import NGRAM, Settings
from ears_core.studio import build_app
from ears_core.studio.controls import param_sliders_spec
from ears_core.studio.errors import InputError, public_error
from ears_core.studio.generate import OUT, export, make_generate
from ears_core.studio.pairs import CUSTOM, model_status, pick, picker_labels
from ears_core.studio.race import make_race
from ears_core.timing import StepClock
from test_app import call, serve, tiny_backend
from test_models import _save_tiny, _tokenizer

gradio_client = pytest.importorskip("gradio_client")

UNCACHED = "Qwen/Qwen2.5-1.5B-Instruct"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A target and a draft sharing one tokenizer, saved as folders (the free-text case)."""
    root = tmp_path_factory.mktemp("pairs")
    _save_tiny(root / "tiny-target", seed=0)
    _save_tiny(root / "tiny-draft", seed=1)
    return root


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    """Offline, with an empty Hugging Face cache: whatever this machine has cached is out of reach."""
    import huggingface_hub.constants as hc
    import transformers.utils.hub as th
    cache = str(tmp_path / "hf-empty")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", cache)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    for name in ("HF_HUB_CACHE", "TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE", "PYTORCH_PRETRAINED_BERT_CACHE"):
        if hasattr(th, name):
            monkeypatch.setattr(th, name, cache)
    return cache


@pytest.fixture(scope="module")
def picker_client():
    demo = build_app(pair_loader=tiny_backend, settings=Settings(device="cpu", max_new_tokens=32))
    try:
        yield demo, serve(demo)
    finally:
        demo.close()


def load(client, label, target="", draft=""):
    return client.predict(label, target, draft, api_name="/load")  # (status, message)


def test_the_embedded_pair_is_the_default_and_first():
    first = em.PRESETS[0]
    assert (first.target, first.draft) == ("embedded", "embedded")
    slot = PairSlot(Settings())
    assert slot.default == ("embedded", AUTO) and (slot.same(slot.default, ("embedded", "embedded"))
                                                  == em.embedded_draft_available())
    assert "loads on the first request" in model_status(slot) and slot.loaded is None
    # Every preset pairs a draft of the target's own family; defaults come from the presets.
    for p in em.PRESETS[1:]:
        assert p.target.split("/")[0] == p.draft.split("/")[0] and em.resolve_draft(p.target) == p.draft
    assert em.resolve_draft("someone/else") == NGRAM and em.resolve_draft("x", NGRAM) == NGRAM
    assert em.resolve_draft("x", None) is None  # target-only


def test_a_free_text_pair_from_folders_loads_and_generates(picker_client, folders):
    demo, client = picker_client
    status, msg = load(client, CUSTOM, str(folders / "tiny-target"), str(folders / "tiny-draft"))
    assert msg == ""
    loaded = demo.ears_slot.loaded.pair.dtype  # this CPU's default (float32 where bfloat16 rows are not exact)
    assert loaded in (resolve_dtype(None, torch.device("cpu")), torch.float32)
    where = f"cpu ({str(loaded).removeprefix('torch.')})"
    assert "Ready:" in status and "tiny-target <- tiny-draft" in status and where in status
    assert str(folders) not in status  # the folder's name only, never its path
    r = call(client, prompt="w5 w6 w7", max_new=8, baseline=False, temperature=0.0, rule="greedy")
    assert r["message"] == "" and r["details"]["stats"]["new_tokens"] == 8
    assert r["details"]["model"] == "tiny-target <- tiny-draft" and r["details"]["device"] == where
    assert f"on {where}" in r["summary"]
    be = demo.ears_slot.loaded.pair
    assert be.target.config.vocab_size == 100  # the folder's model, not the injected default
    # Greedy speculative decoding reproduces the target's own greedy tokens.
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        ref = be.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                 pad_token_id=2, eos_token_id=None)
    assert r["details"]["text"] == be.tokenizer.decode(ref[0, 3:], skip_special_tokens=True)


def test_an_uncached_pair_fails_clearly_and_the_loaded_pair_stays(picker_client, folders, empty_hub_cache):
    demo, client = picker_client
    load(client, CUSTOM, str(folders / "tiny-target"), str(folders / "tiny-draft"))
    before = demo.ears_slot.loaded
    label = next(p.label for p in em.PRESETS if p.target == UNCACHED)
    status, msg = load(client, label)
    assert msg.startswith("⚠️") and f"could not load the target tokenizer '{UNCACHED}'" in msg
    assert "not in the local Hugging Face cache" in msg and f"hf download {UNCACHED}" in msg
    assert "[" not in msg and "Traceback" not in msg  # the library's own detail stays in the log
    assert demo.ears_slot.loaded is before and "tiny-target" in status  # nothing was dropped
    assert call(client, prompt="w5 w6", max_new=4, baseline=False)["details"]["stats"]["new_tokens"] == 4


def test_a_missing_folder_or_mismatched_pair_is_a_message(picker_client, folders, tmp_path):
    _, client = picker_client
    _, msg = load(client, CUSTOM, str(tmp_path / "nowhere" / "model"), "")
    assert "does not exist" in msg and str(tmp_path) not in msg and "<path>" in msg
    other = tmp_path / "other-vocab"
    _save_tiny(other, tokenizer=_tokenizer([f"v{i}" for i in range(3, 100)]))  # same size, other words
    _, msg = load(client, CUSTOM, str(folders / "tiny-target"), str(other))
    assert "the draft tokenizer differs from the target's" in msg


def test_one_pair_in_memory_and_a_failed_load_restores_the_choice(folders):
    loads = []

    def loader(target, draft):
        loads.append((target, draft))
        if target == "broken":
            raise RuntimeError(f"CUDA out of memory. Tried to allocate 20.00 GiB at {folders}/x/y")
        return ModelPair(tiny_llama(0), None, None, torch.device("cpu"), torch.float32, target, 96)

    slot = PairSlot(Settings(device="cpu"), loader=loader)
    first = slot.switch("a", NGRAM, check=False)
    second = slot.switch("b", NGRAM, check=False)
    assert slot.loaded is second and second is not first and slot.choice == ("b", NGRAM)
    assert slot.switch("b", NGRAM, check=False) is second and loads == [("a", NGRAM), ("b", NGRAM)]
    assert second.device_label == "cpu (float32)"
    with pytest.raises(RuntimeError) as info:
        slot.switch("broken", NGRAM, check=False)
    assert slot.loaded is None and slot.choice == ("b", NGRAM)
    text = public_error(info.value)
    assert text.startswith("Out of memory") and str(folders) not in text
    again = slot.session()  # the previous pair comes back on the next request, in a new Session
    assert again.pair.name == "b" and again is not second  # (its cached baselines went with the old one)


def test_presets_only_when_custom_models_are_off():
    slot = PairSlot(Settings(custom_models=False))
    with pytest.raises(InputError, match="listed pairs only"):
        pick(slot, CUSTOM, "/etc", "")
    label = em.PRESETS[2].label
    assert pick(slot, label, "/etc/anything", "x") == (em.PRESETS[2].target, em.PRESETS[2].draft)
    open_slot = PairSlot(Settings())
    assert pick(open_slot, label, " org/t ", " ngram ") == ("org/t", NGRAM)
    assert pick(open_slot, label, "org/t", "") == ("org/t", AUTO)  # an empty draft: the target's default
    with pytest.raises(InputError, match="Type a target"):
        pick(open_slot, CUSTOM, "  ", "")


@pytest.mark.parametrize("error, shown, hidden", [
    (ValueError("could not read /home/me/.cache/x/model.gguf: reinstall [OSError: /srv/a/b]"),
     "could not read <path>: reinstall", "/home"),
    (RuntimeError("first line\nTraceback (most recent call last):\n  File \"/srv/app.py\""), "first line", "File"),
    (KeyError(), "Something went wrong (KeyError)", "Traceback"),
    (MemoryError(), "Out of memory", "MemoryError"),
    (ValueError("pick Qwen/Qwen2.5-0.5B-Instruct from https://huggingface.co/Qwen"),
     "pick Qwen/Qwen2.5-0.5B-Instruct from https://huggingface.co/Qwen", "<path>"),
])
def test_page_messages_hold_no_paths_or_tracebacks(error, shown, hidden):
    text = public_error(error)
    assert text.startswith(shown) and hidden not in text and "\n" not in text


def test_exports_go_to_a_temporary_folder():
    state = {"events": [{"position": 0, "kind": "accepted"}], "steps": [], "stats": {}, "measured": None}
    csv_path, json_path, msg = export(state)
    tmp = os.path.realpath(tempfile.gettempdir())
    assert msg == "" and os.path.dirname(csv_path) == os.path.dirname(json_path)
    assert os.path.commonpath([os.path.realpath(csv_path), tmp]) == tmp
    assert os.path.basename(os.path.dirname(csv_path)).startswith("ears_run_")


NAMES = [p.name for p in param_sliders_spec()]


def test_a_request_stops_at_the_timeout_with_the_tokens_so_far():
    slot = PairSlot(Settings(timeout_s=0.001), tiny_backend)
    generate = make_generate(slot, NAMES)
    outs = list(generate("the water is long and the", 0.1, 1.0, 4, 200, 0, "EARS", True))
    last = dict(zip(OUT, outs[-1]))
    assert "Stopped after 0.001 s" in last["message"]
    d = last["details"]
    n = d["stats"]["new_tokens"]
    assert 1 <= n < 200 and len(d["kinds"]) == n and d["timed_out"] is True
    assert d["baseline_tokens_per_s"] is None  # no baseline after a timeout
    ids = slot.loaded.encode("the water is long and the")
    cfg = RunConfig(rule="ears", params={"beta": 0.1}, temperature=1.0, max_new_tokens=200)
    assert slot.loaded.cached_baseline(ids, cfg) is None


def test_load_pair_names_the_fix_for_no_gpu_and_out_of_memory(monkeypatch, folders):
    if not torch.cuda.is_available():
        with pytest.raises(em.ModelLoadError, match="no CUDA GPU is visible: use device 'cpu'"):
            em.load_pair(str(folders / "tiny-target"), device="cuda")

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(em, "_load_model", oom)
    with pytest.raises(em.ModelLoadError, match=r"out of memory \(RAM\) while loading .*pick a smaller pair"):
        em.load_pair(str(folders / "tiny-target"), str(folders / "tiny-draft"), device="cpu")


def test_describe_device_and_the_cpu_step_clock():
    assert describe_device(tiny_llama(0)) == "cpu (float32)"
    assert describe_device(tiny_llama(0).to(torch.bfloat16)) == "cpu (bfloat16)"
    clock = StepClock("cpu")
    a = clock.mark()
    b = clock.mark()
    assert not clock.cuda and isinstance(a, float) and clock.ms(a, b) >= 0.0
    assert clock.ms(1.0, 1.5) == pytest.approx(500.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_cuda_step_clock_uses_events():
    clock = StepClock("cuda")
    a = clock.mark()
    x = torch.randn(2048, 2048, device="cuda")
    (x @ x).sum().item()  # a sync after both marks, as the decode loop's round does
    b = clock.mark()
    torch.cuda.synchronize()
    assert clock.cuda and isinstance(a, torch.cuda.Event) and clock.ms(a, b) > 0.0


def test_the_picker_lists_presets_the_servers_own_pair_and_free_text():
    labels, default = picker_labels(PairSlot(Settings()))
    if em.embedded_draft_available():
        assert default == labels[0] == em.PRESETS[0].label
    assert labels[-1] == CUSTOM
    qwen = PairSlot(Settings(target="Qwen/Qwen2.5-1.5B-Instruct"))
    assert picker_labels(qwen)[1] == em.PRESETS[1].label  # a preset target gets the preset's draft
    own = Settings(target="/srv/models/my-model", draft=NGRAM, custom_models=False)
    slot = PairSlot(own)
    labels, default = picker_labels(slot)
    assert default == labels[0] == "Server default: my-model <- ngram" and CUSTOM not in labels
    assert not any("/srv" in label for label in labels)
    assert pick(slot, default, "", "") == ("/srv/models/my-model", NGRAM)
    demo = build_app(pair_loader=lambda: None, settings=own)
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    assert by_id["pick"].value == default and by_id["pick_target"].value == ""  # no path in the page
    assert "my-model" in by_id["pair_status"].value and "/srv" not in by_id["pair_status"].value


def test_a_race_stops_at_the_timeout():
    race = make_race(PairSlot(Settings(timeout_s=0.001), tiny_backend), NAMES)
    outs = list(race("the water is long and the", 0.1, 1.0, 4, 200, 0))
    ears_html, ordinary_html, _, md, _ = outs[-1]
    assert "Stopped after 0.001 s" in md and "(during EARS (beta=0.1))" in md
    assert 1 <= ears_html.count("data-kind=") < 200 and "data-kind=" not in ordinary_html


def test_describe_device_names_every_device_of_a_device_map():
    model = tiny_llama(0)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": "cpu"}
    assert describe_device(model) == "cuda:0, cuda:1, cpu via accelerate's device map (float32)"


def test_check_pair_refuses_cross_family_embedded_pairs_before_loading_weights(folders):
    with pytest.raises(em.ModelLoadError, match="embedded target pairs with the embedded draft or n-gram"):
        em.check_pair("embedded", str(folders / "tiny-draft"))
    with pytest.raises(em.ModelLoadError, match="embedded draft is a head on SmolLM2"):
        em.check_pair(str(folders / "tiny-target"), "embedded")
    assert em.check_pair(str(folders / "tiny-target"), str(folders / "tiny-draft")) == 100
