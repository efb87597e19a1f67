"""The device round against today's round: the same decisions and the same tokens, draw for draw.

Terms
-----
device round   the chain and tree rounds that decide with tensor operations and read the host once a round
               (decode/device_round.py: ``device_verify``; decode/device_tree.py and device_walk.py:
               ``device_walk``), selected with ``device_round=True``.
today's round  the rounds that decide on the host: verify() on its CPU path (the input guard on,
               ``emitted_only``: each row's own residual or bonus draw) and ``tree_walk.walk_tree``.
same verdict   for the same draws, ``device_verify`` on the device and verify() on the CPU give the same
               accepted counts, kinds and next tokens; ``device_walk`` on the device and ``walk_tree`` on the
               CPU the same accepted counts, kinds, paths and next tokens. Every registered rule, and for the
               tree both sibling kinds. Rows end every way a round ends (the first draft rejected, some drafts
               standing, every draft standing: a bonus token), or the check fails for want of power.
tree rows      a tree of ``TREE_PARENTS`` drafted as a drafter drafts: each entry's children drawn without
               replacement from the entry's draft distribution (sampled siblings; fixed siblings take them
               in order of probability), each child's q the distribution it was drawn from given its earlier
               siblings (verify_tree.py's terms); for the greedy rule siblings in order of probability.
same run       a whole decode on the small pair (synthetic.py) in float32 at T = 0.9 with and without
               ``device_round`` emits the same tokens: the chain at a fixed k, the tree with the first spec
               of ``TREE_SPECS`` that the device tree takes for the rule (``DeviceTreeShape.takes``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import torch
from torch import Tensor

from ears_core.decode.api import generate, tree_generate
from ears_core.decode.device_round import device_verify
from ears_core.decode.device_tree import DeviceTreeShape
from ears_core.decode.device_walk import device_walk
from ears_core.decode.tree_walk import walk_tree
from ears_core.decode.verify import verify
from ears_core.decode.verify_tree import children, depths
from ears_core.draft.trees import TreeSpec
from ears_core.gpu_check.correctness import PROMPTS, TREE_PARENTS, random_round
from ears_core.gpu_check.outcome import Check
from ears_core.gpu_check.synthetic import small_pair
from ears_core.rules import RULES, make_rule

__all__ = ["same_verdicts", "same_runs", "RULE_PARAMS", "TREE_SPECS"]

RULE_PARAMS = dict(beta=0.3, epsilon=0.05, gate=0.2, window=1)  # loose enough that every lossy rule pardons
TREE_SPECS = ((6, 2, 2), (3, 1, 3))  # budget, depth, width: full trees (today's builder draws the same nodes)
CHAIN_FIELDS = ("num_accepted", "kinds", "next_token")
TREE_FIELDS = ("num_accepted", "kinds", "path", "next_token")


def _differences(label: str, ref: Any, got: Any, fields: Sequence[str]) -> list[str]:
    """'label field: N rows' for every field in which ``got`` (any device) differs from ``ref`` (the CPU)."""
    out = []
    for name in fields:
        a, b = getattr(ref, name), getattr(got, name).cpu()
        bad = int((a != b).reshape(a.shape[0], -1).any(dim=1).sum())
        if bad:
            out.append(f"{label} {name}: {bad} rows")
    return out


def tree_rows(b: int, v: int, seed: int, fixed: bool) -> tuple[Tensor, ...]:
    """Seeded tree rows (module terms): target (B, N+1, V), draft (B, N, V), tokens (B, N), uniforms (B, N),
    sample uniforms (B, D+1)."""
    parents, g = TREE_PARENTS, torch.Generator().manual_seed(seed)
    n = len(parents)
    tp = torch.softmax(2.5 * torch.randn(b, n + 1, v, generator=g), -1)  # (B, N+1, V): per entry
    dq = torch.softmax(tp.log() + torch.randn(b, n + 1, v, generator=g), -1)  # (B, N+1, V): the draft per entry
    dp, tokens = torch.empty(b, n, v), torch.empty(b, n, dtype=torch.long)
    for e, kids in enumerate(children(parents)):  # a handful of entries and ranks
        left = dq[:, e].clone()  # (B, V): the entry's draft, less the siblings drawn so far
        for c in kids:
            dp[:, c] = left / left.sum(-1, keepdim=True)
            tokens[:, c] = dp[:, c].argmax(-1) if fixed else torch.multinomial(dp[:, c], 1, generator=g).squeeze(1)
            left.scatter_(1, tokens[:, c:c + 1], 0.0)
    d = max(depths(parents))
    return tp, dp, tokens, torch.rand(b, n, generator=g), torch.rand(b, d + 1, generator=g)


def _chain(name: str, device: torch.device, rows: int, k: int, vocab: int) -> tuple[list[str], Tensor]:
    tp, dp, tokens, u, su = random_round(rows, k, vocab, seed=13)
    if name == "greedy":
        tokens = dp.argmax(-1)  # (B, K): a greedy drafter's tokens, which the target's argmax often is
    ref = verify(tp, dp, tokens, make_rule(name, **RULE_PARAMS), uniforms=u, sample_uniforms=su, check=True,
                 emitted_only=True)
    got = device_verify(tp.to(device), dp.to(device), tokens.to(device), make_rule(name, **RULE_PARAMS),
                        u.to(device), su.to(device))
    return _differences(f"device_verify {name}", ref, got, CHAIN_FIELDS), ref.num_accepted


def _tree(name: str, device: torch.device, rows: int, vocab: int, siblings: str) -> tuple[list[str], Tensor, Tensor]:
    tp, dp, tokens, u, su = tree_rows(rows, vocab, seed=17, fixed=siblings == "fixed" or name == "greedy")
    ref = walk_tree(tp, dp, tokens, TREE_PARENTS, make_rule(name, **RULE_PARAMS), uniforms=u, sample_uniforms=su,
                    siblings=siblings)
    got = device_walk(tp.to(device), dp.to(device), tokens.to(device), TREE_PARENTS, make_rule(name, **RULE_PARAMS),
                      uniforms=u.to(device), sample_uniforms=su.to(device), siblings=siblings)
    return _differences(f"device_walk {name} {siblings}", ref, got, TREE_FIELDS), ref.num_accepted, ref.is_bonus


def same_verdicts(device: torch.device, rows: int = 256, k: int = 6, vocab: int = 256) -> Check:
    """device_verify and device_walk on ``device`` against verify and walk_tree on the CPU, every registered rule
    (module terms: same verdict)."""
    mismatches: list[str] = []
    ends: Counter = Counter()  # how the rows' rounds ended, over every rule: power
    for name in RULES:
        bad, n = _chain(name, device, rows, k, vocab)
        mismatches += bad
        ends.update({"chain: first rejected": int((n == 0).sum()), "chain: some stood": int(((n > 0) & (n < k)).sum()),
                     "chain: bonus": int((n == k).sum())})
        for siblings in ("sampled", "fixed"):
            bad, n, bonus = _tree(name, device, rows, vocab, siblings)
            mismatches += bad
            ends.update({"tree: first rejected": int((n == 0).sum()), "tree: some stood": int(((n > 0) & ~bonus).sum()),
                         "tree: bonus": int(bonus.sum())})
    weak = [end for end, count in ends.items() if count == 0]
    figures = {"rules": list(RULES), "rows": rows, "ends": dict(ends)}
    if mismatches or weak:
        return Check("", "fail", "; ".join(mismatches + [f"no row ended {end}" for end in weak]),
                     {**figures, "mismatches": mismatches})
    return Check("", "pass", f"device_verify and device_walk on {device.type} = verify and walk_tree on the CPU: "
                 f"{len(RULES)} rules x {rows} rows, K = {k} and a {len(TREE_PARENTS)}-node tree (sampled and fixed "
                 f"siblings), V = {vocab}", figures)


def tree_spec_for(name: str) -> tuple[int, int, int]:
    """The first of ``TREE_SPECS`` the device tree takes for the rule ``name`` (module terms: same run)."""
    return next(s for s in TREE_SPECS if DeviceTreeShape.takes(make_rule(name, **RULE_PARAMS), TreeSpec(*s)))


def _both(target: Any, draft: Any, ids: Tensor, name: str, shape: str, k: int, kw: dict) -> tuple[list[int], list[int]]:
    """The tokens of one run without and with the device round."""
    if shape == "chain":
        def go(on: bool) -> list[int]:
            return generate(target, draft, ids, rule=make_rule(name, **RULE_PARAMS), k=k, device_round=on, **kw).token_ids
    else:
        budget, depth, width = tree_spec_for(name)

        def go(on: bool) -> list[int]:
            return tree_generate(target, draft, ids, rule=make_rule(name, **RULE_PARAMS), budget=budget, depth=depth,
                                 width=width, device_round=on, **kw).token_ids
    return go(False), go(True)


def same_runs(device: torch.device, rules: Sequence[str] = tuple(RULES), prompts: int = 3, new_tokens: int = 48,
              k: int = 4, temperature: float = 0.9) -> Check:
    """Whole runs with and without the device round, chain and tree, every rule in ``rules`` (module terms:
    same run)."""
    target, draft = small_pair(device, torch.float32)
    parted, runs, tokens = [], 0, 0
    for name in rules:
        for i, prompt in enumerate(PROMPTS[:prompts]):
            ids = torch.tensor([prompt], device=device)  # (1, T)
            kw = dict(temperature=temperature, max_new_tokens=new_tokens, seed=i)
            for shape in ("chain", "tree"):
                today, on_device = _both(target, draft, ids, name, shape, k, kw)
                runs, tokens = runs + 2, tokens + len(today)
                if today != on_device:
                    j = next((t for t, (a, b) in enumerate(zip(today, on_device)) if a != b), min(len(today), len(on_device)))
                    parted.append(f"{name} {shape}, prompt {prompt}: parts at token {j}")
    figures = {"rules": list(rules), "runs": runs, "tokens": tokens, "k": k, "trees": {n: tree_spec_for(n) for n in rules}}
    if parted:
        return Check("", "fail", "; ".join(parted), {**figures, "parted": parted})
    return Check("", "pass", f"the same tokens with and without the device round: {len(rules)} rules x {prompts} prompts "
                 f"x {new_tokens} tokens at T = {temperature:g}, chain k = {k} and a fixed tree, float32", figures)
