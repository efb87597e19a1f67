"""What the device charges: its price curve, the draft step and tokens/s like for like (the waits a round: waits.py).

Terms
-----
price curve     V(m) / V(1) for m = 1..16: a target pass over m new tokens in target steps
                (model/measuring/pass_times.py: the fastest of several interleaved passes on a 256-token cache).
draft step      one draft forward over one token, in ms and in target steps.
like for like   target-only against speculative decoding through the Session, each speculative run beside the
                one that differs from it in the device round alone: a chain of fixed k (no size policy) and the
                device chain at the same k; a tree of a fixed spec (no size policy, today's tree round) and the
                device tree of the same spec (decode/device_tree.py: its fixed widths). At T = 0 (greedy) and at
                EARS beta 0.1, T = 0.9 (``SETTINGS``).
tokens/s        each run's new tokens over its decode clock, summed over the prompts, the runs interleaved
                prompt by prompt; on CUDA a first pass over the first prompt warms kernels and caches, uncounted.
round parts     each run's decode clock per round: drafting (the drafter's steps and host reads), the
                target's pass, the rest of the round (verify, the verdict's host read, cache cuts, events),
                and what fell outside the rounds (the prefill, per-run setup).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ears_core.draft.fixed_trees import widths_for
from ears_core.draft.trees import TreeSpec
from ears_core.gpu_check.outcome import Check
from ears_core.model.measuring.pass_times import measure_pass_ms
from ears_core.pair import ModelPair
from ears_core.policy.costs import PriceCurve
from ears_core.policy.profile import measure_prices
from ears_core.serve.session import RunConfig, Session

__all__ = ["price_curve", "curve_of", "tokens_per_second", "like_for_like", "Setting", "SETTINGS",
           "MAX_M"]

MAX_M = 16


@dataclass(frozen=True)
class Setting:
    """A rule and temperature the like-for-like runs are timed at (module terms)."""

    label: str
    rule: str
    params: dict[str, float]
    temperature: float


SETTINGS = (Setting("T = 0", "greedy", {}, 0.0), Setting("EARS 0.1, T = 0.9", "ears", {"beta": 0.1}, 0.9))


def price_curve(pair: ModelPair, repeats: int = 5) -> Check:
    """The target's price curve m = 1..16 and the draft step (a draft model's own one-token pass), the fastest of
    ``repeats`` passes each."""
    draft = pair.draft if isinstance(pair.draft, torch.nn.Module) else None
    measured = measure_pass_ms(draft, max_m=1, cache_len=256, repeats=repeats)[0] if draft is not None else None
    curve = measure_prices(pair.target, measured, max_m=MAX_M, cache_len=256, repeats=repeats, vocab=pair.vocab_size,
                           key="gpu_check")  # a head's step: measure_prices's stand-in until rounds measure it
    verify_ms, draft_ms = curve.verify_ms, curve.draft_ms
    steps = [round(v / verify_ms[0], 2) for v in verify_ms]
    detail = (f"step {verify_ms[0]:.2f} ms; V(m) in steps, m = 1..{MAX_M}: {' '.join(f'{s:.2f}' for s in steps)}; "
              f"draft step {draft_ms:.2f} ms ({draft_ms / verify_ms[0]:.3f} of a step)")
    return Check("", "pass", detail, {"verify_ms": verify_ms, "steps": steps, "draft_ms": draft_ms})


def curve_of(check: Check) -> PriceCurve:
    """The price curve a passed ``price_curve`` check measured."""
    return PriceCurve(list(check.figures["verify_ms"]), check.figures["draft_ms"], 0.0, "gpu_check")


def _run(run: Any) -> tuple[float, ...]:
    """Drain a Tracked run -> (new tokens, decode seconds, rounds, drafted, accepted, then ms in the rounds'
    drafting, their target passes and the rest of the rounds: module terms, round parts)."""
    for _ in run:
        pass
    s = run.stats()
    steps = run.steps
    parts = [sum(getattr(r, name) for r in steps) for name in ("draft_ms", "target_ms", "overhead_ms")]
    return (s.new_tokens, s.decode_s, s.steps, s.drafted, s.accepted, *parts)


def like_for_like(setting: Setting, new_tokens: int, k: int, tree: tuple[int, int]) -> dict[str, RunConfig]:
    """The runs of one setting (module terms: like for like), by name; ``tree`` is (budget, depth)."""
    base = RunConfig(rule=setting.rule, params=dict(setting.params), temperature=setting.temperature, k=k,
                     max_new_tokens=new_tokens, draft_length="fixed", draft_shape="chain")
    fixed_tree = replace(base, draft_shape="tree", k=tree[1], tree_budget=tree[0])
    name = f"tree {tree[0]} nodes, depth {tree[1]}"
    return {"target-only": base, f"chain k={k}": base, f"device chain k={k}": replace(base, device_round=True),
            name: fixed_tree, f"device {name}": replace(fixed_tree, device_round=True)}


def _interleaved(session: Session, prompts: list[torch.Tensor], configs: dict[str, RunConfig], warm_up: bool
                 ) -> dict[str, list[float]]:
    """Every run of ``configs`` on every prompt, prompt by prompt -> summed ``_run`` figures by name."""
    totals = {name: [0, 0.0, 0, 0, 0, 0.0, 0.0, 0.0] for name in configs}
    for i, ids in enumerate([prompts[0], *prompts] if warm_up else prompts):
        for name, cfg in configs.items():
            got = _run(session.baseline(ids, cfg) if name == "target-only" else session.speculative(ids, cfg))
            if i > 0 or not warm_up:
                totals[name] = [a + b for a, b in zip(totals[name], got)]
    return totals


def tokens_per_second(session: Session, prompts: list[torch.Tensor], new_tokens: int, setting: Setting = SETTINGS[0],
                      k: int = 4, tree: tuple[int, int] = (8, 4), warm_up: bool = True) -> Check:
    """Target-only and the like-for-like runs of ``setting`` on the same prompts, interleaved (module terms)."""
    configs = like_for_like(setting, new_tokens, k, tree)
    totals = _interleaved(session, prompts, configs, warm_up)
    tps = {name: t[0] / max(t[1], 1e-9) for name, t in totals.items()}
    base = tps["target-only"]
    figures: dict[str, Any] = {
        name: {"tokens_per_s": round(tps[name], 1), "vs_target_only": round(tps[name] / base, 3), "rounds": t[2],
               "drafted": t[3], "accepted": t[4], "tokens_per_round": round(t[0] / max(t[2], 1), 2),
               "ms_per_round": _parts(t)} for name, t in totals.items()}
    names = list(configs)
    pairs = [(names[1], names[2]), (names[3], names[4])]  # today's round, then the device round of the same shape
    detail = f"target-only {base:.1f} tokens/s; " + "; ".join(
        f"{a} {tps[a]:.1f} ({tps[a] / base:.2f}x, {figures[a]['tokens_per_round']} a round), device "
        f"{tps[b]:.1f} ({tps[b] / base:.2f}x, {figures[b]['tokens_per_round']} a round, {tps[b] / tps[a]:.2f}x today's)"
        for a, b in pairs) + f"; {len(prompts)} prompts x {new_tokens} tokens, {setting.label}"
    figures["setting"] = {"label": setting.label, "rule": setting.rule, **setting.params,
                          "temperature": setting.temperature, "k": k, "tree_budget": tree[0], "tree_depth": tree[1],
                          "tree_widths": list(widths_for(TreeSpec(tree[0], tree[1]))), "prompts": len(prompts),
                          "new_tokens": new_tokens}
    return Check("", "pass", detail, figures)


def _parts(t: list[float]) -> dict[str, float]:
    """A run's decode clock per round, in ms: drafting, the target's pass, the rest of the round, and what
    the decode clock counted outside the rounds (the prefill, per-run setup)."""
    rounds = max(t[2], 1)
    outside = t[1] * 1000.0 - sum(t[5:8])
    return {name: round(v / rounds, 3) for name, v in
            (("draft", t[5]), ("target_pass", t[6]), ("rest", t[7]), ("outside_rounds", outside))}
