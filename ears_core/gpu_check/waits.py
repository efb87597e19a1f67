"""The device rounds' waits on this device: exactly one a round, the packed read (decode/waits.py's terms); and
target-only decoding's: one read every ``READ_EVERY`` tokens off the CPU (decode/baseline.py).

Terms
-----
runs        the device chain at K = 2 and at K = 8, and the device tree of 8 nodes, depth 4 (widths (2, 1, 1, 1)),
            each greedy (T = 0) and with EARS (beta 0.3) at T = 0.9 with its distortion on (the default),
            through the Session with a fixed draft length (decode/device_round.py, decode/device_tree.py).
counted     every round after the first: its reads, tensors made from Python data and host-to-device copies
            (decode/waits.py, from the round's ``propose`` to the end of its ``commit``). On CUDA those rounds
            also run under ``torch.cuda.set_sync_debug_mode("error")``: a wait CUDA itself sees raises (the
            read's own wait, an event's, is not one it flags). The first round is left out: it may make what
            later rounds reuse (a pinned buffer, a kernel's plan).
verdict     pass when every counted round of every run makes one read and nothing else; fail naming the first
            round of a run that did not, with its call sites. Skipped for a drafter that drafts from host data
            (an n-gram lookup: no ``propose_tree``).
baseline    target-only greedy decoding of ``new_tokens`` after its prefill, counted (on CUDA under the sync debug
            mode after the first read): no tensor from Python, no copy, and at most one read per ``READ_EVERY``
            tokens on a GPU (per token on the CPU) plus the ones its ``READ_MS`` bound adds.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ears_core.decode import baseline
from ears_core.decode.api import autoregressive_stream
from ears_core.decode.device_round import DeviceChainShape
from ears_core.decode.device_tree import DeviceTreeShape
from ears_core.decode.waits import Waits, counting, counting_rounds
from ears_core.gpu_check.outcome import Check
from ears_core.serve.session import RunConfig, Session

__all__ = ["baseline_waits", "round_waits", "RUNS", "RULES"]

RUNS = (("chain K=2", "chain", 2), ("chain K=8", "chain", 8), ("tree 8 nodes", "tree", 4))  # label, shape, K or depth
RULES = (("greedy", {}, 0.0), ("ears", {"beta": 0.3}, 0.9))  # name, parameters, temperature


def _rounds(session: Session, ids: torch.Tensor, cfg: RunConfig) -> list[Waits] | str:
    """Each round's waits over one run (module terms: counted), or what a wait CUDA saw raised."""
    device = session.pair.device
    shape_cls = DeviceTreeShape if cfg.draft_shape == "tree" else DeviceChainShape
    try:
        with counting_rounds(shape_cls, device, sync_errors=device.type == "cuda") as rounds:
            for _ in session.speculative(ids, cfg):
                pass
    except RuntimeError as exc:  # sync debug mode "error": a wait CUDA saw, in a round after the first
        return f"a wait CUDA flagged: {str(exc).splitlines()[0]}"
    return rounds


def _judged(name: str, rounds: list[Waits] | str) -> tuple[dict[str, Any], str | None]:
    """(figures, the first fault or None) of one run."""
    if isinstance(rounds, str):
        return {"error": rounds}, f"{name}: {rounds}"
    counted = rounds[1:]
    figures = {"rounds": len(counted), **{k: sum(getattr(w, k) for w in counted) for k in ("read", "python", "copy")}}
    if not counted:
        return figures, f"{name}: no round after the first (too few new tokens)"
    for i, w in enumerate(counted, start=2):
        if (w.read, w.python, w.copy) != (1, 0, 0):
            return figures, f"{name}: round {i} made {w}"
    return figures, None


def round_waits(session: Session, ids: torch.Tensor, new_tokens: int = 32) -> Check:
    """The device rounds' waits on the session's device (module terms): one read a round and nothing else."""
    if not hasattr(session.pair.new_drafter(), "propose_tree"):
        return Check("", "skip", "the pair's drafter drafts from host data (an n-gram lookup): its rounds make "
                     "tensors from Python lists by design", {})
    figures: dict[str, Any] = {}
    faults = []
    for label, shape, k in RUNS:
        for rule, params, temperature in RULES:
            name = f"device {label} {rule}"
            cfg = RunConfig(rule=rule, params=dict(params), temperature=temperature, k=k, max_new_tokens=new_tokens,
                            draft_length="fixed", draft_shape=shape, tree_budget=8, device_round=True)
            figures[name], fault = _judged(name, _rounds(session, ids, cfg))
            if fault is not None:
                faults.append(fault)
    cuda = session.pair.device.type == "cuda"
    rounds = sum(f.get("rounds", 0) for f in figures.values())
    how = "counted and under CUDA's sync debug mode" if cuda else "counted on the CPU"
    if faults:
        return Check("", "fail", f"{len(faults)} of {len(figures)} runs waited more than once a round ({how}): "
                     + "; ".join(faults), figures)
    return Check("", "pass", f"{rounds} rounds of {len(figures)} runs (chain K = 2, 8; tree of 8; greedy and EARS "
                 f"0.3 at T = 0.9 with its distortion): 1 read a round, no tensor from Python, no copy ({how})", figures)


def baseline_waits(session: Session, ids: torch.Tensor, new_tokens: int = 32) -> Check:
    """Target-only decoding's waits on the session's device (module terms: baseline)."""
    pair, device = session.pair, session.pair.device
    every = baseline.reads_every(device)
    events = autoregressive_stream(pair.target, ids.to(device), temperature=0.0, max_new_tokens=new_tokens,
                                   eos_token_id=[], vocab_size=pair.vocab_size)  # no end-of-sequence stop
    first = next(events)  # the prefill and the first read: what later passes reuse is made there
    sync = device.type == "cuda"
    try:
        with counting(device) as w:
            if sync:
                torch.cuda.set_sync_debug_mode("error")
            try:
                made = 1 + sum(1 for _ in events)
            finally:
                if sync:
                    torch.cuda.set_sync_debug_mode("default")
    except RuntimeError as exc:
        return Check("", "fail", f"a wait CUDA flagged: {str(exc).splitlines()[0]}", {})
    after = made - every  # tokens after the first read
    allowed = math.ceil(after / every)
    figures = {"tokens": made, "read_every": every, "read": w.read, "python": w.python, "copy": w.copy,
               "allowed_reads": allowed, "first_token": first.token_id}
    if w.python or w.copy or made != new_tokens:
        return Check("", "fail", f"target-only decoding made {w} over {after} tokens after its first read", figures)
    extra = w.read - allowed
    note = f" ({extra} more where a pass outlasted {baseline.READ_MS:.0f} ms)" if extra > 0 else ""
    status = "pass" if extra <= after // 2 else "fail"  # the time bound may add reads, never one a token
    return Check("", status, f"target-only: {w.read} reads over {after} tokens after the first read, one per "
                 f"{every} token(s){note}; no tensor from Python, no copy", figures)
