"""Assemble a target and its drafter into a ``ModelPair`` (``load_pair``), sharing one tokenizer.
Loading one model or tokenizer is model/loading/hub.py; preparing the embedded target is model/loading/embedded.py.

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
embedded    the offline default target, SmolLM2-135M-Instruct, from a GGUF prepared once into a
            safetensors cache (model/loading/embedded.py). The embedded draft is an EAGLE-style head in
            ``assets/embedded_draft/`` (draft/eagle.py).
vocab_size  ``len(tokenizer)``: the token ids both models score. Embedding / head rows beyond it
            are padding (Qwen2.5: 151936 rows for 151665 tokens); the decode loop slices logits
            to ``[..., :vocab_size]``.
draft dtype the dtype and kernels an EAGLE-style head computes with (draft/head_kernels.py): on a CPU
            with native bfloat16 (AVX512-BF16 or AMX) and a float32 target, float32 and bfloat16, each
            packed and as loaded, are timed once per machine (``settle``) and the fastest is kept
            (cached); beside the lean int4 target, the head from 4-bit blocks (int4) is timed too;
            ``EARS_DRAFT_DTYPE=float32|bfloat16|int4`` fixes the variant. The head's weights are
            stored in bfloat16, so only its rows of the target's output head are rounded.
offline     nothing is downloaded unless ``allow_download=True`` is passed (model/loading/hub.py).
provisional a load measures nothing that a default can stand in for (a cold start in seconds): the lean
            target's int4 row plan and output head form, a float32 CPU target's head layouts and linear kernels
            (as loaded until measured) and an EAGLE head's kernels are read from the cache, else defaults
            listed in ``ModelPair.pending``; ``settle()`` measures them (a server's session does it between
            requests, serve/prices.py), caches them and puts them in force.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ears_core.draft.head_files import (EMBEDDED_DRAFT_DIR, embedded_draft_available, embedded_draft_dir,  # noqa: F401
                                        is_head_dir, load_head_draft)
from ears_core.model.loading.hub import (ModelLoadError, check_tokenizers, encode_prompt, folder_or_hub_id, is_out_of_memory,
                                 load_model, load_tokenizer, resolve_dtype)
from ears_core.threads import in_passing_thread
from ears_core.timing import cores_crowded
from ears_core.model.loading.presets import EMBEDDED, PRESETS, Preset  # noqa: F401 - Preset: re-exported



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


@dataclass
class Pending:
    """A choice a load made by default (module terms: provisional): ``what`` it is; ``settle(piece)`` measures it
    on this machine, caches it and puts it in force."""

    what: str
    settle: Callable[[Any], None]


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
    rows_exact: bool | None = None  # a bfloat16 CPU target: did a wide pass equal one-token passes bit for bit
    # (model/kernels/exact_rows.py)? None where it was not checked (float32, CUDA)
    pending: list[Pending] = field(default_factory=list)  # choices made by default until measured (``settle``)

    @property
    def provisional(self) -> list[str]:
        """What this pair runs by default until it is measured on this machine (module terms: provisional)."""
        return [p.what for p in self.pending]

    def settle(self, piece: Any = None) -> list[str]:
        """Measure every provisional choice now (each unit in ``piece()`` when given: between requests), cache
        it and put it in force; -> what was settled. A measurement the busy cores spoil raises
        ``timing.MachineBusy`` and stays pending."""
        done = []
        while self.pending:
            self.pending[0].settle(piece)
            done.append(self.pending.pop(0).what)
        return done

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


def _pending(pair: ModelPair, head_folder: Path | None, cache_dir: Any) -> list[Pending]:
    """The choices ``pair``'s load made by default (module terms: provisional), each with how to settle it."""
    from ears_core.model.measuring.lean_plan import install_row_plan

    found = []
    target = pair.target
    if getattr(target, "ears_rows_provisional", False):
        def rows(piece: Any) -> None:
            install_row_plan(target, cache_dir, piece=piece)
            target.ears_rows_provisional = False
        found.append(Pending("the int4 row plan", rows))
    if getattr(target, "ears_head_provisional", False):
        def head_form(piece: Any) -> None:  # its layout sets the logits' bits: the requests after it run the new one
            from ears_core.model.kernels.exact_head import install_exact_head
            # measured afresh: a cached form may be the one whose rows failed (model/loading/target_path.py)
            install_exact_head(target, cache_dir, refresh=True, measure=True, piece=piece)
        found.append(Pending("the output head's form", head_form))
    if getattr(target, "ears_kernels_provisional", False):
        def kernels(piece: Any) -> None:  # the float target's head layouts and linear kernels, measured on it
            from contextlib import nullcontext

            from ears_core.model.kernels.output_head import install_planned_head
            from ears_core.model.kernels.packed_linear import choose_kernels, pack_like
            piece = piece or nullcontext  # a settle watches the cores, in pieces or not (busy: MachineBusy, uncached)
            install_planned_head(target, cache_dir=cache_dir, piece=piece)
            choose_kernels(target, cache_dir=cache_dir, piece=piece)
            target.ears_kernels_provisional = False
            if isinstance(pair.draft, torch.nn.Module):  # a draft model runs the kernels the target chose
                pack_like(target, pair.draft)
        found.append(Pending("the target's kernels", kernels))
    if head_folder is not None and getattr(pair.draft, "kernel_provisional", False):
        def head(piece: Any) -> None:  # the new template serves the generations that start after it
            pair.draft = load_head_draft(target, pair.dtype, pair.vocab_size, head_folder, measure=True, piece=piece)
        found.append(Pending("the draft head's kernels", head))
    return found


