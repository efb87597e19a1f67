"""Shared setup for the plug-in's tests (run in .venv-vllm: `make test-vllm`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a hub download: the embedded target is a local folder
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
if str(REPO) not in sys.path:  # ears_core from this checkout, whether or not it was pip-installed here
    sys.path.insert(0, str(REPO))

TARGET_SUBDIR = "smollm2-135m-instruct"  # ears_core's embedded target folder (ears_core.models.CACHE_SUBDIR)


def target_dir() -> Path:
    """The embedded SmolLM2-135M folder `make install` prepares: $EARS_CACHE (else ~/.cache/ears_studio)
    / smollm2-135m-instruct, the path rule of ears_core.models.cache_root."""
    root = Path(os.environ.get("EARS_CACHE") or "~/.cache/ears_studio").expanduser()
    return root / TARGET_SUBDIR


@pytest.fixture(scope="session")
def target() -> str:
    folder = target_dir()
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        pytest.fail(f"the embedded target is not prepared at {folder}: run `make install` first "
                    "(it converts the SmolLM2-135M GGUF to safetensors there; CI runs `make test` before these)")
    return str(folder)


def engine_kwargs(**extra):
    """vLLM settings that start fastest on this 2-core CPU."""
    kw = dict(max_model_len=512, enforce_eager=True, seed=0, max_num_seqs=8,
              kv_cache_memory_bytes=256 << 20, disable_log_stats=False)
    kw.update(extra)
    return kw
