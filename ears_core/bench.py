"""`python -m ears_core.bench`: is speculative decoding faster here, does it change the output, and why.

Terms
-----
method      one way to decode: target-only; speculative with a rule (ordinary = lossless, EARS beta,
            typical acceptance, entropy tolerance); transformers' assisted generation
config      a method at a temperature T and a draft length K: the unit whose runs are pooled
run         one config on one prompt with one seed (one CSV row)
section     main     every method at T0, K0 on the benchmark prompts
            sweep    target-only, ordinary and EARS at every beta, for each T (the beta x T frontier)
            k        ordinary and EARS (the headline beta) for K in the K list, at T0
            fidelity target-only, ordinary and EARS on the math prompts with several seeds: final-answer
                     exact match against the answer key and against target-only under the same seed
            frontier every lossy rule's knob swept (--frontier: EARS beta, entropy beta, typical eps,
                     FLy's gate, the budget's epsilon) at T0, K0 on the sweep prompts and seeds, beside
                     ordinary and target-only: acceptance and tokens/s against exact distortion (FLy's
                     distortion is its per-position approximation; see rules.FLyRule)
            policy   the draft length: the cost model's policy, fixed K = 1..4 and the threshold, at
                     T = 0 and T = 0.9 (bench_plan)
            tree     chain against tree (seed 002) on the policy section's prompts, T and length: a
                     tree of N nodes against a chain of K = N drafts (the same verify price: mean
                     accepted tokens per round, ``acc/round``), and the chain's policy against a
                     tree sized by the cost model (tokens/s); ``drafts/round`` counts a tree's nodes
            quality  short questions with known answers (assets/quality/questions.json), several seeds
                     each: target-only, the ordinary rule and every lossy rule over its knob, with
                     accuracy (bootstrap interval over questions), speedup, acceptance, pardons and
                     distortion (quality/section.py); its own files quality.json, quality_runs.csv,
                     quality.html; run only when named (--sections quality)
ratio       a config's pooled tokens/s (total tokens / total seconds) over target-only's pooled
            tokens/s at the same T on the same prompts and seeds, both measured in this process with
            the configs of one prompt run back to back in a rotating order (interleaved); a warm-up
            run of each method comes first and is not counted
k           drafts actually made per round: K, or fewer when the draft stops early (the embedded head
            drafts with a dynamic length) or the answer is about to end
theory S    E(a, k) / (k c + 1) (seed 003) from the pooled acceptance rate a and cost ratio c
cost-model  E(a, k) t_step / (k t_draft + t_verify): theory with the measured price of a verify pass
            (t_verify) instead of one target step (t_step); on a CPU a pass over K+1 tokens costs
            more than one step, which is most of the gap between theory S and the measured ratio
log-prob    the target's mean log-probability (at T = 1) of the tokens a run emitted
clocks      tokens/s and ratios are on the decode clock (time inside the decoder, ``decode_s``); each run
            also has its wall clock from the moment it was asked for (``wall_s``: the policy's snapshot,
            the drafter, the decoding) and its time to first token (``ttft_s``), pooled beside them
            (tok/s wall, vs target wall, TTFT); where the two clocks differ by more than 5 % the
            table says why (``bench_report``)

Outputs in --out: runs.csv (one row per run), summary.json (pooled rows per section and config,
the machine and the command), report.html (self-contained plotly report), and a table on stdout.
The aggregation, files and figures live in ``bench_report``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import PreTrainedModel

from ears_core.deprecated import add_renamed_option
from ears_core.model.kernels.cpu_forms import cpu_model
from ears_core.report import bench_report
from ears_core.report.bench_plan import (OWN_SECTIONS, SECTIONS, BenchSettings, Config, Job, build_plan, final_answer,
                                         load_prompts, parse_frontier)
from ears_core.report.quality_report import format_quality, write_quality
from ears_core.quality.section import QualitySettings, run_section
from ears_core.decode.api import autoregressive_stream, stream
from ears_core.rules import RULES
from ears_core.decode.api import tree_stream
from ears_core.timing import cpu_ticks, stolen_share

__all__ = ["Config", "BenchSettings", "build_plan", "run_bench", "main"]

# ---------------------------------------------------------------------------------- running


def _transformers_model(model: Any) -> Any:
    """The transformers model under a graphed wrapper (model/cuda/graphed.py: its eager forward, for transformers' own
    assisted generation), else ``model`` itself."""
    from ears_core.model.cuda.graphed import GraphedLM

    return model.model if isinstance(model, GraphedLM) else model


@dataclass
class Bench:
    """The loaded models and how each method is run on them."""

    target: PreTrainedModel
    tokenizer: Any
    vocab_size: int
    pair: Any  # the ModelPair: new_drafter() gives each run a fresh drafter
    draft_label: str
    session: Any = None  # session.Session: the draft-length policy's prices and calibrations

    @property
    def draft(self) -> Any:
        return self.pair.draft

    def drafter(self) -> Any:
        return self.pair.new_drafter()

    @property
    def assisted_label(self) -> str:
        if isinstance(_transformers_model(self.draft), PreTrainedModel):
            return "transformers assisted generation (assistant_model = the draft)"
        return "transformers prompt lookup (prompt_lookup_num_tokens = K; the draft is not a transformers model)"

    def run(self, cfg: Config, ids: torch.Tensor, seed: int, max_new: int) -> dict[str, Any]:
        since = time.perf_counter()  # the run's wall clock: from the moment it is asked for
        kw = dict(temperature=cfg.temperature, max_new_tokens=max_new, seed=seed, vocab_size=self.vocab_size,
                  tokenizer=self.tokenizer)
        if cfg.method == "target":
            res = _since(autoregressive_stream(self.target, ids, **kw), since).result()
        elif cfg.method == "assisted":
            return self._assisted(cfg, ids, seed, max_new)
        elif cfg.shape == "tree":  # depth K, a budget of nodes: exactly (fixed) or sized by the cost model
            rule = cfg.rule()
            extra = self.session.tree_policy_for(rule, cfg.temperature, cfg.budget, cfg.draft) if self.session else {}
            gen = _since(tree_stream(self.target, self.drafter(), ids, rule=rule, budget=cfg.budget, depth=cfg.k,
                                     **kw, **extra), since)
            res = gen.result()
            if self.session is not None:
                calib = extra["keep"].calibration if "keep" in extra else None
                self.session.absorb(gen, rule, cfg.temperature, calib, shape="tree")
        else:
            rule = cfg.rule()
            extra = self.session.policy_for(rule, cfg.temperature, cfg.k, cfg.draft) if self.session else {}
            gen = _since(stream(self.target, self.drafter(), ids, rule=rule, k=cfg.k, **kw, **extra), since)
            res = gen.result()
            if self.session is not None:
                self.session.absorb(gen, rule, cfg.temperature, extra.get("calibration"))
        s = res.stats
        return dict(token_ids=res.token_ids, text=res.text, new_tokens=s.new_tokens, decode_s=s.decode_s,
                    wall_s=s.wall_s, ttft_s=s.ttft_s, setup_s=s.setup_s,
                    steps=s.steps, drafted=s.drafted, accepted=s.accepted, pardoned=s.pardoned,
                    draft_ms=s.draft_ms, target_ms=s.target_ms, total_distortion=s.total_distortion)

    def _assisted(self, cfg: Config, ids: torch.Tensor, seed: int, max_new: int) -> dict[str, Any]:
        draft = _transformers_model(self.draft)
        extra: dict[str, Any] = ({"assistant_model": draft, "num_assistant_tokens": cfg.k,
                                  "num_assistant_tokens_schedule": "constant"}
                                 if isinstance(draft, PreTrainedModel) else {"prompt_lookup_num_tokens": cfg.k})
        torch.manual_seed(seed)
        eos = self.tokenizer.eos_token_id
        t0 = time.perf_counter()
        out = _transformers_model(self.target).generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                   do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0,
                                   pad_token_id=eos, **extra)
        wall = time.perf_counter() - t0
        new = out[0, ids.shape[1]:].tolist()
        if eos is not None and eos in new:  # pads after an early stop are not tokens
            new = new[: new.index(eos) + 1]
        return dict(token_ids=new, text=self.tokenizer.decode(new, skip_special_tokens=True), new_tokens=len(new),
                    decode_s=wall, wall_s=wall, ttft_s=None, setup_s=0.0, steps=0, drafted=0, accepted=0, pardoned=0,
                    draft_ms=0.0, target_ms=0.0, total_distortion=0.0)

    @torch.no_grad()
    def mean_logprob(self, ids: torch.Tensor, new: list[int]) -> float:
        """The target's mean log P(token | prefix) at T = 1 over the emitted tokens."""
        if not new:
            return float("nan")
        full = torch.cat([ids, torch.tensor([new], device=ids.device)], dim=1)  # (1, T + N)
        logits = self.target(full).logits[0, ids.shape[1] - 1 : -1, : self.vocab_size].float()  # (N, V)
        lp = torch.log_softmax(logits, dim=-1).gather(-1, full[0, ids.shape[1]:, None])  # (N, 1)
        return float(lp.mean())


