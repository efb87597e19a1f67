"""Side-by-side throughput: vLLM (CPU backend) with and without speculation and EARS, next to
ears_core's own session on the embedded pair. One orchestrating command; each part runs in its own
environment and process:

    python3 integrations/vllm/bench.py --out docs/results/vllm_bench.json

  vLLM parts    .venv-vllm/bin/python bench.py vllm --setting NAME ...  (one fresh vLLM per setting: the
                plug-in reads EARS_VLLM_RULE / EARS_VLLM_BETA at start, in every process)
  ears_core     .venv/bin/python bench.py ears-core ...                (the app's environment: transformers 5.23)

Settings (vLLM, embedded SmolLM2-135M target, float32, T = 0.9, seeds per request):
  target          no speculation
  ngram           n-gram speculation (k = 3), vLLM's own acceptance (EARS_VLLM_RULE=standard, same draws)
  ngram-ears      n-gram speculation + EARS beta 0.1
  draft           a draft model (the target itself: the embedded pair's draft is an EAGLE-style head
                  vLLM cannot load) drawing its drafts with draft_sample_method="probabilistic", k = 3
At each concurrency c, max(#prompts, c) requests (the prompts of assets/prompts.json in turn, each
with its own seed) go in waves of c through LLM.generate; every request makes exactly --max-tokens
tokens (ignore_eos), so the settings do the same work. Reported per (setting, c): tokens/s in total,
tokens/s per request (its tokens / its wave's wall time, averaged), the draft acceptance rate (vLLM's
spec-decode counters) and pardons (the plug-in's counters).
ears_core: target-only, ordinary rule and EARS 0.1 on the embedded pair (target + its trained
draft head), one request at a time (it serves one stream), same prompts, T = 0.9, --max-tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
SETTINGS = {
    "target": (None, {}),
    "ngram": (NGRAM, {"EARS_VLLM_RULE": "standard"}),
    "ngram-ears": (NGRAM, {"EARS_VLLM_RULE": "ears", "EARS_VLLM_BETA": "0.1"}),
    "draft": ("DRAFT", {"EARS_VLLM_RULE": "standard"}),
}


def load_prompts(n: int | None) -> list[str]:
    prompts = [p["prompt"] for p in json.loads((REPO / "assets" / "prompts.json").read_text())["prompts"]]
    return prompts[:n] if n else prompts


def target_dir() -> str:
    root = Path(os.environ.get("EARS_CACHE") or "~/.cache/ears_studio").expanduser()
    return str(root / "smollm2-135m-instruct")


# ----------------------------------------------------------------------------- vLLM part


def run_vllm(args: argparse.Namespace) -> dict:
    from vllm import LLM, SamplingParams

    import ears_vllm

    spec, _ = SETTINGS[args.setting]
    model = target_dir()
    if spec == "DRAFT":
        spec = {"method": "draft_model", "model": model, "num_speculative_tokens": 3,
                "draft_sample_method": "probabilistic"}
    concurrency = [int(c) for c in args.concurrency.split(",")]
    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=1024, seed=0,
              max_num_seqs=max(concurrency), kv_cache_memory_bytes=args.kv_cache_mib << 20,
              disable_log_stats=False, speculative_config=spec)
    start_s = time.perf_counter() - t0
    tok = llm.get_tokenizer()
    chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in load_prompts(args.prompts)]

    def counts() -> dict:
        names = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted"}
        got = {names[m.name]: int(m.value) for m in llm.get_metrics() if m.name in names}
        got["pardoned"] = ears_vllm.read_counters()["pardoned"]
        return got

    def params(i: int) -> SamplingParams:
        return SamplingParams(temperature=0.9, max_tokens=args.max_tokens, seed=1000 + i, ignore_eos=True)

    llm.generate(chats[:1], [params(-1)], use_tqdm=False)  # warm-up
    rows = []
    for c in concurrency:
        n = max(len(chats), c)
        before = counts()
        tokens = 0
        per_request = []
        t_all = time.perf_counter()
        for w in range(0, n, c):
            ids = list(range(w, min(w + c, n)))
            t = time.perf_counter()
            outs = llm.generate([chats[i % len(chats)] for i in ids], [params(i) for i in ids], use_tqdm=False)
            wave_s = time.perf_counter() - t
            for o in outs:
                k = len(o.outputs[0].token_ids)
                tokens += k
                per_request.append(k / wave_s)
        wall = time.perf_counter() - t_all
        after = counts()
        d = {k: after.get(k, 0) - before.get(k, 0) for k in ("drafted", "accepted", "pardoned")}
        rows.append({"engine": "vllm", "setting": args.setting, "concurrency": c, "requests": n, "tokens": tokens,
                     "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
                     "tokens_per_s_per_request": round(sum(per_request) / len(per_request), 2),
                     "drafted": d["drafted"], "accepted": d["accepted"], "pardoned": d["pardoned"],
                     "acceptance": round(d["accepted"] / d["drafted"], 4) if d["drafted"] else None})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    import vllm

    return {"setting": args.setting, "vllm": vllm.__version__, "start_s": round(start_s, 1), "rows": rows,
            "rule": os.environ.get("EARS_VLLM_RULE"), "beta": os.environ.get("EARS_VLLM_BETA")}


# ----------------------------------------------------------------------------- ears_core part


def run_ears_core(args: argparse.Namespace) -> dict:
    """ears_core's own session on the embedded pair, as the app and the CLI run it: the draft-length policy
    on this machine's measured prices (K at most 4), the shape ``auto``; target-only, the ordinary rule and
    EARS 0.1, one request at a time."""
    sys.path.insert(0, str(REPO))
    import torch
    from ears_core import RunConfig, Session, load_pair

    session = Session(load_pair())
    session.warm_up()
    prompts = load_prompts(args.prompts)
    encoded = [session.encode(p) for p in prompts]
    rows = []
    for name, rule, params in (("target", None, {}), ("standard", "ordinary", {}), ("ears-0.1", "ears", {"beta": 0.1})):
        tokens = drafted = accepted = pardoned = 0
        per_request = []
        wall = 0.0
        for i, ids in enumerate(encoded):
            cfg = RunConfig(rule=rule or "ordinary", params=params, temperature=0.9, max_new_tokens=args.max_tokens,
                            seed=1000 + i)
            run = session.baseline(ids, cfg) if rule is None else session.speculative(ids, cfg)
            t = time.perf_counter()
            with torch.inference_mode():
                out = run.result()
            s = time.perf_counter() - t
            wall += s
            k = len(out.token_ids)
            tokens += k
            per_request.append(k / s)
            st = out.stats
            drafted += getattr(st, "drafted", 0) or 0
            accepted += getattr(st, "accepted", 0) or 0
            pardoned += getattr(st, "pardoned", 0) or 0
        rows.append({"engine": "ears_core", "setting": name, "concurrency": 1, "requests": len(encoded),
                     "tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
                     "tokens_per_s_per_request": round(sum(per_request) / len(per_request), 2),
                     "drafted": drafted, "accepted": accepted, "pardoned": pardoned,
                     "acceptance": round(accepted / drafted, 4) if drafted else None})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"setting": "ears_core", "draft": "embedded pair (target + trained draft head), Session with the draft-length policy",
            "profile": session.profile_text(), "rows": rows}


# ----------------------------------------------------------------------------- orchestration


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return os.uname().machine


def table(rows: list[dict]) -> str:
    head = ("| engine | setting | concurrent requests | tokens/s total | tokens/s per request | acceptance | pardons |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    lines = [head]
    for r in rows:
        acc = "" if r["acceptance"] is None else f"{100 * r['acceptance']:.1f} %"
        lines.append(f"| {r['engine']} | {r['setting']} | {r['concurrency']} | {r['tokens_per_s']:.1f} | "
                     f"{r['tokens_per_s_per_request']:.1f} | {acc} | {r['pardoned'] if r['drafted'] else ''} |")
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    vllm_py = args.vllm_python or str(REPO / ".venv-vllm" / "bin" / "python")
    app_py = args.app_python or str(REPO / ".venv" / "bin" / "python")
    parts, failures = [], []
    common = ["--max-tokens", str(args.max_tokens)] + (["--prompts", str(args.prompts)] if args.prompts else [])
    jobs = [(s, vllm_py, ["vllm", "--setting", s, "--concurrency", args.concurrency,
                          "--kv-cache-mib", str(args.kv_cache_mib)], SETTINGS[s][1]) for s in args.settings.split(",")]
    if not args.skip_ears_core:
        jobs.append(("ears_core", app_py, ["ears-core"], {}))
    for name, py, sub, env_extra in jobs:
        out = Path(args.out).with_suffix(f".{name}.part.json")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env_extra}
        for var in ("EARS_VLLM_RULE", "EARS_VLLM_BETA", "EARS_VLLM_STATS_DIR", "EARS_VLLM_RUN"):
            if var not in env_extra:
                env.pop(var, None)
        print(f"== {name}: {py} {' '.join(sub + common)}", flush=True)
        t = time.perf_counter()
        proc = subprocess.run([py, __file__, *sub, *common, "--part-out", str(out)], env=env,
                              stdout=subprocess.DEVNULL if args.quiet else None, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join(proc.stderr.splitlines()[-15:])
            print(f"   {name} failed ({proc.returncode}) after {time.perf_counter() - t:.0f} s:\n{tail}", flush=True)
            failures.append({"setting": name, "returncode": proc.returncode, "stderr_tail": tail})
            continue
        parts.append(json.loads(out.read_text()))
        out.unlink()
        print(f"   done in {time.perf_counter() - t:.0f} s", flush=True)
    rows = [r for p in parts for r in p["rows"]]
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "max_tokens": args.max_tokens,
              "prompts": len(load_prompts(args.prompts)), "temperature": 0.9, "concurrency": args.concurrency,
              "machine": _cpu_name() + f", {os.cpu_count()} cores", "parts": parts, "failures": failures,
              "rows": rows, "table_markdown": table(rows)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(result["table_markdown"])
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="part")
    for name in ("vllm", "ears-core"):
        p = sub.add_parser(name)
        p.add_argument("--max-tokens", type=int, default=96)
        p.add_argument("--prompts", type=int, default=None)
        p.add_argument("--part-out", required=True)
        if name == "vllm":
            p.add_argument("--setting", choices=list(SETTINGS), required=True)
            p.add_argument("--concurrency", default="1,8,32")
            p.add_argument("--kv-cache-mib", type=int, default=1024)
    ap.add_argument("--out", default=str(REPO / "docs" / "results" / "vllm_bench.json"))
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=None, help="the first N prompts of assets/prompts.json (default: all)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--kv-cache-mib", type=int, default=1024)
    ap.add_argument("--skip-ears-core", action="store_true")
    ap.add_argument("--vllm-python", help="default: .venv-vllm/bin/python at the repo root")
    ap.add_argument("--app-python", help="default: .venv/bin/python at the repo root (the app's environment)")
    ap.add_argument("--quiet", action="store_true", help="hide vLLM's own logging")
    args = ap.parse_args()
    if args.part is None:
        return orchestrate(args)
    result = run_vllm(args) if args.part == "vllm" else run_ears_core(args)
    Path(args.part_out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":  # vLLM starts its engine with spawn: the guard is required
    sys.exit(main())
