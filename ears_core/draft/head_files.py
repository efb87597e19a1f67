"""An EAGLE-style head (draft/eagle.py) loaded from its folder as a target's drafter, in the variant that
drafts fastest here (draft/head_kernels.py).

Terms
-----
head folder   ``head.json`` and ``head.safetensors`` (scripts/train_draft.py), optionally ``calibration.json``
              (scripts/calibrate_draft.py); the embedded target's ships in ``EMBEDDED_DRAFT_DIR``.
provisional   with nothing measured here yet the head loads in the default variant, marked ``kernel_provisional``;
              ``load_head_draft(..., measure=True)`` times the variants and caches the choice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ears_core.draft.head_kernels import Variant, candidates, choose_head_variant
from ears_core.model.loading.hub import ModelLoadError

__all__ = ["EMBEDDED_DRAFT_DIR", "embedded_draft_available", "embedded_draft_dir", "is_head_dir", "load_head_draft"]

EMBEDDED_DRAFT_DIR = Path(__file__).resolve().parent.parent.parent / "assets" / "embedded_draft"


def embedded_draft_available() -> bool:
    """Whether the trained draft head ships in assets/embedded_draft/ (scripts/train_draft.py)."""
    return (EMBEDDED_DRAFT_DIR / "head.json").is_file()


def embedded_draft_dir() -> Path:
    """The shipped draft: an EAGLE-style head (head.json + head.safetensors) for the embedded target."""
    if not embedded_draft_available():
        raise ModelLoadError(f"the embedded draft is not built yet ({EMBEDDED_DRAFT_DIR} has no head.json): use "
                             "draft=None for target-only decoding, NGramDrafter, or a draft id / folder sharing the "
                             "target's tokenizer; or train it with scripts/draft_data.py and scripts/train_draft.py")
    return EMBEDDED_DRAFT_DIR


def is_head_dir(spec: Any) -> bool:
    """Whether a draft spec is a folder holding an EAGLE-style head (module terms: head folder)."""
    return spec is not None and (Path(str(spec)).expanduser() / "head.json").is_file()


def load_head_draft(target_model: torch.nn.Module, dtype: torch.dtype, vocab_size: int, folder: Path,
                     measure: bool = False, piece: Any = None) -> Any:
    """The head in ``folder`` as a drafter, in the dtype and kernels that draft fastest here (head_kernels.py):
    as measured before, else measured now (``measure``), else the default variant, marked provisional."""
    device = target_model.get_input_embeddings().weight.device
    try:
        variants = candidates(device, dtype, int4=getattr(target_model, "ears_kernels", "") == "lean-int4")
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    drafter, choice = choose_head_variant(target_model, lambda v: head_drafter(target_model, v, vocab_size, folder),
                                          variants, vocab_size, measure=measure, piece=piece)
    drafter.kernel_choice = choice  # None when there was nothing to choose between, or nothing measured yet
    drafter.kernel_provisional = len(variants) > 1 and choice is None
    return drafter


def head_drafter(target_model: torch.nn.Module, variant: Variant, vocab_size: int, folder: Path) -> Any:
    """The head in ``folder`` as a drafter in one variant: its dtype, its layers packed or as loaded."""
    from ears_core.draft.eagle import DraftHead, EagleDrafter

    emb = target_model.get_input_embeddings().weight  # (V, d)
    # on a CPU its body is weights only (plain_body.py): it drafts by hand there, never through the general forward
    plain = emb.device.type == "cpu"
    head, width = DraftHead.load(folder, dtype=variant.torch_dtype, plain=plain).to(emb.device), emb.shape[1]
    if head.config.hidden_size != width:
        raise ModelLoadError(f"the draft head in {folder} is {head.config.hidden_size} wide but the target's hidden "
                             f"states are {width}: a head only drafts for the target it was trained on")
    drafter = EagleDrafter(head, target_model, vocab_size)
    if variant.packed:
        drafter.pack_kernels()
    if variant.int4:
        drafter.quantize_kernels(rows=variant.int4_rows)
    calibration = folder / "calibration.json"  # scripts/calibrate_draft.py
    if calibration.is_file():
        drafter.calibration_table = json.loads(calibration.read_text())
    return drafter
