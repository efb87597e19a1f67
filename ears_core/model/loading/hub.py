"""Load a model or tokenizer from a Hugging Face hub id or a local folder, offline by default, with
errors that name the fix; encode a prompt; describe where a model runs. (pair.py assembles drafters.)

Terms
-----
source      a local folder in Hugging Face format (config.json, weights, tokenizer files) or a hub id
            (``"Qwen/Qwen2.5-0.5B-Instruct"``); ``local`` says which.
offline     nothing is downloaded unless ``allow_download=True`` and ``HF_HUB_OFFLINE`` is unset; a model
            missing from the local cache is a ``ModelLoadError`` naming the fix, never a hang.
vocab_size  ``len(tokenizer)``: the token ids both models of a pair score (``check_tokenizers``).
damaged     a folder (or a hub id's copy in the Hugging Face cache) a load fails on, whose files damage.py finds
            missing or not whole: the ``ModelLoadError`` names the file and how to replace it, never a library's
            own error (safetensors, tokenizers, json).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ears_core.model.loading.damage import folder_damage

__all__ = ["ModelLoadError", "describe_device", "is_out_of_memory", "folder_or_hub_id", "load_tokenizer",
           "load_model", "check_tokenizers", "native_bf16", "resolve_dtype", "encode_prompt"]


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded; the message names the problem and the fix."""


def describe_device(model: torch.nn.Module) -> str:
    """Where a loaded model runs, for people: 'cpu (float32)', 'cuda:0 NVIDIA H100 (bfloat16)',
    or 'cuda:0, cuda:1 via accelerate's device map (bfloat16)'."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if getattr(model, "ears_kernels", "") == "lean-int4":  # model/passes/lean_llama.py
        return f"{next(model.parameters()).device} (lean: int4 weights from the GGUF, bfloat16 activations)"
    placed = getattr(model, "hf_device_map", None) or {}
    devices = sorted({str(d) for d in placed.values()}) or [str(next(model.parameters()).device)]
    devices = [f"cuda:{d}" if d.isdigit() else d for d in devices]
    if len(devices) > 1:
        return f"{', '.join(devices)} via accelerate's device map ({dtype})"
    dev = torch.device(devices[0])
    if getattr(model, "ears_kernels", "") == "cuda-graphs":  # model/cuda/graphed.py
        failed = model.capture_failed
        dtype += f", eager: {failed}" if failed else ", captured CUDA graphs"
    elif getattr(model, "ears_eager_reason", None):
        dtype += f", eager: {model.ears_eager_reason}"
    elif getattr(model, "ears_lean_skipped", None):  # pair.py: the embedded target's float form, and why
        dtype += f"; not the lean int4 target: {model.ears_lean_skipped}"
    name = f" {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else ""
    return f"{dev}{name} ({dtype})"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether exc is running out of GPU or host memory (torch raises several kinds)."""
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(exc).lower()


def folder_or_hub_id(spec: str, role: str) -> tuple[str, bool]:
    """(folder or hub id, is_local_folder) for a spec naming a folder or a hub id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return str(path), True
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec:
        raise ModelLoadError(f"the {role} folder {spec!r} does not exist: pass a folder in Hugging Face "
                             "format (config.json, weights, tokenizer files) or a hub id like 'org/name'")
    return spec, False


def _call(what: str, loader: Callable[..., Any], spec: str, source: str, local: bool,
          allow_download: bool, **kwargs: Any) -> Any:
    """loader(source, **kwargs), never downloading unless allowed; errors name the fix (module terms: damaged)."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    if not local:
        kwargs["local_files_only"] = offline or not allow_download
    try:
        return loader(source, **kwargs)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise
        folder = Path(source) if local else _hub_copy(spec)
        damage = folder_damage(folder, what.split()[-1]) if folder is not None else None
        if damage is None and not _reading_error(exc):
            raise
        if damage is not None:
            fix = (f"{damage}: save or copy the {what} into {folder} again" if local else
                   f"its copy in the Hugging Face cache ({folder}) is damaged, {damage}: fetch it again with "
                   f"`hf download {spec} --force-download`")
        elif local:
            fix = (f"check that {source} holds a Hugging Face {what} "
                   "(config.json and *.safetensors for a model; tokenizer.json / tokenizer_config.json)")
        elif kwargs["local_files_only"]:
            why = "HF_HUB_OFFLINE is set" if offline else "downloads are off unless allow_download=True"
            fix = (f"it is not in the local Hugging Face cache and {why}: fetch it once with "
                   f"`hf download {spec}`, or pass a local folder")
        else:
            fix = "check the id on huggingface.co (spelling; for a gated model run `hf auth login`)"
        detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise ModelLoadError(f"could not load the {what} {spec!r}: {fix} "
                             f"[{type(exc).__name__}: {detail}]") from exc


