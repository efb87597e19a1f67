"""What the device charges: its price curve, the draft step, tokens/s, and host syncs per round.

Terms
-----
price curve     V(m) / V(1) for m = 1..16: a target pass over m new tokens in target steps
                (model/measuring/pass_times.py: the fastest of several interleaved passes on a 256-token cache).
draft step      one draft forward over one token, in ms and in target steps.
tokens/s        target-only against speculative decoding through the Session with the draft-length
                policy (draft length "policy", K = 8), chain, the device chain (decode/device_round.py: one host
                read a round) and tree shapes, and the device tree (decode/device_tree.py: a fixed tree of 8
                nodes, depth 4, one host read a round), T = 0, on the same prompts interleaved; each run's new
                tokens over its decode clock, summed over the prompts.
round parts     each run's decode clock per round: drafting (the drafter's steps and host reads), the
                target's pass, the rest of the round (verify, the verdict's host read, cache cuts, events),
                and what fell outside the rounds (the prefill, per-run setup).
host syncs      on CUDA, ``torch.cuda.set_sync_debug_mode`` flags every operation that makes the host
                wait for the device; counted over one fixed-K run and divided by its rounds. A per-position
                ``.item()`` in the loop would make the count grow with K: K = 2 and K = 8 are compared.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import torch

from ears_core.gpu_check.outcome import Check
from ears_core.model.measuring.pass_times import measure_pass_ms
from ears_core.pair import ModelPair
from ears_core.policy.costs import PriceCurve
from ears_core.policy.profile import measure_prices
from ears_core.serve.session import RunConfig, Session

__all__ = ["price_curve", "curve_of", "tokens_per_second", "host_syncs", "MAX_M"]

MAX_M = 16


def price_curve(pair: ModelPair) -> Check:
    """The target's price curve m = 1..16 and the draft step (a draft model's own one-token pass)."""
    draft = pair.draft if isinstance(pair.draft, torch.nn.Module) else None
    measured = measure_pass_ms(draft, max_m=1, cache_len=256, repeats=5)[0] if draft is not None else None
    curve = measure_prices(pair.target, measured, max_m=MAX_M, cache_len=256, repeats=5, vocab=pair.vocab_size,
                           key="gpu_check")  # a head's step: measure_prices's stand-in until rounds measure it
    verify_ms, draft_ms = curve.verify_ms, curve.draft_ms
    steps = [round(v / verify_ms[0], 2) for v in verify_ms]
    detail = (f"step {verify_ms[0]:.2f} ms; V(m) in steps, m = 1..{MAX_M}: {' '.join(f'{s:.2f}' for s in steps)}; "
              f"draft step {draft_ms:.2f} ms ({draft_ms / verify_ms[0]:.3f} of a step)")
    return Check("", "pass", detail, {"verify_ms": verify_ms, "steps": steps, "draft_ms": draft_ms})


def curve_of(check: Check) -> PriceCurve:
    """The price curve a passed ``price_curve`` check measured."""
    return PriceCurve(list(check.figures["verify_ms"]), check.figures["draft_ms"], 0.0, "gpu_check")


def _config(shape: str, new_tokens: int, length: str = "policy", k: int = 8) -> RunConfig:
    return RunConfig(rule="greedy", params={}, temperature=0.0, k=k, max_new_tokens=new_tokens, draft_length=length,
                     draft_shape=shape)


def _device_tree(new_tokens: int) -> RunConfig:
    """A fixed tree of 8 nodes, depth 4, on the device (decode/device_tree.py: widths (2, 1, 1, 1))."""
    return replace(_config("tree", new_tokens, "fixed", 4), tree_budget=8, device_round=True)


def _run(run: Any) -> tuple[float, ...]:
    """Drain a Tracked run -> (new tokens, decode seconds, rounds, drafted, accepted, then ms in the rounds'
    drafting, their target passes and the rest of the rounds: module terms, round parts)."""
    for _ in run:
        pass
    s = run.stats()
    steps = run.steps
    parts = [sum(getattr(r, name) for r in steps) for name in ("draft_ms", "target_ms", "overhead_ms")]
    return (s.new_tokens, s.decode_s, s.steps, s.drafted, s.accepted, *parts)


def tokens_per_second(session: Session, prompts: list[torch.Tensor], new_tokens: int) -> Check:
    """Target-only, chain policy and tree policy on the same prompts, interleaved (module terms)."""
    names = ("target-only", "chain", "device chain", "tree", "device tree")
    totals = {name: [0, 0.0, 0, 0, 0, 0.0, 0.0, 0.0] for name in names}
    for i, ids in enumerate([prompts[0], *prompts]):  # the first pass is the warm-up (kernels, caches): not counted
        runs = {"target-only": session.baseline(ids, _config("chain", new_tokens)),
                "chain": session.speculative(ids, _config("chain", new_tokens)),
                "device chain": session.speculative(ids, replace(_config("chain", new_tokens), device_round=True)),
                "tree": session.speculative(ids, _config("tree", new_tokens)),
                "device tree": session.speculative(ids, _device_tree(new_tokens))}
        for name, run in runs.items():
            got = _run(run)
            if i > 0:
                totals[name] = [a + b for a, b in zip(totals[name], got)]
    tps = {name: t[0] / t[1] for name, t in totals.items()}
    figures = {name: {"tokens_per_s": round(tps[name], 1), "rounds": t[2], "drafted": t[3], "accepted": t[4],
                      "tokens_per_round": round(t[0] / max(t[2], 1), 2), "ms_per_round": _parts(t)}
               for name, t in totals.items()}
    base = tps["target-only"]
    detail = (f"target-only {base:.1f} tokens/s; chain {tps['chain']:.1f} ({tps['chain'] / base:.2f}x, "
              f"{figures['chain']['tokens_per_round']} a round); device chain {tps['device chain']:.1f} "
              f"({tps['device chain'] / base:.2f}x); tree {tps['tree']:.1f} ({tps['tree'] / base:.2f}x, "
              f"{figures['tree']['tokens_per_round']} a round); device tree {tps['device tree']:.1f} "
              f"({tps['device tree'] / base:.2f}x, {figures['device tree']['tokens_per_round']} a round); "
              f"{len(prompts)} prompts x {new_tokens} tokens, T = 0")
    return Check("", "pass", detail, figures)


def _parts(t: list[float]) -> dict[str, float]:
    """A run's decode clock per round, in ms: drafting, the target's pass, the rest of the round, and what
    the decode clock counted outside the rounds (the prefill, per-run setup)."""
    rounds = max(t[2], 1)
    outside = t[1] * 1000.0 - sum(t[5:8])
    return {name: round(v / rounds, 3) for name, v in
            (("draft", t[5]), ("target_pass", t[6]), ("rest", t[7]), ("outside_rounds", outside))}


def _syncs(session: Session, ids: torch.Tensor, cfg: RunConfig) -> tuple[int, int]:
    """(host syncs flagged, rounds) over one run on CUDA."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run = session.speculative(ids, cfg)
            for _ in run:
                pass
        finally:
            torch.cuda.set_sync_debug_mode("default")
    flagged = sum("synchroniz" in str(w.message) for w in seen)
    return flagged, run.stats().steps