# ---------------------------------------------------------------- any spec: embedded, hub id, folder


def _resolve(spec: str, role: str, cache_dir: str | os.PathLike | None) -> tuple[str, bool]:
    """(folder or hub id, is_local_folder) for a spec."""
    if not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():
        raise ModelLoadError(f"the {role} must be 'embedded', a Hugging Face id or a folder, not {spec!r}")
    spec = str(spec)
    if spec == EMBEDDED:
        from ears_core.model.loading.embedded import prepare_embedded  # here: `python -m ears_core.model.loading.embedded` runs it as __main__

        folder = embedded_draft_dir() if role == "draft" else prepare_embedded(cache_dir)
        return str(folder), True
    return folder_or_hub_id(spec, role)


def _load_tokenizer(spec: str, role: str, cache_dir: Any, allow_download: bool) -> Any:
    return load_tokenizer(spec, *_resolve(spec, role, cache_dir), role, allow_download, backend=spec == EMBEDDED)


def _load_model(spec: str, role: str, device: torch.device, dtype: torch.dtype, cache_dir: Any,
                allow_download: bool, device_map: str | None) -> torch.nn.Module:
    """A target or draft model; on CUDA, with its passes as captured CUDA graphs where they can be (model/cuda/graphed.py)."""
    model = load_model(spec, *_resolve(spec, role, cache_dir), role, device, dtype, allow_download, device_map)
    if device.type == "cuda":
        from ears_core.model.cuda.graphed import graphed_or_eager
        model = graphed_or_eager(model)
    return model


