"""The model-pair picker: which pair is in memory, and loading another in its place.

Terms
-----
slot      the ``PairSlot`` holding the one pair in memory (loaded in the background from the app's
          build on; a switch checks the tokenizers first, so a bad pair fails while the current
          one stays).
label     a picker choice: a preset of ``models.PRESETS`` (the embedded pair first), the server's
          own pair when it is not a preset ("Server default: ..."), or ``CUSTOM`` for free text.
free text a target and a draft typed by the visitor (hub id or folder; an empty draft means the
          target's default draft, ``ngram`` prompt lookup); offered when ``Settings.custom_models``.
status    the line above the controls (``elem_id="pair_status"``): the pair loading (a server
          starts loading it when the app is built: ``PairSlot.preload``), ready with its device,
          failed (the next Generate tries again), or chosen (loads on the first request). While a
          load is under way the page asks again every ``STATUS_POLL_S`` seconds, then stops. Local
          folders show by their last part only (``errors.public_name``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from ears_core.pair import AUTO, NGRAM, PRESETS
from ears_core.serve.pair_slot import PairSlot

from .errors import InputError, fail, public_error, public_name

CUSTOM = "Custom: type a target and a draft below"
LOADING = "loading the model pair: the run starts when it is ready…"  # what a run waiting for the load shows
STATUS_POLL_S = 1.0


def _pair_text(target: str, draft: str | None) -> str:
    return target if draft in (None, AUTO) else f"{target} <- {draft}"


def model_status(slot: PairSlot) -> str:
    """The status line (see the module's terms)."""
    session = slot.loaded
    if session is not None:
        return f"**Ready:** {public_name(session.pair.name)} · runs on **{session.device_label}**"
    name = public_name(_pair_text(*slot.choice))
    where = {"auto": "a CUDA GPU if one is visible, else the CPU"}.get(slot.settings.device, slot.settings.device)
    state = slot.state
    if state == "loading":
        return f"**Loading:** {name} on {where}, and warming it up; a Generate sent now starts when it is ready"
    if state == "failed":
        return f"⚠️ **Not loaded:** {name}: {public_error(slot.error).rstrip('.')}. The next Generate tries again."
    return f"**Chosen:** {name} · loads on the first request, on {where}"


def build_status(slot: PairSlot, demo: gr.Blocks) -> gr.Markdown:
    """The status line and its refresh while the pair loads (see the module's terms); call inside
    ``demo`` where the line should show."""
    status = gr.Markdown(model_status(slot), elem_id="pair_status")
    timer = gr.Timer(STATUS_POLL_S, active=slot.state == "loading")

    def refresh_status() -> tuple[str, gr.Timer]:
        """The status line now, and whether to ask again."""
        return model_status(slot), gr.Timer(active=slot.state == "loading")

    timer.tick(refresh_status, None, [status, timer], api_name=False, queue=False)
    demo.load(refresh_status, None, [status, timer], api_name=False, queue=False)
    return status


def picker_labels(slot: PairSlot) -> tuple[list[str], str]:
    """(the picker's choices, the one shown first): see the module's terms."""
    labels = [p.label for p in PRESETS]
    default = next((p.label for p in PRESETS if slot.same((p.target, p.draft), slot.default)), None)
    if default is None:
        default = f"Server default: {public_name(_pair_text(*slot.default))}"
        labels.insert(0, default)
    return labels + ([CUSTOM] if slot.settings.custom_models else []), default


def pick(slot: PairSlot, label: str, target: str | None, draft: str | None) -> tuple[str, str | None]:
    """(target, draft spec) from the picker: a preset, the server's own pair, or free text."""
    preset = next((p for p in PRESETS if p.label == label), None)
    own = preset is None and label != CUSTOM and label == picker_labels(slot)[1]
    custom = slot.settings.custom_models
    if own and (not custom or not (target or "").strip()):
        return slot.default
    if not custom:
        if preset is None:
            raise InputError("This server offers the listed pairs only: pick one from the list.")
        return preset.target, preset.draft
    target, draft = (target or "").strip(), (draft or "").strip()
    if not target:
        if preset is None:
            raise InputError("Type a target (a Hugging Face id or a folder), or pick a pair from the list.")
        return preset.target, preset.draft
    if len(target) > 300 or len(draft) > 300:
        raise InputError("A model name is at most 300 characters.")
    return target, (NGRAM if draft.lower() in (NGRAM, "none") else draft or AUTO)


def make_load(slot: PairSlot) -> Callable:
    def load(label, target, draft, progress=gr.Progress(track_tqdm=True)):
        """Load the picked pair in place of the current one; failures are a message, never a traceback."""
        try:
            target, draft = pick(slot, label, target, draft)
            progress(0.0, desc="checking the tokenizers")
            slot.switch(target, draft, progress=lambda desc: progress(0.1, desc=desc))
            return model_status(slot), ""
        except Exception as exc:
            return model_status(slot), fail(exc)

    return load


@dataclass
class Picker:
    pick: gr.Dropdown
    target: gr.Textbox
    draft: gr.Textbox
    status: gr.Markdown
    message: gr.Markdown


def build(slot: PairSlot, status: gr.Markdown) -> Picker:
    """The "Model pair" panel and its handler (``/load``), which updates ``status``
    (``build_status``); call inside the app's Blocks."""
    settings = slot.settings
    with gr.Accordion("Model pair", open=False, elem_id="picker"):
        labels, default = picker_labels(slot)
        with gr.Row():
            chooser = gr.Dropdown(labels, value=default, label="Pair (target <- draft, one shared tokenizer)",
                                  elem_id="pick", scale=3)
            load_btn = gr.Button("Load", elem_id="load", scale=1)
        own = not any(p.label == default for p in PRESETS)  # a configured pair may be a folder: no path shown
        target0, draft0 = slot.default
        with gr.Row(visible=settings.custom_models):
            target = gr.Textbox("" if own else target0, label="target: Hugging Face id or folder", max_length=300,
                                elem_id="pick_target")
            draft = gr.Textbox("" if own or draft0 == AUTO else draft0 or "",
                               label="draft: id or folder (empty: the default; 'ngram': prompt lookup)",
                               max_length=300, elem_id="pick_draft")
        gr.Markdown("The embedded pair runs anywhere, offline. The others come from the Hugging Face hub and "
                    "need a GPU for the 7B / 8B targets; one pair is in memory at a time.")
        msg = gr.Markdown("", elem_id="pair_message")

    def fill(label: str) -> tuple[Any, Any]:
        p = next((p for p in PRESETS if p.label == label), None)
        if p is not None:
            return p.target, p.draft
        if label == default and label != CUSTOM:  # the server's own pair: no path in the page
            return "", ""
        return gr.skip(), gr.skip()

    chooser.change(fill, chooser, [target, draft], api_name=False)
    load_btn.click(make_load(slot), [chooser, target, draft], [status, msg], api_name="load", concurrency_limit=1)
    return Picker(chooser, target, draft, status, msg)
