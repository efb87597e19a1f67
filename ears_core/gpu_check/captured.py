"""Captured against eager: the same pair with its passes replayed as CUDA graphs (the default on CUDA) and
without them.

Terms
-----
twin         the eager form of a captured pair: the same weights, run by transformers' forward (a
             GraphedLM's ``model``) and, for an EAGLE head, by ``HeadLayers`` (the drafter's
             ``cuda_graphs`` off).
capture      seconds spent capturing graphs (model/cuda/cuda_graphs.py): the target's and the draft's widths
             1..16 on the first KV bucket, captured before anything is timed (``prepare``), as a first
             load would; later captures (another bucket) are added when they happen.
same tokens  target-only greedy tokens, captured against eager, prompt by prompt: equal, or parting only
             at a near-tie (correctness.parting: the float numbers differ in kernel order, so a tie at
             bfloat16 precision may fall either way).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch

from ears_core.decode.api import autoregressive
from ears_core.gpu_check.correctness import parting
from ears_core.gpu_check.outcome import Check
from ears_core.model.cuda.graphed import MAX_WIDTH, GraphedHead, GraphedLM
from ears_core.pair import ModelPair

__all__ = ["eager_twin", "prepare", "capture_seconds", "same_tokens", "graphed_parts"]


def _head_of(draft: Any) -> Any:
    head = getattr(draft, "head", None)
    return head.__dict__.get("_ears_graphed") if head is not None else None


def graphed_parts(pair: ModelPair) -> list[Any]:
    """The pair's graphed models: its target, its draft model or its drafter's graphed head."""
    parts = [m for m in (pair.target, pair.draft) if isinstance(m, GraphedLM)]
    head = _head_of(pair.draft)
    return parts + ([head] if isinstance(head, GraphedHead) else [])


def eager_twin(pair: ModelPair) -> ModelPair:
    """The pair without graphs (module terms: twin)."""
    target = pair.target.model if isinstance(pair.target, GraphedLM) else pair.target
    draft = pair.draft
    if isinstance(draft, GraphedLM):
        draft = draft.model
    elif hasattr(draft, "cuda_graphs"):
        draft = copy.copy(draft)
        draft.cuda_graphs = False
    return replace(pair, target=target, draft=draft, name=pair.name + " (eager)")


@torch.inference_mode()
def prepare(pair: ModelPair, prompt: torch.Tensor) -> float:
    """Capture every width of the pair's graphed models now (module terms: capture) -> seconds it took."""
    if hasattr(pair.draft, "cuda_graphs") and pair.draft.cuda_graphs:  # build the drafter's graphed head
        drafter = pair.new_drafter()
        out = pair.target(prompt, output_hidden_states=True)
        from ears_core.draft.drafters import target_features
        drafter.prefill(prompt, target_features(out, drafter))
    before = capture_seconds(pair)
    for part in graphed_parts(pair):
        part.warm(range(1, MAX_WIDTH + 1))
    return capture_seconds(pair) - before


def capture_seconds(pair: ModelPair) -> float:
    return sum(p.capture_s for p in graphed_parts(pair))


@torch.inference_mode()
def same_tokens(captured: ModelPair, eager: ModelPair, prompts: list[torch.Tensor], new_tokens: int) -> Check:
    """Target-only greedy tokens, captured against eager (module terms: same tokens)."""
    same, ties = 0, []
    for ids in prompts:
        want = autoregressive(eager.target, ids, temperature=0.0, max_new_tokens=new_tokens).token_ids
        got = autoregressive(captured.target, ids, temperature=0.0, max_new_tokens=new_tokens).token_ids
        parted = parting(eager.target, ids, want, got, eager.vocab_size)
        if parted is None:
            same += 1
            continue
        j, gap, band = parted
        if gap > band:
            return Check("", "fail", f"captured target-only parts from eager at token {j} (top-2 gap {gap:.3g} > tie "
                         f"band {band:.3g})", {"position": j, "gap": gap})
        ties.append({"position": j, "gap": gap})
    note = f"; {len(ties)} parted at a near-tie only" if ties else ""
    return Check("", "pass", f"captured = eager target-only greedy on {same} of {len(prompts)} prompts x {new_tokens} "
                 f"tokens{note}", {"same": same, "prompts": len(prompts), "near_ties": ties})