def host_syncs(session: Session, ids: torch.Tensor, new_tokens: int = 64) -> Check:
    """Host syncs per round for fixed K = 2 and K = 8 chains, the device chain, a fixed tree and the device tree
    (module terms)."""
    if session.pair.device.type != "cuda":
        return Check("", "skip", "host syncs are counted on CUDA only (a host read is free on the CPU)", {})
    per_round = {}
    for label, cfg in (("chain K=2", _config("chain", new_tokens, "fixed", 2)),
                       ("chain K=8", _config("chain", new_tokens, "fixed", 8)),
                       ("device chain K=8", replace(_config("chain", new_tokens, "fixed", 8), device_round=True)),
                       ("tree 8 nodes", replace(_config("tree", new_tokens, "fixed", 4), tree_budget=8)),
                       ("device tree 8 nodes", _device_tree(new_tokens))):
        flagged, rounds = _syncs(session, ids, cfg)
        per_round[label] = round(flagged / max(rounds, 1), 2)
    # the device chain reads the host once a round (decode/device_round.py); the prefill's reads spread over the
    # rounds. The device tree's count is shown, not judged: it reads once too, but still copies its tree's
    # structure (masks, positions, draws) from the host each round, which CUDA may count (decode/device_tree.py)
    grows = per_round["chain K=8"] > per_round["chain K=2"] + 1.0 or per_round["device chain K=8"] > 1.5
    detail = ", ".join(f"{k}: {v} a round" for k, v in per_round.items())
    return Check("", "fail" if grows else "pass",
                 detail + ("; the count grows with K, or the device round reads the host more than once a round"
                           if grows else ""), per_round)
