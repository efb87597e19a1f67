"""Damaged files a start reads: a user's model folder (or a hub id's copy in the Hugging Face cache) fails with a
ModelLoadError naming the file and what to do, never a library's own error (model/loading/hub.py: damaged); a
cached measurement that does not read back is measured again and replaced (model/measuring/records.py)."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_models import _save_tiny

from conftest import stand_in_for, tiny_llama
from ears_core.draft.head_kernels import HeadChoice, Variant, choose_head_variant
from ears_core.model.kernels.output_head import HeadPlan
from ears_core.model.kernels.packed_linear import KernelChoice
from ears_core.model.loading.hub import ModelLoadError
from ears_core.model.measuring import lean_plan
from ears_core.model.measuring.lean_plan import RowPlan
from ears_core.model.measuring.records import read_record, write_record
from ears_core.pair import load_pair
from ears_core.policy import profile
from ears_core.policy.costs import PriceCurve


def _sharded(folder: Path) -> None:
    """A tiny model saved in several weights files with an index naming them."""
    model = _save_tiny(folder)
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder, max_shard_size="40KB")
    assert len(list(folder.glob("model-*.safetensors"))) > 1 and (folder / "model.safetensors.index.json").is_file()


def _cut(name: str, size: int):
    return lambda folder: os.truncate(folder / name, size if size >= 0 else (folder / name).stat().st_size + size)


def _delete_second_shard(folder: Path) -> None:
    _sharded(folder)
    sorted(folder.glob("model-*.safetensors"))[1].unlink()


FOLDER_FAULTS = {  # fault -> (how it is made, what the message says)
    "weights cut in their tensors": (_cut("model.safetensors", -1000), "model.safetensors is cut short: its tensors"),
    "weights cut in their header": (_cut("model.safetensors", 100), "model.safetensors is cut short: its header"),
    "weights emptied": (_cut("model.safetensors", 0), "model.safetensors is 0 bytes"),
    "weights deleted": (lambda f: (f / "model.safetensors").unlink(), "no weights file (model.safetensors)"),
    "a shard deleted": (_delete_second_shard, "model-00002-of-"),
    "tokenizer deleted": (lambda f: (f / "tokenizer.json").unlink(), "no tokenizer file (tokenizer.json"),
    "tokenizer garbage": (lambda f: (f / "tokenizer.json").write_text("{garbage"), "tokenizer.json does not parse"),
    "tokenizer config garbage": (lambda f: (f / "tokenizer_config.json").write_bytes(b"\xff\x00"),
                                 "tokenizer_config.json does not parse"),
    "config garbage": (lambda f: (f / "config.json").write_text("garbage"), "config.json does not parse"),
    "config deleted": (lambda f: (f / "config.json").unlink(), "config.json is missing"),
}


def test_a_whole_sharded_folder_loads(tmp_path):
    _sharded(tmp_path / "m")
    assert load_pair(str(tmp_path / "m"), None, device="cpu").vocab_size == 100


@pytest.mark.parametrize("fault", FOLDER_FAULTS)
def test_a_damaged_folder_names_the_file_and_the_fix(tmp_path, fault):
    folder = tmp_path / "m"
    _save_tiny(folder)
    damage, said = FOLDER_FAULTS[fault]
    damage(folder)
    with pytest.raises(ModelLoadError) as raised:  # never SafetensorError, JSONDecodeError, tokenizers' Exception
        load_pair(str(folder), None, device="cpu")
    message = str(raised.value)
    assert said in message and "save or copy the target" in message and f"into {folder} again" in message
    assert raised.value.__cause__ is not None  # the library's error stays attached for the log


def test_the_page_shows_the_damaged_file_without_the_folder(tmp_path):
    from ears_core.studio.errors import public_error

    folder = tmp_path / "m"
    _save_tiny(folder)
    os.truncate(folder / "model.safetensors", 100)
    with pytest.raises(ModelLoadError) as raised:
        load_pair(str(folder), None, device="cpu")
    line = public_error(raised.value)
    assert "model.safetensors is cut short" in line and str(tmp_path) not in line and "SafetensorError" not in line


def test_a_damaged_copy_in_the_hugging_face_cache_says_to_fetch_it_again(tmp_path, monkeypatch):
    import huggingface_hub.constants

    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / ("a" * 40)
    _save_tiny(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert load_pair("org/tiny", None, device="cpu").vocab_size == 100  # whole: it loads offline
    os.truncate(snapshot / "model.safetensors", 5000)
    with pytest.raises(ModelLoadError, match=r"'org/tiny'.*copy in the Hugging Face cache .* is damaged, "
                                             r"model.safetensors is cut short.*`hf download org/tiny --force-download`"):
        load_pair("org/tiny", None, device="cpu")


# ------------------------------------------------------------------ cached measurements


GOOD = {  # a record of each kind cached under $EARS_CACHE, as it is saved
    RowPlan: {"chunks": [[1], [2]], "cost_ms": [1.0, 2.0], "key": "k", "measured_at": "t"},
    HeadPlan: {"layouts": ["linear", "xw"], "ms": [{"linear": 1.0}, {"xw": 2}], "key": "k", "measured_at": "t"},
    KernelChoice: {"packed": True, "ms": {"packed": {"1": 1.5}}, "key": "k", "measured_at": "t"},
    HeadChoice: {"dtype": "bfloat16", "packed": False, "ms": {"bfloat16": 1.0}, "int4": False, "key": "k",
                 "measured_at": "t"},
    PriceCurve: {"verify_ms": [10.0, 11.5], "draft_ms": 1.0, "overhead_ms": 0.0, "key": "k", "measured_at": "t",
                 "provisional": False},
}
GARBAGE = {  # what a damaged or foreign file may hold
    "text that is not JSON": "{not json",
    "bytes that are not text": b"\xff\xfe\x00garbage",
    "an empty file": "",
    "a list": "[1, 2]",
    "null": "null",
    "a string where a list goes": {"chunks": "ab", "layouts": "xw", "verify_ms": "ab", "ms": "x", "dtype": 3},
    "nested values of the wrong type": {"chunks": [["1"]], "layouts": [1], "verify_ms": [[1.0]],
                                        "ms": {"packed": [1]}, "packed": "yes"},
    "a number that is not finite": {"cost_ms": [float("nan")], "verify_ms": [float("inf")], "draft_ms": float("nan"),
                                    "ms": {"packed": {"1": float("inf")}, "bfloat16": float("nan")}},
    "a field it does not have": {"surprise": 1},
    "a field missing": None,  # every record without its first field
}


def _garbage(kind: type, name: str) -> str | bytes:
    value = GARBAGE[name]
    if isinstance(value, (str, bytes)):
        return value
    if value is None:
        return json.dumps(dict(list(GOOD[kind].items())[1:]))
    return json.dumps(GOOD[kind] | {k: v for k, v in value.items() if k in GOOD[kind] or k == "surprise"})


@pytest.mark.parametrize("kind", GOOD, ids=lambda k: k.__name__)
def test_a_cached_record_reads_back_only_when_it_fits(kind, tmp_path):
    path = tmp_path / "record.json"
    assert write_record(GOOD[kind], path)
    assert read_record(kind, path) == kind(**GOOD[kind])
    for name in GARBAGE:
        text = _garbage(kind, name)
        if text == json.dumps(GOOD[kind]):
            continue  # this garbage names no field of this kind
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        assert read_record(kind, path) is None, name
    path.unlink()
    path.mkdir()  # a folder where the file should be
    assert read_record(kind, path) is None and read_record(kind, tmp_path / "missing.json") is None


@pytest.mark.parametrize("garbage", ["{not json", '{"verify_ms": "fast", "draft_ms": 1.0}', '{"verify_ms": [-1.0], '
                                     '"draft_ms": 1.0}', '{"verify_ms": [1.0, 2.0], "draft_ms": 1.0, "colour": 1}'])
def test_a_damaged_price_file_is_measured_again_and_replaced(tmp_path, monkeypatch, garbage):
    model = tiny_llama(0)
    measured = []

    def measure(*a, **k):
        measured.append(1)
        return PriceCurve([10.0, 12.0], 1.0, measured_at="now")

    monkeypatch.setattr(profile, "measure_prices", stand_in_for(model, measure))
    profile.load_or_measure(model, max_m=2, cache_dir=tmp_path)
    (path,) = (tmp_path / "costs").glob("*.json")
    path.write_text(garbage)
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path).verify_ms == [10.0, 12.0]
    assert len(measured) == 2 and read_record(PriceCurve, path).verify_ms == [10.0, 12.0]  # replaced
    assert profile.load_or_measure(model, max_m=2, cache_dir=tmp_path) and len(measured) == 2  # and read back


def test_a_cache_that_cannot_be_written_keeps_a_measurement_for_this_process(tmp_path, monkeypatch, caplog):
    (tmp_path / "costs").write_text("")  # a file where the folder goes: no write succeeds, even as root
    model = tiny_llama(0)
    monkeypatch.setattr(profile, "measure_prices", stand_in_for(model, lambda *a, **k: PriceCurve([10.0, 12.0], 1.0)))
    with caplog.at_level(logging.WARNING, logger="ears_studio"):
        curve = profile.load_or_measure(model, max_m=2, cache_dir=tmp_path)
    assert curve.verify_ms == [10.0, 12.0]
    assert any("this measurement serves this process only" in r.getMessage() for r in caplog.records)


F32, BF = Variant("float32", False), Variant("bfloat16", False)


@pytest.mark.parametrize("cached", [{"dtype": "bfloat16", "packed": True}, {"dtype": "float16"}, {"int4": True},
                                    {"packed": "no"}, "garbage"])
def test_a_head_choice_this_machine_cannot_run_is_measured_again(tmp_path, cached):
    """A cached choice naming a variant outside this machine's candidates (packed where oneDNN is missing, int4
    without the kernel, another dtype) or not a choice at all is ignored: the candidates are timed again."""
    from ears_core.draft.eagle import DraftHead, head_config_from_target

    head = DraftHead(head_config_from_target(tiny_llama(0).config), torch.arange(0, 96, 2)).eval()
    timed = []

    def timer(drafter):
        timed.append(drafter.variant)
        return {F32: 2.0, BF: 1.0}[drafter.variant]

    def make(variant):
        return SimpleNamespace(head=head, variant=variant)

    _, first = choose_head_variant(None, make, [F32, BF], 96, cache_dir=tmp_path, timer=timer)
    (path,) = (tmp_path / "kernels").glob("draft-*.json")
    path.write_text("{garbage" if cached == "garbage" else json.dumps(json.loads(path.read_text()) | cached))
    timed.clear()
    drafter, again = choose_head_variant(None, make, [F32, BF], 96, cache_dir=tmp_path, timer=timer)
    assert timed and drafter.variant == BF == again.variant  # timed again, and a candidate kept
    assert read_record(HeadChoice, path).variant == BF  # the file is this machine's choice again


def test_a_row_plan_whose_chunks_do_not_cover_each_width_is_measured_again(tmp_path, monkeypatch):
    layer = SimpleNamespace(qkv=SimpleNamespace(out_features=96), gate_up=SimpleNamespace(out_features=128),
                            down=SimpleNamespace(in_features=64))
    model = SimpleNamespace(layers=[layer])
    monkeypatch.setattr(lean_plan, "measure_widths", lambda *a, **k: [1.0] * lean_plan.MEASURED)
    plan = lean_plan.install_row_plan(model, tmp_path)
    (path,) = (tmp_path / "kernels").glob("lean_rows-*.json")
    good = json.loads(path.read_text())
    for chunks in ([[2]] + plan.chunks[1:], [[1], [0, 2]] + plan.chunks[2:], [[1], []] + plan.chunks[2:],
                   plan.chunks[:-1]):
        path.write_text(json.dumps(good | {"chunks": chunks}))
        assert lean_plan.install_row_plan(model, tmp_path, measure=False) is None  # the default plan, provisional
        assert all(sum(c) == m for m, c in model.row_plan.items())
    path.write_text(json.dumps(good))
    assert lean_plan.install_row_plan(model, tmp_path, measure=False) == plan


@pytest.mark.slow
def test_a_cached_head_form_whose_rows_fail_here_gives_way_and_is_measured_again(tmp_path, monkeypatch):
    """model/loading/target_path.py, head form: a form cached by another CPU sharing the folder (a width its kernels
    held to, which this one's do not) gives way to the untimed form chosen here, and the session's settle measures
    the form afresh instead of reading the failed one back."""
    import dataclasses

    from ears_core.model.kernels import exact_head, exact_rows
    from ears_core.model.loading import lean_target, target_path
    from ears_core.model.loading.embedded import prepare_embedded
    from ears_core.pair import _pending

    if not lean_target.supported():
        pytest.skip("needs PyTorch's CPU int4 kernel running with bfloat16 activations")
    folder = prepare_embedded()
    monkeypatch.setattr(target_path, "_ROWS_AGREED", {})
    here = target_path.lean_embedded(folder, tmp_path).head_form.form  # nothing cached: untimed, chosen here
    other = 8 if here.width != 8 else 4  # the other CPU's width: the rows fail under it here
    cached = dataclasses.replace(here, width=other, widths={here.layout: other}, ms={here.layout: {"1": 1.0}},
                                 chunks=exact_head._plan({c: 1.0 for c in exact_head.CHUNKS if c <= other}))
    cached.save(tmp_path)
    checked = []
    monkeypatch.setattr(exact_rows, "rows_agree", lambda model, widths: checked.append(model.head_form.form.width)
                        or model.head_form.form.width != other)
    target_path._ROWS_AGREED.clear()  # both forms checked afresh
    model = target_path.lean_embedded(folder, tmp_path)
    assert model is not None and checked == [other, here.width]
    assert model.ears_head_provisional and model.head_form.form.width == here.width
    (settle,) = [p.settle for p in _pending(SimpleNamespace(target=model, draft=None), None, tmp_path)
                 if p.what == "the output head's form"]
    settle(None)
    again = read_record(exact_head.HeadForm, exact_head.HeadForm.file(here.key, tmp_path))
    assert again.ms and again.width != other and not model.ears_head_provisional
