"""The acceptance rules the plug-in can put inside vLLM, as a shift of vLLM's uniform draws.

vLLM's random-sampling acceptance (``rejection_random_sample_kernel``, and its CPU twin) accepts
draft token x at a position when

    draft_p > 0  and  target_p(x) / draft_p(x) >= u          (draft_p = 1 when the drafter gives none)

with u ~ Uniform[0, 1) (float64, the request's own generator when it has a seed). EARS Studio's
ratio rules (``ears_core.verify``) accept when

    p(x) > 0  and  p(x) / q(x) >= max(u - tolerance, 0)

so handing vLLM's kernel  u' = max(u - tolerance, TINY)  instead of u makes vLLM decide exactly as
the library does: TINY (the smallest normal float32, 1.2e-38) > 0 keeps a token with p = 0 out, as
the library's guard does, and the CPU kernel's float32 cast keeps it > 0. The only tokens decided
differently are those with 0 < p / q < 1.2e-38.

A rule here is a tolerance per drafted position, from the target's probabilities there (after
temperature, top-k and top-p: what vLLM hands its kernel):

    standard       0                                   (vLLM's own rule, draw for draw)
    ears           beta * (1 - max_v P_target(v))      (seed 000; ears_core.EARSRule)
    ears-entropy   beta * H(P_target) / log V          (ears_core.EntropyEARSRule)

ears_core's other registry rules do not fit a per-token shift of u: greedy is vLLM's own greedy
path, typical acceptance and FLy decide by other tests, ears-budget keeps state across rounds.
The arithmetic below is the library's, in the same dtype (float32 probabilities, the tolerance in
float32 like ``EARSRule.tolerance``), so the decisions agree bit for bit (tests/test_differential.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TINY = float(torch.finfo(torch.float32).tiny)  # 1.1755e-38: > 0 after the CPU kernel's float32 cast

# name -> (takes beta?, aliases). Names as in ears_core's registry.
RULES = {
    "standard": (False, ("ordinary", "lossless")),
    "ears": (True, ()),
    "ears-entropy": (True, ("entropy",)),
}
NOT_PER_TOKEN = {"greedy": "vLLM's greedy requests (temperature 0) are its own argmax path, untouched",
                 "typical": "typical acceptance is a probability floor, not a shift of the uniform draw",
                 "fly": "FLy defers a rejection by looking at the drafts after it",
                 "ears-budget": "ears-budget keeps a distortion budget across rounds of one generation"}


@dataclass(frozen=True)
class RuleConfig:
    """One rule as the plug-in applies it: its registry name and beta (0 for ``standard``)."""

    name: str
    beta: float = 0.0

    def describe(self) -> str:
        return self.name if self.name == "standard" else f"{self.name}(beta={self.beta:g})"


def canonical_name(name: str) -> str | None:
    key = name.strip().lower()
    for rule, (_, aliases) in RULES.items():
        if key == rule or key in aliases:
            return rule
    return None


def tolerance(rule: RuleConfig, target_probs: torch.Tensor) -> torch.Tensor | None:
    """(N, V) float32 target probabilities -> (N,) float32 tolerance, or None for no shift."""
    if rule.name == "standard" or rule.beta == 0:
        return None
    if rule.name == "ears":
        return rule.beta * (1.0 - target_probs.amax(dim=-1))
    if rule.name == "ears-entropy":
        v = target_probs.shape[-1]
        if v <= 1:
            return None
        logp = torch.where(target_probs > 0, target_probs.log(), torch.zeros_like(target_probs))
        entropy = -(target_probs * logp).sum(dim=-1)
        return rule.beta * entropy / math.log(v)
    raise ValueError(f"no tolerance for rule {rule.name!r}")


def shifted_uniforms(uniforms: torch.Tensor, tol: torch.Tensor | None) -> torch.Tensor:
    """u' = max(u - tolerance, TINY), in u's dtype (vLLM's float64)."""
    if tol is None:
        return uniforms.clamp(min=TINY)
    return (uniforms - tol.to(uniforms.dtype)).clamp_(min=TINY)