def _reading_error(exc: BaseException) -> bool:
    """Whether ``exc`` is how a library says a file could not be read (module terms: damaged)."""
    from safetensors import SafetensorError

    # tokenizers raises a bare Exception for a tokenizer.json it cannot parse
    return isinstance(exc, (OSError, ValueError, KeyError, ImportError, SafetensorError)) or type(exc) is Exception


def _hub_copy(spec: str) -> Path | None:
    """The folder of a hub id's copy in the local Hugging Face cache, None when there is none."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(spec, "config.json")
    except Exception:  # an id the cache cannot hold
        return None
    return Path(found).parent if isinstance(found, str) else None


def load_tokenizer(spec: str, source: str, local: bool, role: str, allow_download: bool,
                   backend: bool = False) -> Any:
    """The tokenizer at ``source`` (what ``spec`` resolved to); errors name ``spec`` and the fix. ``backend``: the
    folder's tokenizer is transformers' model-independent ``TokenizersBackend`` (the embedded pair's), loaded as
    that class without ``AutoTokenizer``, which reads the model's config first (seconds of imports when cold)."""
    if backend:
        from transformers import TokenizersBackend as loader
    else:
        from transformers import AutoTokenizer as loader
    return _call(f"{role} tokenizer", loader.from_pretrained, spec, source, local, allow_download)


def load_model(spec: str, source: str, local: bool, role: str, device: torch.device, dtype: torch.dtype,
               allow_download: bool, device_map: str | None) -> torch.nn.Module:
    """The causal LM at ``source`` in eval mode, on ``device`` (or placed by accelerate's ``device_map``)."""
    kwargs: dict[str, Any] = {"dtype": dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map  # accelerate places the layers
    from transformers import AutoModelForCausalLM

    model = _call(f"{role} model", AutoModelForCausalLM.from_pretrained, spec, source, local,
                  allow_download, **kwargs)
    if device_map is None:
        model.to(device)
    return model.eval()


def check_tokenizers(target_tok: Any, draft_tok: Any) -> int:
    """The vocab_size both can use; ModelLoadError if the draft's ids mean other strings."""
    n = min(len(target_tok), len(draft_tok))
    tv = {i: s for s, i in target_tok.get_vocab().items() if i < n}
    dv = {i: s for s, i in draft_tok.get_vocab().items() if i < n}
    fix = ("speculative decoding needs one shared vocabulary: pick a draft from the target's family "
           "(e.g. Qwen/Qwen2.5-0.5B-Instruct drafting for Qwen/Qwen2.5-7B-Instruct)")
    if tv != dv:
        bad = [i for i in range(n) if tv.get(i) != dv.get(i)]
        eg = ", ".join(f"id {i}: {tv.get(i)!r} vs {dv.get(i)!r}" for i in bad[:3])
        raise ModelLoadError(f"the draft tokenizer differs from the target's ({len(bad)} of the first "
                             f"{n} ids map to other tokens, e.g. {eg}): {fix}")
    for attr in ("eos_token_id", "bos_token_id"):
        t, d = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if t is not None and d is not None and t != d:
            raise ModelLoadError(f"the draft tokenizer's {attr} is {d} but the target's is {t}: {fix}")
    eos = target_tok.eos_token_id
    if eos is not None and eos >= n:
        raise ModelLoadError(f"the target's end-of-text id {eos} lies outside the shared vocabulary "
                             f"of {n} ids: {fix}")
    return n


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX; else emulated, slower than float32)."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(bool(check()) for check in checks if check is not None)


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """The dtype a model loads in. None: ``$EARS_DTYPE`` if set, else bfloat16 on CUDA and on a CPU that
    multiplies bfloat16 natively (``native_bf16``), float32 on other CPUs. ``load_pair`` runs a bfloat16 CPU
    target with exact rows (model/kernels/exact_rows.py), falling back to float32 where a CPU fails them."""
    if dtype is None:
        dtype = os.environ.get("EARS_DTYPE", "").strip() or None
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" or native_bf16() else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use 'float32', 'bfloat16' or 'float16' (argument or EARS_DTYPE)")
    return value


def encode_prompt(tokenizer: Any, prompt: str | Sequence[dict[str, str]], *, chat: bool = True,
                  device: str | torch.device | None = None) -> torch.Tensor:
    """Token ids (1, T) long for one prompt: the chat template with the generation prompt when the
    tokenizer has one and chat=True, else plain encoding. prompt: text, or a list of chat messages."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if not messages or any(not str(m.get("content", "")).strip() for m in messages):
        raise ValueError("the prompt is empty: type some text to continue (whitespace alone is not a prompt)")
    if chat and getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                            return_tensors="pt")
        ids = enc["input_ids"]  # (1, T)
    elif isinstance(prompt, str):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]  # (1, T)
    else:
        raise ValueError("a list of chat messages needs chat=True and a tokenizer with a chat template")
    if ids.shape[-1] == 0:
        raise ValueError("the prompt encodes to no tokens: type some text the tokenizer knows")
    ids = ids.to(torch.long)
    return ids.to(device) if device is not None else ids