def load_pair(target: str = EMBEDDED, draft: str | None = AUTO, *, device: str | torch.device | None = None,
              dtype: torch.dtype | str | None = None, cache_dir: str | os.PathLike | None = None,
              allow_download: bool = False) -> ModelPair:
    """Load a target and its draft with one shared tokenizer, in eval mode.

    draft: a spec (see the module's terms; ``resolve_draft``): "auto" by default, so ``load_pair()``
    is the embedded target with its trained head; None loads the target alone.

    Tokenizers are loaded and compared before any weights, so a mismatched pair fails fast.
    device: default cuda if available else cpu; "cuda" (no index) spreads the target with
    accelerate's device_map="auto". dtype: default ``resolve_dtype``'s (bfloat16 on CUDA and on a CPU with
    native bfloat16, there with exact rows: model/kernels/exact_rows.py; float32 on other CPUs).
    """
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {str(dev)!r} was asked for but no CUDA GPU is visible: use device 'cpu' "
                             "(EARS_DEVICE=cpu), or run on a machine / Space with a GPU")
    try:
        from ears_core.model.kernels.cpu_forms import mode
        mode()  # EARS_CPU_KERNELS read before any weights
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    dt = resolve_dtype(dtype, dev)
    chosen_here = dtype is None and not os.environ.get("EARS_DTYPE", "").strip()  # not the user's choice
    draft = resolve_draft(target, draft)
    # On the CPU, in a thread that exits: the caller keeps no OpenMP pool to throttle its decoding
    # (passing.py). On a GPU, in the caller's thread: ZeroGPU places weights on CUDA only from the
    # thread that imported `spaces` (its torch patches are per thread; ears_core/studio/zerogpu.py).
    run = in_passing_thread if dev.type == "cpu" else _here
    threads = torch.get_num_threads()
    # timing.py, crowded: one thread loads faster then. Probed in a passing thread too: a pool left here would
    # throttle every OpenMP region of a later passing thread (a Session's warm-up measuring prices) by ~1.6x.
    if dev.type == "cpu" and in_passing_thread(cores_crowded, threads):
        torch.set_num_threads(1)
    try:
        pair = run(_load_pair, target, draft, dev, dt, cache_dir, allow_download, chosen_here)
        if pair.rows_exact is False:  # asked for by the caller (a default that fails the check falls back)
            warnings.warn(f"{pair.name} in {dt}: a pass over several tokens does not give bit for bit the "
                          "logits of one-token passes on this CPU, so greedy speculative output may part from "
                          "target-only greedy output at near-ties; load it in float32 for exact greedy output",
                          stacklevel=2)
        return pair
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
    finally:
        torch.set_num_threads(threads)


def _here(fn: Any, *args: Any) -> Any:
    return fn(*args)


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


def _float_target(target: str, dev: torch.device, dt: torch.dtype, cache_dir: Any, allow_download: bool,
                  device_map: str | None, fall_back: bool) -> tuple[torch.nn.Module, torch.dtype, bool | None]:
    """The target as a transformers model in ``dt`` (on a CPU with the fastest kernels for a few rows here:
    output_head.py, packed_linear.py); its dtype, and whether its rows are exact (bfloat16 CPU targets).
    ``fall_back``: a bfloat16 CPU target whose rows are not exact is loaded again in float32."""
    model = _load_model(target, "target", dev, dt, cache_dir, allow_download, device_map)
    rows_exact = None
    if dev.type == "cpu":
        from ears_core.model.kernels.output_head import install_planned_head
        from ears_core.model.kernels.packed_linear import choose_kernels
        measure = dt != torch.float32  # bfloat16: the exactness check below reads the kernels in force
        install_planned_head(model, cache_dir=cache_dir, measure=measure)
        choose_kernels(model, cache_dir=cache_dir, measure=measure)
        if dt == torch.bfloat16:
            from ears_core.model.kernels.exact_rows import make_rows_exact
            rows_exact = make_rows_exact(model) is not None
            if not rows_exact and fall_back:  # only an exact target may be the default
                del model
                return _float_target(target, dev, torch.float32, cache_dir, allow_download, device_map, False)
    return model, dt, rows_exact


def _lean_target(fall_back: bool, cache_dir: Any) -> torch.nn.Module | None:
    """The embedded target's lean int4 form (model/loading/target_path.py) where ``EARS_LEAN`` and this machine call
    for it, else None; only the int4 kernel's one-row price against float32 is timed (kernels/cpu_forms.py: pays).
    ``fall_back``: the dtype is the default, not the caller's (a dtype asked for means the float target in it)."""
    from ears_core.model.kernels.cpu_forms import int4_pays
    from ears_core.model.loading.embedded import EMBEDDED_PIP
    from ears_core.model.loading.target_path import lean_embedded, requested

    try:
        want = requested()
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if want == "float" or (want == "auto" and not (fall_back and int4_pays())):
        return None
    lean = lean_embedded(Path(_resolve(EMBEDDED, "target", cache_dir)[0]), cache_dir)
    if lean is None and want == "lean":
        raise ModelLoadError("EARS_LEAN=1 but the lean int4 target cannot run here: it needs PyTorch's CPU int4 "
                             "kernel running with bfloat16 activations (tried at load), the GGUF of "
                             f"`{EMBEDDED_PIP}`, and exact rows; unset EARS_LEAN for the float target")
    return lean


