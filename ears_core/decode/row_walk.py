"""A chain round's verify pass with its output head walked row by row, up to the first draft that falls: for CPUs
whose head costs about its row count in rows.

Terms
-----
row        row j of a chain's verify pass over [last, x_1 .. x_k] (rounds.py) judges draft x_{j+1}; row k is the
           bonus position.
growth     the target's head costs grow with its rows (``head_grows_with_rows``: model/kernels/exact_head.py): on
           a CPU without native bfloat16 the head's (V, d) product is arithmetic, about its row count times one
           row, where oneDNN's packed head on native bfloat16 takes several rows for about the price of one
           (docs/measurements.md, "A verify pass's head, row by row").
walk       the pass runs without its head (``head=False``: the kept rows' final states); row 0's probabilities are
           computed, then, while the drafts so far stand, the next row's. A draft is decided from its own row
           alone (the rule's ``row_by_row``), so the walk stops at the first draft that falls and the rows after it
           stay 0. verify() reads rows 0 .. n only (the n drafts that stood, then the rejected or the bonus row),
           each with the bits the whole pass gives it (the head's rows are exact), so the round's decisions and
           tokens are the whole pass's; a round that keeps n of k drafts pays the head n + 1 rows instead of k + 1.
walks      where a chain walks: a CPU target with ``head_logits`` whose head grows with its rows, under a rule that
           decides row by row (not FLy, which looks ahead, nor the budget, whose beta reads every row).
"""

from __future__ import annotations

from torch import Tensor

from ears_core.decode.rounds import RoundContext
from ears_core.decode.verify import decide_drafts

__all__ = ["walk_rows", "walks"]


def walks(ctx: RoundContext) -> bool:
    """Whether a chain round walks its verify pass's head here (module terms: walks)."""
    target = ctx.target
    return (ctx.device.type == "cpu" and callable(getattr(target, "head_logits", None))
            and bool(getattr(target, "head_grows_with_rows", False)) and ctx.rule.row_by_row)


def walk_rows(ctx: RoundContext, states: Tensor, tokens: Tensor, draft_probs: Tensor, accept_u: Tensor
              ) -> tuple[Tensor, int]:
    """The head walked over a verify pass's kept rows (module terms): states (k + 1, d) from the pass run with
    ``head=False``, tokens (1, k) its drafts, draft_probs (1, k, V), accept_u (1, k) the round's acceptance draws.
    -> the target probabilities (1, k + 1, V), 0 in the rows after the first draft that fell, and the rows scored."""
    target, k = ctx.target, tokens.shape[1]
    first = ctx.probs_fn(target.head_logits(states[:1])[None])  # (1, 1, V)
    probs = first.new_zeros(1, k + 1, first.shape[-1])  # (1, k + 1, V)
    probs[:, :1] = first
    scored = 1
    for j in range(k):  # draft j, judged by row j (row j + 1, still 0, stands in as the decision's bonus row)
        d = decide_drafts(probs[:, j: j + 2], draft_probs[:, j: j + 1], tokens[:, j: j + 1], ctx.rule,
                          accept_u[:, j: j + 1], check=False)
        if not bool(d.num_accepted[0]):  # a host read: free on the CPU
            break
        probs[:, j + 1: j + 2] = ctx.probs_fn(target.head_logits(states[j + 1: j + 2])[None])
        scored += 1
    return probs, scored