def _since(gen: Any, since: float) -> Any:
    """``gen`` (a Generation) with its wall clock started at ``since``."""
    gen.started_at = since
    return gen


def load_bench(s: BenchSettings) -> Bench:
    from ears_core.pair import load_pair

    from ears_core.serve.session import Session

    pair = load_pair(s.target, s.draft, device=s.device)
    label = pair.draft_spec or "none"
    session = Session(pair)
    session.warm_up()  # the price curve (measured or cached) and the draft step, before any timed run
    return Bench(pair.target, pair.tokenizer, pair.vocab_size, pair, "n-gram prompt lookup" if label == "ngram" else label,
                 session)


@torch.no_grad()
def run_bench(s: BenchSettings, bench: Bench | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every job of the plan and write the outputs; returns the summary."""
    from ears_core.model.loading.hub import encode_prompt

    s.check()
    if s.threads:
        torch.set_num_threads(s.threads)
    bench = bench or load_bench(s)
    quality = run_quality(s, bench, progress) if "quality" in s.sections else None
    if quality is not None and not set(s.sections) - set(OWN_SECTIONS):
        return dict(target=s.target, draft=bench.draft_label, machine=quality["machine"], sections={}, quality=quality)
    s = replace(s, sections=tuple(x for x in s.sections if x not in OWN_SECTIONS))
    prompts = load_prompts(s.prompts_file)
    assisted = s.assisted and isinstance(_transformers_model(bench.target), PreTrainedModel)  # not the lean target
    if "tree" in s.sections and not hasattr(bench.drafter(), "propose_tree"):
        raise ValueError(f"the tree section needs a draft with a distribution to branch from (a draft model or "
                         f"head), not {bench.draft_label}: drop 'tree' from --sections or choose another --draft")
    jobs, by_section = build_plan(s, prompts, assisted)
    ids = {p["id"]: encode_prompt(bench.tokenizer, p["prompt"], device=bench.target.device) for p in prompts}
    warm = ids[jobs[0].prompt_id]
    for cfg in {(j.config.method, j.config.shape): j.config for j in jobs}.values():  # warm-up: one per method, shape
        bench.run(cfg, warm, 0, 8)
    prices_at_start = bench.session.profile_text() if bench.session is not None else None
    if progress and prices_at_start:
        print(f"this machine's {prices_at_start}", file=sys.stderr, flush=True)
    rows: dict[Job, dict[str, Any]] = {}
    t_start, ticks = time.perf_counter(), cpu_ticks()
    for n, job in enumerate(jobs, 1):
        p = prompts[job.prompt_id]
        r = bench.run(job.config, ids[job.prompt_id], job.seed, job.max_new_tokens)
        r["logprob"] = bench.mean_logprob(ids[job.prompt_id], r["token_ids"])
        r["answer"] = final_answer(r["text"]) if p.get("answer") is not None else None
        r["correct"] = None if p.get("answer") is None else r["answer"] == final_answer(str(p["answer"]))
        rows[job] = r
        if progress and (sys.stderr.isatty() or n % max(1, len(jobs) // 20) == 0 or n == len(jobs)):
            el = time.perf_counter() - t_start
            line = f"[{n}/{len(jobs)}] {el:5.0f} s, ~{el / n * (len(jobs) - n):4.0f} s left  {job.config.key:28s}"
            print("\r" + line if sys.stderr.isatty() else line, end="" if sys.stderr.isatty() else "\n",
                  file=sys.stderr, flush=True)
    if progress and sys.stderr.isatty():
        print(file=sys.stderr)
    info = machine(bench.target)
    stolen = stolen_share(ticks, cpu_ticks())  # the hypervisor's share of the CPU time the runs wanted (timing.py)
    info["stolen_share"] = None if stolen is None else round(stolen, 3)
    if bench.session is not None:  # the price curve the runs were priced with: at the start and as the rounds left it
        info["prices_at_start"], info["prices_at_end"] = prices_at_start, bench.session.profile_text()
    meta = dict(target=s.target, draft=bench.draft_label, assisted=bench.assisted_label if assisted else None,
                machine=info, settings={k: (str(v) if isinstance(v, Path) else v)
                                                         for k, v in asdict(s).items() if k != "quality"},
                wall_s=round(time.perf_counter() - t_start, 1))
    summary = bench_report.write_all(s, prompts, rows, by_section, meta)
    return dict(summary, quality=quality) if quality is not None else summary


def run_quality(s: BenchSettings, bench: Bench, progress: bool = True) -> dict[str, Any]:
    """The quality section on the bench's session; writes its files into ``s.out`` and returns its summary."""
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else None
    info = machine(bench.target)
    info["prices_at_start"] = bench.session.profile_text() if bench.session is not None else None
    summary, records = run_section(bench.session, s.quality, parse_frontier(s.quality.sweeps), s.k,
                                   s.draft_length, progress=say, reference=_float_reference(bench))
    info["prices_at_end"] = bench.session.profile_text() if bench.session is not None else None
    summary = dict(target=s.target, draft=bench.draft_label, machine=info,
                   command="python -m ears_core.bench " + " ".join(s.extra.get("argv", [])),
                   settings={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s.quality).items()}, **summary)
    write_quality(s.out, summary, records, images=s.images)
    return summary


