"""The model pairs the Studio offers by name (the app's picker, the CLI, the ZeroGPU Space): each a target and
a draft sharing one tokenizer. ``EMBEDDED`` names the offline default (pair.py, model/loading/embedded.py).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EMBEDDED", "PRESETS", "Preset"]

EMBEDDED = "embedded"


@dataclass(frozen=True)
class Preset:
    """A named target / draft pair sharing one tokenizer. label: what the picker shows; target, draft: specs
    for ``load_pair``; note: size and needs."""

    label: str
    target: str
    draft: str
    note: str = ""


PRESETS: tuple[Preset, ...] = (
    Preset("Embedded: SmolLM2-135M-Instruct + EAGLE head (CPU, offline)", EMBEDDED, EMBEDDED,
           "ships with the app; runs anywhere"),
    Preset("Qwen2.5-1.5B-Instruct <- Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
           "Qwen/Qwen2.5-0.5B-Instruct", "about 4 GB in bfloat16"),
    Preset("Qwen2.5-7B-Instruct <- Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
           "Qwen/Qwen2.5-0.5B-Instruct", "about 16 GB in bfloat16: a GPU"),
    Preset("Qwen3-8B <- Qwen3-0.6B", "Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", "about 18 GB in bfloat16: a GPU"),
    Preset("SmolLM2-1.7B-Instruct <- SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-1.7B-Instruct",
           "HuggingFaceTB/SmolLM2-135M-Instruct", "about 4 GB in bfloat16"),
    Preset("Llama-3.1-8B-Instruct <- Llama-3.2-1B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
           "meta-llama/Llama-3.2-1B-Instruct", "about 19 GB in bfloat16: a GPU; gated (accept the licence, "
           "set HF_TOKEN)"),
)
