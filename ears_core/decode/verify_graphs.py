"""The device round's decisions as one captured CUDA graph per shape: a round's verify in one launch.

Terms (device round, packed read: device_round.py; graph bank: model/cuda/cuda_graphs.py)
-----
decide       what a device chain round computes between its target pass and its one host read: ``device_verify``
             (the rule's tests, the leading run n, the next token's draw, p / q / max P / distortion) and the packed
             vector (``RoundHost.pack``): at K = 4, 99 operations greedy and 136 for EARS with its distortion (views
             among them). On a GPU each kernel costs the host a launch, a few microseconds: for a small pair a
             sizeable part of a round.
static       the inputs (P_target (1, k+1, V), P_draft (1, k, V), the drafted ids (1, k), the round's draws, the
             drafter's support and confidences) copied into buffers kept per key; the decide reads only those, so
             a graph captured over them replays for any round of that key.
key          what a graph bakes in: k, the inputs' shapes and dtypes, whether the distortion is computed, and the
             rule (its class and its plain-valued parameters). A rule holding anything else (the distortion budget's
             per-round state) is not capturable and decides eagerly, as off CUDA.
outputs      the graph's packed vector and next token are the same tensors at every replay: the next token is
             cloned before the next round can replay over it; the packed vector is read at once (HostReader).
switch       ``EARS_CUDA_GRAPHS`` (cuda_graphs.py), as the passes; off CUDA every decide is eager, through the same
             static buffers when a ``VerifyGraphs`` is asked to (the tests), else straight.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import Tensor

from ears_core.model.cuda.cuda_graphs import GraphBank, graphs_wanted
from ears_core.rules import AcceptanceRule

__all__ = ["VerifyGraphs", "decide_once", "rule_key", "graphs_for", "status"]

_PLAIN = (bool, int, float, str)


def rule_key(rule: AcceptanceRule) -> tuple | None:
    """The rule's part of a key (module terms), or None where the rule holds more than plain parameters."""
    items = sorted(vars(rule).items())
    if any(not isinstance(v, _PLAIN) for _, v in items):
        return None
    return (type(rule).__module__, type(rule).__qualname__, tuple(items))


def decide_once(verifier: Any, rule: AcceptanceRule, inputs: dict[str, Tensor | None], with_distortion: bool,
                pack: Any) -> tuple[Tensor, Tensor]:
    """(packed vector, next token (1,)): the decide (module terms) run once on ``inputs``, without a graph."""
    v = verifier(inputs["target_probs"], inputs["draft_probs"], inputs["tokens"], rule, inputs["uniforms"],
                 inputs["sample_uniforms"], with_distortion=with_distortion, check=False,
                 draft_support=inputs["support"])
    return pack(v, inputs["tokens"], inputs["confidences"]), v.next_token


def _spec(t: Tensor | None) -> tuple | None:
    return None if t is None else (tuple(t.shape), t.dtype)


class VerifyGraphs:
    """Graphs of a device's decides by key (module terms)."""

    def __init__(self, device: torch.device, capture: bool | None = None) -> None:
        self.bank = GraphBank(device, graphs_wanted(device) if capture is None else capture)
        self.io: dict[Any, dict[str, Any]] = {}
        self.lock = threading.Lock()  # a copy-in, replay and copy-out at a time

    @property
    def capture_s(self) -> float:
        return self.bank.capture_s

    def decide(self, verifier: Any, rule: AcceptanceRule, inputs: dict[str, Tensor | None], with_distortion: bool,
               pack: Any) -> tuple[Tensor, Tensor]:
        """(packed vector, next token (1,)) of ``pack(verifier(...), tokens, confidences)`` over static copies of
        ``inputs`` (target_probs, draft_probs, tokens, uniforms, sample_uniforms, support, confidences)."""
        rk = rule_key(rule)
        if rk is None:
            raise ValueError(f"{rule!r} holds per-run state: decide it eagerly (module terms: key)")
        key = (rk, with_distortion, *((name, _spec(t)) for name, t in sorted(inputs.items())))
        with self.lock:
            io = self.io.get(key)
            if io is None:
                io = self.io[key] = {name: None if t is None else torch.empty_like(t) for name, t in inputs.items()}
            for name, t in inputs.items():
                if t is not None:
                    io[name].copy_(t)

            packed, next_token = self.bank.run(key, lambda: decide_once(verifier, rule, io, with_distortion, pack))
            return packed, next_token.clone()  # module terms: outputs


_BANKS: dict[torch.device, VerifyGraphs] = {}
_BANKS_LOCK = threading.Lock()


def graphs_for(device: torch.device, rule: AcceptanceRule) -> VerifyGraphs | None:
    """The device's decide graphs where its decides are captured and ``rule`` can be (module terms), else None:
    kept for the process, so a graph captured in one run replays in the next."""
    if not graphs_wanted(device) or rule_key(rule) is None:
        return None
    with _BANKS_LOCK:
        graphs = _BANKS.get(device)
        if graphs is None:
            graphs = _BANKS[device] = VerifyGraphs(device)
        return graphs if graphs.bank.capture else None  # a failed capture: eager from then on (cuda_graphs.py)


def status(device: torch.device) -> dict[str, Any]:
    """The device's decide graphs so far: how many, the seconds capturing them, and why capture stopped (or None)."""
    graphs = _BANKS.get(device)
    if graphs is None:
        return {"graphs": 0, "capture_s": 0.0, "failed": None}
    return {"graphs": len(graphs.bank.graphs), "capture_s": round(graphs.capture_s, 3), "failed": graphs.bank.failed}