def _float_reference(bench: Bench) -> tuple[str, Any] | None:
    """The float32 form of a lean embedded target (model/loading/target_path.py), for the quality section's reference."""
    if getattr(bench.target, "ears_kernels", "") != "lean-int4":
        return None
    from ears_core.pair import load_pair
    from ears_core.serve.session import Session

    return "float32 reference", Session(load_pair("embedded", None, dtype="float32"))


def machine(model: torch.nn.Module) -> dict[str, Any]:
    dev = next(model.parameters()).device
    info = dict(device=str(dev), torch=torch.__version__, python=platform.python_version(),
                threads=torch.get_num_threads(), cpu=cpu_model())
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    return info


# ------------------------------------------------------------------------------------------ CLI


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    d = BenchSettings()
    p = argparse.ArgumentParser(prog="python -m ears_core.bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default=d.target, help="'embedded', a Hugging Face id or a local folder")
    p.add_argument("--draft", default=d.draft, help="'auto' (the embedded head for the embedded target, else "
                   "n-gram), 'ngram', 'embedded', a Hugging Face id or a local folder")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--prompts-file", type=Path, default=d.prompts_file, help="JSON prompt set (task, prompt, answer)")
    p.add_argument("--prompts", type=int, default=d.prompts, help="prompts in the main section, tasks in turn")
    p.add_argument("--sweep-prompts", type=int, default=d.sweep_prompts, help="prompts in the sweep and k sections")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--fidelity-tokens", type=int, default=d.fidelity_tokens, help="max new tokens for math answers")
    p.add_argument("--temperature", type=float, default=d.temperature, help="T0 of the main, k and fidelity sections")
    p.add_argument("--k", "-K", type=int, default=d.k, help="K0: drafts per round at most")
    add_renamed_option(p, "--gamma", "--k", "k", int)
    p.add_argument("--betas", type=_floats, default=d.betas, help="EARS betas, comma-separated")
    p.add_argument("--headline-beta", type=float, default=d.headline_beta, help="EARS beta of the k section")
    p.add_argument("--temperatures", type=_floats, default=d.temperatures, help="the sweep's temperatures")
    p.add_argument("--ks", type=_ints, default=d.ks, help="the k section's K values")
    add_renamed_option(p, "--gammas", "--ks", "ks", _ints)
    p.add_argument("--fidelity-seeds", type=int, default=d.fidelity_seeds)
    p.add_argument("--fidelity-betas", type=_floats, default=d.fidelity_betas)
    p.add_argument("--sections", default=",".join(d.sections), help=f"any of {', '.join(SECTIONS)}")
    p.add_argument("--no-assisted", action="store_true", help="skip transformers' assisted generation")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--images", action="store_true", help="also write the figures as PNG (drawn in /usr/bin/chromium via playwright)")
    p.add_argument("--out", type=Path, default=d.out, help="folder for runs.csv, summary.json, report.html")
    p.add_argument("--draft-length", default=d.draft_length, choices=("policy", "fixed", "threshold"),
                   help="draft length of the main, sweep, fidelity and frontier sections: policy (this machine's "
                   "measured prices pick 0..K each round), fixed (always K) or threshold (confidence 0.35)")
    p.add_argument("--policy-temperatures", type=_floats, default=d.policy_temperatures,
                   help="the policy and tree sections' temperatures (0 = greedy)")
    p.add_argument("--policy-ks", type=_ints, default=d.policy_ks, help="the policy section's fixed K values")
    add_renamed_option(p, "--policy-gammas", "--policy-ks", "policy_ks", _ints)
    p.add_argument("--policy-tokens", type=int, default=d.policy_tokens,
                   help="max new tokens in the policy and tree sections")
    p.add_argument("--tree-budgets", type=_ints, default=d.tree_budgets,
                   help="the tree section's fixed tree budgets N, each against a chain of K = N drafts")
    p.add_argument("--tree-max-nodes", type=int, default=d.tree_max_nodes,
                   help="the tree section's cost-model tree: nodes per round at most (its depth is --k)")
    p.add_argument("--rules", default=d.rules,
                   help="the main section's rules, comma-separated, each with optional parameters "
                   "(name:param=value); registered: " + ", ".join(
                       f"{r.name}" + (f" ({', '.join(p.name for p in r.params)})" if r.params else "")
                       for r in RULES.values()))
    p.add_argument("--frontier", default=d.frontier,
                   help="the frontier section's sweeps, comma-separated: rule:param=v1/v2/...[:fixed=value]")
    _quality_flags(p)
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild summary.json, report.html (and PNGs) from --out's runs.csv")
    return p


def _quality_flags(p: argparse.ArgumentParser) -> None:
    q = QualitySettings()
    p.add_argument("--quality-questions", type=int, default=q.questions, help="the quality section's questions")
    p.add_argument("--quality-seeds", type=int, default=q.seeds, help="seeds per question and setting")
    p.add_argument("--quality-temperature", type=float, default=q.temperature)
    p.add_argument("--quality-tokens", type=int, default=q.max_new_tokens, help="max new tokens per answer")
    p.add_argument("--quality-categories", default=q.categories, help="'all' or comma-separated categories "
                   "(default: every category but those the embedded target fails, quality.questions.LEFT_OUT)")
    p.add_argument("--quality-sweeps", default=q.sweeps, help="rule:knob=v1/v2/...[:fixed=value], comma-separated")
    p.add_argument("--quality-questions-file", type=Path, default=q.questions_file)
    p.add_argument("--no-quality-greedy", action="store_true", help="skip the T = 0 target-only pass")


def _quality_settings(a: argparse.Namespace) -> QualitySettings:
    return QualitySettings(a.quality_questions_file, a.quality_questions, a.quality_seeds, a.quality_temperature,
                           a.quality_tokens, a.quality_categories, a.quality_sweeps, not a.no_quality_greedy)


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    s = BenchSettings(target=a.target, draft=a.draft, device=a.device, prompts_file=a.prompts_file, prompts=a.prompts,
                      sweep_prompts=a.sweep_prompts, max_new_tokens=a.max_new_tokens, fidelity_tokens=a.fidelity_tokens,
                      temperature=a.temperature, k=a.k, betas=a.betas, headline_beta=a.headline_beta,
                      temperatures=a.temperatures, ks=a.ks, fidelity_seeds=a.fidelity_seeds,
                      fidelity_betas=a.fidelity_betas, sections=tuple(x.strip() for x in a.sections.split(",") if x.strip()),
                      assisted=not a.no_assisted, out=a.out, threads=a.threads, images=a.images,
                      draft_length=a.draft_length, policy_temperatures=a.policy_temperatures,
                      policy_ks=a.policy_ks, policy_tokens=a.policy_tokens, tree_budgets=a.tree_budgets,
                      tree_max_nodes=a.tree_max_nodes, rules=a.rules, frontier=a.frontier,
                      extra={"argv": list(sys.argv[1:] if argv is None else argv)}, quality=_quality_settings(a))
    from ears_core.model.loading.hub import ModelLoadError

    if a.report_only:
        print(bench_report.format_table(bench_report.reaggregate(a.out, images=a.images)))
        return 0
    try:
        s.check()
        summary = run_bench(s)
    except (ValueError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if summary["sections"]:
        print(bench_report.format_table(summary))
        print(f"\nwrote {s.out / 'runs.csv'}, {s.out / 'summary.json'}, {s.out / 'report.html'}")
    if summary.get("quality"):
        print(format_quality(summary["quality"]))
        print(f"\nwrote {', '.join(str(s.out / f) for f in ('quality.json', 'quality_runs.csv', 'quality.html'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