def _why_not_lean() -> str:
    """Why the default left the embedded CPU target's lean form for the float one, for people."""
    from ears_core.model.kernels.cpu_forms import INT4_PAYS, int4_ratio

    ratio = int4_ratio()
    if ratio is None:
        return "PyTorch's int4 kernel does not run here"
    if ratio > INT4_PAYS:
        return f"the int4 kernel takes {ratio:.1f}x float32's time here"
    return "the lean target did not pass its load checks here"


def _load_pair(target: str, draft: str | None, dev: torch.device, dt: torch.dtype, cache_dir: Any,
               allow_download: bool, fall_back: bool = False) -> ModelPair:
    """The pair in ``dt``. ``fall_back``: ``dt`` is the default, not the caller's, so a bfloat16 CPU target
    whose rows are not exact (model/kernels/exact_rows.py) is loaded again in float32, before any draft loads."""
    tokenizer = _load_tokenizer(target, "target", cache_dir, allow_download)
    vocab_size = len(tokenizer)
    if draft == EMBEDDED:  # the head reads the embedded target's own hidden states and tokens
        if target != EMBEDDED:
            raise ModelLoadError("the embedded draft is a head on SmolLM2-135M-Instruct's hidden states: "
                                 "use it with target='embedded', or give a draft model sharing your target's tokenizer")
        embedded_draft_dir()  # fail before loading any weights
    elif draft not in (None, NGRAM) and not is_head_dir(draft):
        draft_tok = _load_tokenizer(draft, "draft", cache_dir, allow_download)
        vocab_size = check_tokenizers(tokenizer, draft_tok)
    device_map = "auto" if dev.type == "cuda" and dev.index is None else None
    target_model = _lean_target(fall_back, cache_dir) if target == EMBEDDED and dev.type == "cpu" else None
    if target_model is not None:  # the lean int4 target: bfloat16 activations, rows checked exact at load
        dt, rows_exact = torch.bfloat16, True
    else:
        target_model, dt, rows_exact = _float_target(target, dev, dt, cache_dir, allow_download, device_map, fall_back)
        if target == EMBEDDED and dev.type == "cpu" and fall_back:
            from ears_core.model.loading.target_path import requested
            if requested() == "auto":  # shown with the device (hub.describe_device)
                target_model.ears_lean_skipped = _why_not_lean()
    in_dev = target_model.get_input_embeddings().weight.device
    draft_model: Any = None
    head_folder = embedded_draft_dir() if draft == EMBEDDED else Path(str(draft)).expanduser() if is_head_dir(draft) \
        else None
    if draft == NGRAM:
        from ears_core.draft.drafters import NGramDrafter
        draft_model = NGramDrafter(vocab_size)
    elif head_folder is not None:
        draft_model = load_head_draft(target_model, dt, vocab_size, head_folder)
    elif draft is not None:  # a draft model runs the kernels the target chose (a head chooses its own)
        from ears_core.model.kernels.packed_linear import pack_like
        draft_model = _load_model(draft, "draft", in_dev, dt, cache_dir, allow_download, None)
        pack_like(target_model, draft_model)
    from ears_core.draft.drafters import model_vocab_size
    for role, model in (("target", target_model), ("draft", draft_model)):
        if isinstance(model, torch.nn.Module):
            if model_vocab_size(model) < vocab_size:
                raise ModelLoadError(f"the {role} model scores {model_vocab_size(model)} tokens but the tokenizer "
                                     f"has {vocab_size}: the model and tokenizer files do not belong together")
            model.ears_vocab_size = vocab_size  # padded head rows past the tokenizer are never emitted
    from ears_core.model.loading.embedded import EMBEDDED_NAME

    label = EMBEDDED_NAME if target == EMBEDDED else str(target)
    shown = {None: "", EMBEDDED: " <- embedded draft", NGRAM: " <- n-gram prompt lookup"}.get(draft, f" <- {draft}")
    pair = ModelPair(target_model, draft_model, tokenizer, in_dev, dt, label + shown, vocab_size, draft, rows_exact)
    pair.pending = _pending(pair, head_folder, cache_dir)
    return pair

