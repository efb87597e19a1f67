"""The embedded pair's speedup as a user of the app meets it: issue 40's protocol, measured (not a test).

Through the Session with its defaults (draft-length policy, shape ``auto``, K = 4), on the held-out prompts
of assets/prompts.json, ``--tokens`` new tokens each, every speculative run interleaved with target-only
decoding of the same prompt and seed: T = 0 (greedy), the ordinary rule at T = 0.9 and EARS (beta 0.1) at
T = 0.9. Several target forms (``--dtypes``: ``lean`` for the int4 target from the GGUF, the default where it
runs; ``float32`` or ``bfloat16`` for the float target) load side by side and take turns prompt by prompt, so a
slow spell of the machine falls on all of them; several drafts (``--drafts``: "auto" for the shipped head,
or head folders) do the same, each with every dtype. Reported per dtype and setting: tokens/s of both (and after the
first token, the prompt's pass left out: what llama.cpp's generation figure measures), the
ratio on the decode clock and on the wall clock (each run's request-to-last-token time), the lowest
per-prompt ratio beside its noise floor (two target-only runs of the same prompt against each other: ``--repeats``
runs each prompt that many times, the order of speculative and target-only swapped each time), tokens a round, time to first token, and the dtype's price curve and draft step;
and the share of the CPU time the hypervisor took, per prompt and in all (``timing.py``, stolen: a high share marks a noisy run).
Greedy speculative output is checked against target-only output prompt by prompt. ``--peer`` measures
llama.cpp's plain decoding of the same GGUF on the same threads (scripts/llama_cpp_peer.py, built once with
``--build``) before and after the runs, and puts its tokens/s beside the project's.

    python scripts/measure_speedup.py [--prompts 16] [--tokens 96] [--repeats 2] [--dtypes lean,float32] [--peer] [--out F.json]
    python scripts/measure_speedup.py --dtypes bfloat16 --drafts auto,/tmp/new-head   # a head before shipping it
    python scripts/measure_speedup.py --dtypes lean --drafts auto:bfloat16,auto:int4  # the head's variants
    python scripts/measure_speedup.py --dtypes lean --device-round   # chains decided on the device, one read a round

Run it alone on the machine; state its price curve (printed) next to any figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ears_core import load_pair
from ears_core.policy.costs import describe
from ears_core.serve.session import RunConfig, Session
from ears_core.model.kernels.cpu_forms import cpu_model
from ears_core.timing import cpu_ticks, stolen_share

ROOT = Path(__file__).resolve().parent.parent
ROUND_PARTS = ("draft_ms", "target_ms", "overhead_ms")  # a round: drafting, the verify pass, the rest
SETTINGS = {"T=0": ("greedy", {}, 0.0), "ordinary T=0.9": ("standard", {}, 0.9),
            "EARS 0.1 T=0.9": ("ears", {"beta": 0.1}, 0.9)}


def _drain(run: Any) -> dict[str, Any]:
    tokens = [ev.token_id for ev in run]
    s = run.stats()
    steps = getattr(getattr(run, "gen", None), "steps", [])  # a speculative run's rounds (none for target-only)
    return {"tokens": tokens, "n": s.new_tokens, "decode_s": s.decode_s, "wall_s": s.wall_s or s.decode_s,
            "ttft_s": s.ttft_s, "first_s": s.first_token_decode_s or 0.0, "rounds": s.steps, "drafted": s.drafted, "accepted": s.accepted,
            "crowded": int(getattr(run, "crowded", False)),  # other work crowded it onto one thread (serve/crowding.py)
            **{part: sum(getattr(r, part) for r in steps) for part in ROUND_PARTS}}


def _one_prompt(session: Session, ids: torch.Tensor, tokens: int, seed: int, device_round: bool = False,
                spec_first: bool = False) -> dict[str, dict[str, Any]]:
    """Each setting's speculative run and target-only run at its temperature (one per temperature), target-only
    first, or speculative first where ``spec_first`` (a repeat runs them the other way round: ABBA)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (rule, params, temp) in SETTINGS.items():
        cfg = RunConfig(rule=rule, params=params, temperature=temp, max_new_tokens=tokens, seed=seed,
                        **({"device_round": True, "draft_shape": "chain"} if device_round else {}))
        base = f"base T={temp}" not in out
        if base and not spec_first:
            out[f"base T={temp}"] = _drain(session.baseline(ids, cfg))
        out[name] = _drain(session.speculative(ids, cfg))
        out[name]["shape"] = session.resolved(cfg).draft_shape
        if base and spec_first:
            out[f"base T={temp}"] = _drain(session.baseline(ids, cfg))
    return out


