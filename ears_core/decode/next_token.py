"""The next token: the one token a verifier emits where its drafts stop, drawn one way on every path.

Terms (next token, residual, bonus: verify.py and verify_tree.py; ``next_mass``: rules/base.py)
-----
stop       where a row's drafts end: a chain's position n, a tree's stop entry.
faced      (..., V) the distribution the last test at the stop faced: in a chain P_target at n; in a tree the
           residual the stop entry's last rejected child faced (P_target at the entry for rank 0). At a bonus
           stop it is P_target there.
q_last     (..., V) the draft distribution of the draft rejected at the stop (None where every row is a bonus).
bonus      no draft was rejected at the stop (a chain's n == K, a tree's leaf): the token comes from
           ``rule.bonus(P_target)``.
draw       one uniform U and an inverse-CDF search on an unnormalised cumulative mass (``sampling.search_cdf``):
           the first token whose cumulative mass is above U times the total. The mass is
           ``rule.next_mass(faced, q_last, is_bonus)``: after a rejection the residual (for a ratio rule
           max(0, faced - q_last) not normalised, and faced itself where that has no mass), at a bonus
           ``rule.bonus(faced)``, picked per row by ``torch.where`` (no host read), then one cumulative sum. All in
           float32. The host chain (verify), the host tree (verify_tree, tree_walk), the
           device chain (device_verify) and the device tree (device_walk) all call ``draw_after``, so for the same
           draws they emit the same token, bit for bit, on any device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ears_core.rules import AcceptanceRule
from ears_core.sampling import search_cdf

__all__ = ["draw_after", "draw_next"]


def draw_after(rule: AcceptanceRule, faced: Tensor, q_last: Tensor | None, is_bonus: Tensor | bool,
               u: Tensor) -> Tensor:
    """The next token of each row (module terms). faced (..., V), q_last (..., V) or None, u (...,) -> (...,) long.
    ``is_bonus``: (...,) bool, or one Python bool for every row."""
    faced = faced.float()
    if q_last is None or is_bonus is True:
        return search_cdf(rule.bonus(faced).float().cumsum(dim=-1), u)
    if is_bonus is False:
        is_bonus = torch.zeros(faced.shape[:-1], dtype=torch.bool, device=faced.device)  # (...,)
    return search_cdf(rule.next_mass(faced, q_last.float(), is_bonus).float().cumsum(dim=-1), u)


def draw_next(rule: AcceptanceRule, target_probs: Tensor, draft_probs: Tensor, num_accepted: Tensor,
              top: Tensor | None, u: Tensor) -> Tensor:
    """A chain's next token after each row's n drafts, with no host read: the target's argmax at n on the argmax
    path (``top`` (B, K+1)), else ``draw_after`` at n. target_probs (B, K+1, V), draft_probs (B, K, V),
    num_accepted (B,), u (B,) -> (B,)."""
    b, k1, _ = target_probs.shape
    k = k1 - 1
    if top is not None:
        return top.gather(1, num_accepted.unsqueeze(-1)).squeeze(1)  # (B,)
    rows = torch.arange(b, device=target_probs.device)  # (B,): row selection by index, not a gather over V
    at_n = target_probs[rows, num_accepted]  # (B, V)
    if k == 0:
        return draw_after(rule, at_n, None, True, u)
    draft_at_n = draft_probs[rows, num_accepted.clamp(max=k - 1)]  # (B, V): unused for a bonus row
    return draw_after(rule, at_n, draft_at_n, num_accepted == k, u)
