"""The device's answers to the decoding questions that have exact answers.

Terms
-----
greedy equality   at temperature 0 speculative decoding (chain and tree rounds, greedy rule; today's rounds
                  and the device rounds, ``device_round=True``) must emit the target's own greedy tokens. In a low-precision dtype a pass over m tokens may round a
                  logit differently from a pass over one, so the two outputs may part where the target's
                  top two logits are equal at that precision (a *near-tie*: gap <= ``TIE_ULPS`` units in
                  the last place of the dtype at the logits' size). A parting anywhere else fails.
lossless          the ordinary rule emits exactly P_target: a chi-square test of the tokens emitted at
                  the first position of many seeded rows (verify(), or the device round's device_verify,
                  batched on the device) against P_target; EARS against the exact distribution it emits
                  (verify.py's terms).
same decisions    for the same uniforms, verify() and verify_tree() on the device, unchecked (the decode
                  loop's CUDA path), decide exactly as on the CPU with the input checks on: the same
                  accepted counts, kinds, paths and next tokens.
bad draft ids     on the unchecked path a draft id outside [0, V) is rejected where it is reached and
                  never read as token 0; the next token stays inside the vocabulary.
rollback          after a chain round's rejection the KV cache, cut back to the tokens that stood, equals a
                  fresh prefill of those tokens and predicts the same next logits.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from scipy import stats

from ears_core.decode.api import autoregressive, generate, tree_generate
from ears_core.decode.verify import DraftKind, Verdict, check_enabled, verify
from ears_core.decode.verify_tree import depths, verify_tree
from ears_core.gpu_check.outcome import Check
from ears_core.gpu_check.synthetic import small_pair
from ears_core.model.passes.kv_cache import drop_last_positions
from ears_core.rules import AcceptanceRule, EARSRule, GreedyRule, StandardRule

__all__ = ["parting", "greedy_equality", "lossless", "emitted_distribution", "same_decisions", "bad_draft_ids", "rollback",
           "random_round", "TIE_ULPS", "PROMPTS", "TREE_PARENTS"]

TIE_ULPS = 4
PROMPTS = ([1, 5, 7, 9], [0, 42, 3], [3, 17, 17, 60, 2, 88, 11, 4, 30], [77], [250, 1000, 31, 31, 31, 7])
TREE_PARENTS = [-1, -1, -1, 0, 0, 1, 3, 3, 3, 3, 5, 5]  # 12 nodes, depth 3
STOPS = max(depths(TREE_PARENTS)) + 1  # depths a tree walk may stop at: one sample draw each


def parting(target: torch.nn.Module, ids: torch.Tensor, ref: list[int], got: list[int], vocab: int | None = None
            ) -> tuple[int, float, float] | None:
    """Where ``got`` parts from the target's own greedy ``ref`` after the prompt ``ids`` (1, T): None if they
    are equal, else (position, top-2 logit gap there, the dtype's tie band at that size: module terms)."""
    j = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if j is None:
        return None if len(ref) == len(got) else (min(len(ref), len(got)), float("inf"), 0.0)
    seq = torch.cat([ids, torch.tensor([ref[:j]], dtype=torch.long, device=ids.device)], 1)  # (1, T + j)
    with torch.no_grad():
        logits = target(seq).logits[0, -1, :vocab].float()  # (V,)
    top2 = logits.topk(2).values
    band = TIE_ULPS * torch.finfo(next(target.parameters()).dtype).eps * float(top2[0].abs())
    return j, float(top2[0] - top2[1]), band


def _greedy_runs(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> dict:
    """Today's chain (K = 4) and tree (budget 8, depth 4) rounds and the device rounds at T = 0 on one prompt."""
    chain = dict(rule=GreedyRule(), k=4, temperature=0.0, max_new_tokens=new_tokens)
    tree = dict(rule=GreedyRule(), budget=8, depth=4, temperature=0.0, max_new_tokens=new_tokens)
    return {"chain": generate(target, draft, ids, **chain), "tree": tree_generate(target, draft, ids, **tree),
            "device chain": generate(target, draft, ids, device_round=True, **chain),
            "device tree": tree_generate(target, draft, ids, device_round=True, **tree)}


def greedy_equality(device: torch.device, dtype: torch.dtype, new_tokens: int = 48, captured: bool = False,
                    prompts: int = len(PROMPTS)) -> Check:
    """Chain (K = 4) and tree rounds, today's and the device's, at T = 0 against the target's own greedy
    decoding on the first ``prompts`` prompts. ``captured``: both models run the static pass, as captured CUDA
    graphs on CUDA (model/cuda/graphed.py)."""
    target, draft = small_pair(device, dtype)
    if captured:
        from ears_core.model.cuda.graphed import GraphedLM
        target, draft = GraphedLM(target, capture=device.type == "cuda"), GraphedLM(draft, capture=device.type == "cuda")
    ties, accepted, drafted = [], 0, 0
    for prompt in PROMPTS[:prompts]:
        ids = torch.tensor([prompt], device=device)
        ref = autoregressive(target, ids, temperature=0.0, max_new_tokens=new_tokens).token_ids
        runs = _greedy_runs(target, draft, ids, new_tokens)
        for shape, out in runs.items():
            accepted, drafted = accepted + out.stats.accepted, drafted + out.stats.drafted
            parted = parting(target, ids, ref, out.token_ids)
            if parted is None:
                continue
            j, gap, band = parted
            if gap > band:
                return Check("", "fail", f"{shape} parts from the target's greedy output at token {j} of prompt "
                             f"{prompt} (top-2 gap {gap:.3g} > tie band {band:.3g})",
                             {"prompt": prompt, "position": j, "gap": gap, "shape": shape})
            ties.append({"shape": shape, "prompt": prompt, "position": j, "gap": gap})
    rate = accepted / max(drafted, 1)
    note = f"; {len(ties)} parted at a near-tie only" if ties else ""
    return Check("", "pass", f"chain, tree, device chain and device tree = target greedy on {prompts} prompts x "
                 f"{new_tokens} tokens (acceptance {rate:.2f}){note}",
                 {"acceptance": rate, "near_ties": ties, "shapes": list(runs)})


def emitted_distribution(rule: AcceptanceRule, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(V,) what one verified position emits (float64): q(y) a(y) + (1 - sum_x q(x) a(x)) res(y), with
    a(x) = min(1, p/q + tol) and 0 where p = 0 (the rule's residual ``res``)."""
    p, q = p.double(), q.double()
    tol = rule.tolerance(p.view(1, 1, -1), p.max().view(1, 1)).double().view(())  # () the rule's band
    a = torch.where(p > 0, (p / q.clamp(min=1e-10) + tol).clamp(max=1.0), torch.zeros_like(p))
    res = rule.residual(p.view(1, -1), q.view(1, -1)).double().view(-1)
    return q * a + (1 - (q * a).sum()) * res


def lossless(device: torch.device, rows: int = 200_000, vocab: int = 32, rule: AcceptanceRule | None = None,
             expect: str = "target", verifier: Callable[..., Verdict] = verify) -> Check:
    """Chi-square of first-position tokens from ``rows`` seeded rows of ``verifier`` (verify(), or the device
    round's device_verify) on the device against P_target (``expect="target"``) or the rule's exact emitted
    distribution (``expect="emitted"``)."""
    rule = rule or StandardRule()
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(2.0 * torch.randn(vocab, generator=g), -1)  # (V,)
    q = torch.softmax(p.log() + 1.0 * torch.randn(vocab, generator=g), -1)  # (V,): an imperfect draft
    gd = torch.Generator(device=device).manual_seed(11)
    tp = p.to(device).expand(rows, 2, vocab)  # (B, 2, V): the judged position and the bonus position
    dp = q.to(device).expand(rows, 1, vocab)  # (B, 1, V)
    tokens = torch.multinomial(q.to(device), rows, replacement=True, generator=gd).view(rows, 1)  # (B, 1)
    u = torch.rand((rows, 1), generator=gd, device=device)  # (B, 1) the acceptance draws
    su = torch.rand((rows, 2), generator=gd, device=device)  # (B, 2) the next token's draw at n = 0 and n = 1
    v = verifier(tp, dp, tokens, rule, uniforms=u, sample_uniforms=su, check=False)
    first = torch.where(v.num_accepted >= 1, tokens[:, 0], v.next_token)  # (B,)
    counts = torch.bincount(first, minlength=vocab).cpu().double().numpy()
    law = (p.double() if expect == "target" else emitted_distribution(rule, p, q)).numpy()
    test = stats.chisquare(counts, law / law.sum() * rows)
    tv = 0.5 * float(abs(counts / rows - law).sum())
    status = "pass" if test.pvalue > 1e-3 else "fail"
    return Check("", status, f"{rule.describe()} through {verifier.__name__}: {rows} rows, chi-square p = "
                 f"{test.pvalue:.3f}, TV to the {'target' if expect == 'target' else 'exact emitted'} law {tv:.4f}",
                 {"pvalue": float(test.pvalue), "tv": tv, "rows": rows, "verifier": verifier.__name__})


def random_round(b: int, n: int, v: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Seeded probabilities for one round: target (B, N+1, V), draft (B, N, V), tokens (B, N), uniforms."""
    g = torch.Generator().manual_seed(seed)
    tp = torch.softmax(2.5 * torch.randn(b, n + 1, v, generator=g), -1)
    dp = torch.softmax(tp[:, :n].log() + torch.randn(b, n, v, generator=g), -1)
    tokens = torch.multinomial(dp.reshape(-1, v), 1, generator=g).view(b, n)
    return tp, dp, tokens, torch.rand(b, n, generator=g), torch.rand(b, n + 1, generator=g)


def same_decisions(device: torch.device, rows: int = 256, k: int = 6, vocab: int = 512) -> Check:
    """verify() and verify_tree() on ``device`` unchecked against the CPU checked, same uniforms."""
    mismatches: list[str] = []
    for rule in (StandardRule(), EARSRule(beta=0.3), GreedyRule()):
        tp, dp, tokens, u, su = random_round(rows, k, vocab, seed=3)
        ref = verify(tp, dp, tokens, rule, uniforms=u, sample_uniforms=su, check=True)
        dev = verify(tp.to(device), dp.to(device), tokens.to(device), rule, uniforms=u.to(device),
                     sample_uniforms=su.to(device), check=False)
        for field in ("num_accepted", "kinds", "next_token"):
            bad = int((getattr(ref, field) != getattr(dev, field).cpu()).sum())
            if bad:
                mismatches.append(f"verify {rule.describe()} {field}: {bad} rows")
        n = len(TREE_PARENTS)
        tp, dp, tokens, u, su = random_round(rows, n, vocab, seed=4)
        su = su[:, :STOPS]  # (B, D + 1): one draw per depth the walk may stop at
        ref_t = verify_tree(tp, dp, tokens, TREE_PARENTS, rule, uniforms=u, sample_uniforms=su, check=True)
        dev_t = verify_tree(tp.to(device), dp.to(device), tokens.to(device), TREE_PARENTS, rule,
                            uniforms=u.to(device), sample_uniforms=su.to(device), check=False)
        for field in ("num_accepted", "path", "kinds", "next_token"):
            bad = int((getattr(ref_t, field) != getattr(dev_t, field).cpu()).sum())
            if bad:
                mismatches.append(f"verify_tree {rule.describe()} {field}: {bad} rows")
    if mismatches:
        return Check("", "fail", "; ".join(mismatches), {"mismatches": mismatches})
    return Check("", "pass", f"verify and verify_tree on {device.type} (unchecked) = CPU (checked): "
                 f"3 rules x {rows} rows, K = {k} and a {len(TREE_PARENTS)}-node tree", {})


def bad_draft_ids(device: torch.device, rows: int = 64, k: int = 4, vocab: int = 512) -> Check:
    """Ids outside [0, V) on the unchecked path: rejected where reached, never token 0 (chain and tree)."""
    tp, dp, tokens, u, su = random_round(rows, k, vocab, seed=5)
    tokens[:, 0] = torch.where(torch.arange(rows) % 2 == 0, vocab + 3, -1)  # every row: a bad first draft
    v = verify(tp.to(device), dp.to(device), tokens.to(device), StandardRule(), uniforms=torch.zeros_like(u).to(device),
               sample_uniforms=su.to(device), check=False)  # U = 0: every good draft would stand
    kinds, nxt = v.kinds.cpu(), v.next_token.cpu()
    problems = []
    if bool((v.num_accepted.cpu() != 0).any()) or bool((kinds[:, 0] != int(DraftKind.REJECTED)).any()):
        problems.append("a bad first draft stood")
    if bool(((nxt < 0) | (nxt >= vocab)).any()):
        problems.append("a next token outside the vocabulary")
    tp, dp, tt, u, su = random_round(rows, len(TREE_PARENTS), vocab, seed=6)
    tt[:, :3] = vocab + 7  # the root's three children
    vt = verify_tree(tp.to(device), dp.to(device), tt.to(device), TREE_PARENTS, StandardRule(),
                     uniforms=torch.zeros_like(u).to(device), sample_uniforms=su[:, :STOPS].to(device), check=False)
    if bool((vt.num_accepted.cpu() != 0).any()):
        problems.append("a tree node with a bad id stood")
    if bool(((vt.next_token.cpu() < 0) | (vt.next_token.cpu() >= vocab)).any()):
        problems.append("a tree's next token outside the vocabulary")
    guard = "on" if check_enabled(device) else "off (EARS_DEBUG=1 turns it on)"
    if problems:
        return Check("", "fail", "; ".join(problems), {})
    return Check("", "pass", f"ids {vocab + 3}, -1 and {vocab + 7} rejected, next tokens in [0, {vocab}); "
                 f"the decode loop's input guard on {device.type} is {guard}", {})


@torch.no_grad()
def rollback(device: torch.device, dtype: torch.dtype, drafts: int = 6, stood: Sequence[int] = (0, 2, 5)) -> Check:
    """A chain round's cache cut back after a rejection against a fresh prefill of what stood."""
    from transformers import DynamicCache

    target, _ = small_pair(device, dtype)
    atol = 1e-5 if dtype == torch.float32 else 2e-2  # relative to the largest value
    prompt = torch.tensor([PROMPTS[2]], device=device)  # (1, T)
    g = torch.Generator().manual_seed(9)
    tail = torch.randint(0, 4096, (1, drafts + 1), generator=g).to(device)  # (1, K + 1): last token and K drafts
    worst = 0.0  # the largest difference, relative to the largest value of the fresh prefill's tensor
    for n in stood:
        cache = DynamicCache(config=target.config)
        target(prompt, past_key_values=cache, use_cache=True)
        target(tail, past_key_values=cache, use_cache=True)  # the verify pass over the last token and K drafts
        drop_last_positions(cache, drafts - n)  # what the chain round does when n drafts stood
        fresh = DynamicCache(config=target.config)
        target(torch.cat([prompt, tail[:, : n + 1]], 1), past_key_values=fresh, use_cache=True)
        if cache.get_seq_length() != fresh.get_seq_length():
            return Check("", "fail", f"n = {n}: {cache.get_seq_length()} cached positions, a fresh prefill has "
                         f"{fresh.get_seq_length()}", {})
        pairs = [(a.keys, b.keys) for a, b in zip(cache.layers, fresh.layers)]
        pairs += [(a.values, b.values) for a, b in zip(cache.layers, fresh.layers)]
        nxt = tail[:, :1]
        pairs.append((target(nxt, past_key_values=cache, use_cache=True).logits[0, -1],
                      target(nxt, past_key_values=fresh, use_cache=True).logits[0, -1]))
        for a, b in pairs:
            worst = max(worst, float((a.float() - b.float()).abs().max()) / max(1e-6, float(b.float().abs().max())))
    status = "pass" if worst <= atol else "fail"
    return Check("", status, f"cut-back cache = fresh prefill for n = {', '.join(map(str, stood))} of {drafts} "
                 f"(largest relative difference {worst:.2g}, allowed {atol:g}, {str(dtype).removeprefix('torch.')})",
                 {"max_abs_diff": worst})