def _merged(reps: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """A prompt's repeats as one run per key: times and counts summed, the tokens of every repeat kept."""
    out = {}
    for key, first in reps[0].items():
        rows = [r[key] for r in reps]
        out[key] = {**first, **{f: sum(x[f] for x in rows) for f in ("n", "decode_s", "first_s", "wall_s", "rounds", "drafted",
                                                                        "accepted", "crowded", *ROUND_PARTS)},
                    "ttft_s": sum(x["ttft_s"] or 0 for x in rows) / len(rows), "all_tokens": [x["tokens"] for x in rows],
                    "repeat_tok_s": [x["n"] / x["decode_s"] for x in rows]}
    return out


def _same_twice(runs: list[dict[str, dict[str, Any]]], key: str) -> float | None:
    """The noise floor of a per-prompt ratio: the lowest, over prompts, of two target-only runs of the same
    prompt and seed against each other (the slower over the faster); None with one repeat."""
    spreads = [min(r[key]["repeat_tok_s"]) / max(r[key]["repeat_tok_s"]) for r in runs if len(r[key]["repeat_tok_s"]) > 1]
    return min(spreads) if spreads else None


def _fold(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    table = {}
    for name, (_, _, temp) in SETTINGS.items():
        spec = [r[name] for r in runs]
        base = [r[f"base T={temp}"] for r in runs]
        tot = lambda rows, key: sum(x[key] for x in rows)  # noqa: E731
        per_prompt = [(b["decode_s"] / b["n"]) / (s["decode_s"] / s["n"]) for s, b in zip(spec, base)]
        table[name] = {
            "target_only_tokens_per_s": tot(base, "n") / tot(base, "decode_s"),
            "speculative_tokens_per_s": tot(spec, "n") / tot(spec, "decode_s"),
            "ratio_decode": (tot(spec, "n") / tot(spec, "decode_s")) / (tot(base, "n") / tot(base, "decode_s")),
            "ratio_wall": (tot(spec, "n") / tot(spec, "wall_s")) / (tot(base, "n") / tot(base, "wall_s")),
            "lowest_prompt_ratio": min(per_prompt), "tokens_per_round": tot(spec, "n") / max(tot(spec, "rounds"), 1),
            "per_prompt": [{"ratio": round(r, 3), "tokens": s["n"], "rounds": s["rounds"], "drafted": s["drafted"],
                            "accepted": s["accepted"]} for r, s in zip(per_prompt, spec)],
            "acceptance": tot(spec, "accepted") / max(tot(spec, "drafted"), 1),
            "ttft_s_mean": sum(x["ttft_s"] or 0 for x in spec) / len(spec),
            "shapes": sorted({x["shape"] for x in spec}),
            "greedy_equal": sum(all(t == b["tokens"] for t in s["all_tokens"]) for s, b in zip(spec, base))
                            if name == "T=0" else None,
            "target_only_twice_lowest_prompt_ratio": _same_twice(runs, f"base T={temp}"),
            "crowded_runs": tot(spec, "crowded") + tot(base, "crowded"),
        }
        # where a round's time goes, in target-only steps (ms a target-only token): what the ratio is made of
        step_ms = 1000 * tot(base, "decode_s") / tot(base, "n")
        rounds = max(tot(spec, "rounds"), 1)
        table[name]["round_in_steps"] = {part.removesuffix("_ms"): tot(spec, part) / rounds / step_ms for part in ROUND_PARTS}
        table[name]["target_only_ms_a_token"] = step_ms
        # after the first token (the prompt's pass and the first round left out): what llama-bench's generation
        # figure (`-p 0`) measures, so the one to set beside it
        after_first = lambda rows: (tot(rows, "n") - len(rows) * len(rows[0]["all_tokens"])) / (  # noqa: E731
            tot(rows, "decode_s") - tot(rows, "first_s"))
        table[name]["target_only_after_first_tokens_per_s"] = after_first(base)
        table[name]["speculative_after_first_tokens_per_s"] = after_first(spec)
    return table


def _load(spec: str, form: str) -> Any:
    """The embedded pair with the target in ``form``: "lean" (the int4 target, EARS_LEAN=1) or a float dtype."""
    if form == "lean":
        os.environ["EARS_LEAN"] = "1"
        try:
            return load_pair("embedded", spec)
        finally:
            del os.environ["EARS_LEAN"]
    return load_pair("embedded", spec, dtype=form)


def _peer(threads: int, tokens: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "scripts"))
    from llama_cpp_peer import measure

    from ears_core.model.loading.embedded import find_embedded_gguf

    return measure(find_embedded_gguf(), threads=threads, repeats=5, tokens=tokens)


def _cpu_name() -> str:
    """The CPU's model name and the vector extensions it lists (what a reader of the figures compares)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return cpu_model()
    name = cpu_model()
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    wanted = [f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "avx_vnni")]
    return f"{name} ({' '.join(wanted) or 'no AVX2'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--dtypes", default="lean,float32")
    ap.add_argument("--peer", action="store_true", help="measure llama.cpp on the same GGUF before and after")
    ap.add_argument("--drafts", default="auto", help="comma list of draft specs ('auto' = the shipped head, or "
                    "head folders), each measured with every dtype, taking turns prompt by prompt; a spec ending "
                    "in ':general' runs that head through its general forward instead of its layers by hand, one "
                    "ending in ':float32', ':bfloat16' or ':int4' loads the head in that variant (EARS_DRAFT_DTYPE)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each prompt, each the other way round (target-only "
                    "first, then speculative first, ...); with two or more, two target-only runs of a prompt against "
                    "each other give the per-prompt ratio's noise floor")
    ap.add_argument("--device-round", action="store_true",
                    help="chain rounds decided on the device, one host read a round (decode/device_round.py)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prompts = json.loads((ROOT / "assets" / "prompts.json").read_text())["prompts"][: a.prompts]
    sessions = {}
    drafts = a.drafts.split(",")
    for draft in drafts:
        for dt in a.dtypes.split(","):
            label = dt if len(drafts) == 1 else f"{dt} / {Path(draft).name}"
            spec, _, suffix = draft.partition(":")
            general = suffix == "general"
            before = os.environ.get("EARS_DRAFT_DTYPE")
            if suffix and not general:
                os.environ["EARS_DRAFT_DTYPE"] = suffix
            pair = _load(spec, dt)
            if before is None:
                os.environ.pop("EARS_DRAFT_DTYPE", None)
            else:
                os.environ["EARS_DRAFT_DTYPE"] = before
            if general:
                pair.draft.by_hand = False  # draft/head_layers.py's comparison: the general forward
            session = Session(pair)
            session.warm_up()
            sessions[label] = session
            print(label, session.profile_text(), flush=True)
    peer = [_peer(a.threads, a.tokens)] if a.peer else []
    runs: dict[str, list] = {dt: [] for dt in sessions}
    t0, first_ticks, steal = time.time(), cpu_ticks(), []  # steal: the hypervisor's share of each prompt's CPU time
    for i, p in enumerate(prompts):
        ticks = cpu_ticks()
        for dt, session in sessions.items():
            ids = session.encode(p["prompt"])
            runs[dt].append(_merged([_one_prompt(session, ids, a.tokens, seed=i, device_round=a.device_round,
                                                 spec_first=j % 2 == 1) for j in range(a.repeats)]))
        steal.append(stolen_share(ticks, cpu_ticks()))
        print(f"prompt {i + 1}/{len(prompts)} ({time.time() - t0:.0f} s"
              + (f", {steal[-1]:.0%} stolen" if steal[-1] is not None else "") + ")", flush=True)
    whole = stolen_share(first_ticks, cpu_ticks())
    if a.peer:
        peer.append(_peer(a.threads, a.tokens))
    from ears_core.model.kernels.cpu_forms import report

    result = {"machine": f"{platform.processor() or platform.machine()}, {a.threads} threads, torch {torch.__version__}",
              "cpu": _cpu_name(), "kernel_forms": report(),
              "heads": {dt: str(getattr(s.pair.target, "head_form", None)) for dt, s in sessions.items()},
              # decode/row_walk.py: chain rounds run the head row by row up to the first draft that falls
              "head_walked": {dt: bool(getattr(s.pair.target, "head_grows_with_rows", False)) for dt, s in sessions.items()},
              "prompts": len(prompts), "tokens": a.tokens, "repeats": a.repeats, "minutes": round((time.time() - t0) / 60, 1),
              "stolen_share": None if whole is None else round(whole, 3),  # timing.py, stolen: high = a noisy run
              "stolen_share_per_prompt": [None if x is None else round(x, 3) for x in steal],
              "dtypes": {dt: {"price_curve": describe(s.prices), "profile": s.profile_text(), "settings": _fold(runs[dt])}
                         for dt, s in sessions.items()}}
    if peer:
        result["peer"] = {"before": peer[0], "after": peer[1],
                          "generation_tok_s": round((peer[0]["generation_tok_s"] + peer[1]["generation_tok_s"]) / 2, 1)}
        for kind in peer[0]["kinds"]:
            print(f"\nllama.cpp ({kind['kind']}) on the same GGUF, {a.threads} threads: {kind['generation_tok_s']} tok/s "
                  f"before; price curve {kind['price_curve']}; wider passes {kind['wide_passes']}")
        print(f"llama.cpp's fastest generation: {peer[0]['generation_tok_s']} tok/s before, "
              f"{peer[1]['generation_tok_s']} after")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    if whole is not None:
        print(f"\nthe hypervisor took {whole:.1%} of the CPU time wanted (most in one prompt: "
              f"{max(x or 0.0 for x in steal):.1%}): timing.py, stolen")
    for dt, r in result["dtypes"].items():
        print(f"\n{dt}: {r['profile']}")
        for name, row in r["settings"].items():
            print(f"  {name:16} target-only {row['target_only_tokens_per_s']:.1f} tok/s "
                  f"({row['target_only_after_first_tokens_per_s']:.1f} after the first token), speculative "
                  f"{row['speculative_tokens_per_s']:.1f} ({row['speculative_after_first_tokens_per_s']:.1f}): "
                  f"{row['ratio_decode']:.2f}x decode, {row['ratio_wall']:.2f}x wall, "
                  f"lowest prompt {row['lowest_prompt_ratio']:.2f}x"
                  + (f" (target-only twice: {row['target_only_twice_lowest_prompt_ratio']:.2f}x)"
                     if row["target_only_twice_lowest_prompt_ratio"] is not None else "")
                  + f", {row['tokens_per_round']:.2f} a round, "
                  f"{row['shapes']}, TTFT {row['ttft_s_mean']:.2f} s, a round in steps: "
                  + " + ".join(f"{k} {v:.2f}" for k, v in row["round_in_steps"].items())
                  + (f", greedy = target on {row['greedy_equal']}/{len(prompts)}" if row["greedy_equal"] is not None else "")
                  + (f"; {row['crowded_runs']} runs crowded onto one thread" if row["crowded_runs"] else ""))


if __name__ == "__main__":
    main()
