"""The order the GPU check runs in, and the device context its report starts with.

Terms
-----
subject    the pair the speed part measures: the largest real pair present (real_pairs.py), else the
           synthetic skip pair (synthetic.py) in the device's default dtype (bfloat16 on CUDA); with it the
           chain's k for the like-for-like runs (speed.py): 4 for a real pair, 8 for the skip pair (its draft
           agrees with its target most of the time). The tree is 8 nodes, depth 4, for both.
sizes      how much each check runs (``Sizes``): the CUDA form, and on the CPU a small form that runs every
           check of it in well under a minute on two cores (the test suite runs it); the sizes are in the
           report's context.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ears_core.decode import verify_graphs
from ears_core.decode.device_round import device_verify
from ears_core.gpu_check import captured, correctness, device_rounds, real_pairs, space_shapes, speed, waits
from ears_core.gpu_check.outcome import Check, Report
from ears_core.model.kernels.cpu_forms import cpu_model
from ears_core.gpu_check.synthetic import SKIP_CPU, SKIP_GPU, skip_pair
from ears_core.model.cuda.graphed import graphed_or_eager
from ears_core.model.loading.hub import resolve_dtype
from ears_core.pair import ModelPair, load_pair
from ears_core.rules import RULES, EARSRule
from ears_core.serve.session import Session

__all__ = ["run_all", "context", "Sizes", "CUDA_SIZES", "CPU_SIZES"]

SPEED_TREE = (8, 4)  # budget, depth: widths (2, 1, 1, 1)


@dataclass(frozen=True)
class Sizes:
    """How much each check runs (module terms)."""

    greedy_prompts: int  # greedy equality: prompts, and new tokens per prompt
    greedy_tokens: int
    verdict_rows: int  # the device round's verdicts against the CPU's: rows per rule
    run_rules: tuple[str, ...]  # whole runs with and without the device round: rules, prompts, new tokens
    run_prompts: int
    run_tokens: int
    real_tokens: int  # a real pair's greedy equality: new tokens per prompt
    speed_prompts: int  # tokens/s: prompts, new tokens per run, a warm-up pass first
    speed_tokens: int
    warm_up: bool
    price_repeats: int  # price curve: passes per width, the fastest kept


CUDA_SIZES = Sizes(greedy_prompts=5, greedy_tokens=48, verdict_rows=256, run_rules=tuple(RULES), run_prompts=3,
                   run_tokens=48, real_tokens=48, speed_prompts=3, speed_tokens=128, warm_up=True, price_repeats=5)
CPU_SIZES = Sizes(greedy_prompts=1, greedy_tokens=10, verdict_rows=32, run_rules=("ears",), run_prompts=1,
                  run_tokens=10, real_tokens=24, speed_prompts=1, speed_tokens=12, warm_up=False, price_repeats=1)


def context(device: torch.device) -> dict[str, Any]:
    """What ran the check: device, its name and memory, torch / CUDA / transformers versions."""
    import transformers

    ctx: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
                           "transformers": transformers.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        ctx.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                   memory_gb=round(props.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported())
    else:
        ctx.update(device_name=f"{cpu_model()} CPU, {torch.get_num_threads()} threads")
    return ctx


def _correctness(report: Report, device: torch.device, sizes: Sizes) -> None:
    greedy = dict(new_tokens=sizes.greedy_tokens, prompts=sizes.greedy_prompts)
    for graphs in (False, True):
        for dtype in (torch.float32, torch.bfloat16):
            name = ("captured " if graphs else "") + str(dtype).removeprefix("torch.")
            report.run(f"greedy equality {name}",
                       lambda d=dtype, c=graphs: correctness.greedy_equality(device, d, captured=c, **greedy))
    ears = EARSRule(beta=0.3)
    report.run("lossless ordinary rule", lambda: correctness.lossless(device))
    report.run("EARS emits its exact law", lambda: correctness.lossless(device, rule=ears, expect="emitted"))
    report.run("lossless, device verify", lambda: correctness.lossless(device, verifier=device_verify))
    report.run("EARS exact, device verify", lambda: correctness.lossless(device, rule=ears, expect="emitted",
                                                                         verifier=device_verify))
    report.run("same decisions as CPU", lambda: correctness.same_decisions(device))
    report.run("device round decides as CPU", lambda: device_rounds.same_verdicts(device, rows=sizes.verdict_rows))
    report.run("device round = today's, T = 0.9",
               lambda: device_rounds.same_runs(device, sizes.run_rules, sizes.run_prompts, sizes.run_tokens))
    report.run("bad draft ids", lambda: correctness.bad_draft_ids(device))
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        report.run(f"KV rollback {name}", lambda d=dtype: correctness.rollback(device, d))


def _real(report: Report, device: torch.device, sizes: Sizes) -> list[tuple[str, str, int]]:
    present = real_pairs.present_pairs()
    if not present:
        report.run("real pairs", lambda: Check("", "skip", "none present: prepare the embedded pair (python -m "
                                               "ears_core.model.loading.embedded --prepare) or put a preset's target and "
                                               "draft in the Hugging Face cache", {}))
    for target, draft, _ in present:
        report.run(f"real pair {target}",
                   lambda t=target, d=draft: real_pairs.check_real_pair(t, d, device, sizes.real_tokens))
    return present


def _subject(device: torch.device, present: list[tuple[str, str, int]], sizes: Sizes, synthetic: bool = False
             ) -> tuple[ModelPair, list[torch.Tensor], int]:
    """The speed part's pair, its prompts and the chain's k (module terms)."""
    n_prompts = sizes.speed_prompts
    if present and not synthetic:
        pair = load_pair(present[0][0], present[0][1], device=device)
        return pair, [pair.encode(p) for p in real_pairs.REAL_PROMPTS[:n_prompts]], 4
    shape = SKIP_GPU if device.type == "cuda" else SKIP_CPU
    dtype = resolve_dtype(None, device)
    target, draft = skip_pair(device, dtype, shape)
    target, draft = graphed_or_eager(target), graphed_or_eager(draft)  # as load_pair does on CUDA
    pair = ModelPair(target, draft, None, device, dtype, f"synthetic skip pair ({shape.layers} layers <- "
                     f"{shape.draft_layers}, {shape.params_m:.0f}M parameters)", shape.vocab, "synthetic")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, shape.vocab, (1, 32), generator=g).to(device) for _ in range(n_prompts)]
    return pair, prompts, 8


def _capture(pair: ModelPair, prompt: torch.Tensor) -> Check:
    seconds = captured.prepare(pair, prompt)
    parts = captured.graphed_parts(pair)
    graphs = sum(len(p.runner.bank.graphs) for p in parts)
    if not parts:
        return Check("", "skip", "nothing in this pair runs as captured graphs (EARS_CUDA_GRAPHS=0, or a model the "
                     "static pass cannot run: model/passes/static_decoder.py)", {})
    return Check("", "pass", f"{graphs} graphs of {len(parts)} models captured in {seconds:.2f} s",
                 {"capture_s": round(seconds, 3), "graphs": graphs, "models": len(parts)})


def _all_told(pair: ModelPair, device: torch.device) -> Check:
    """The seconds capturing the pair's passes over the whole check, and the device rounds' decide graphs
    (decode/verify_graphs.py): how many, their capture, and a failure that left them eager."""
    decide = verify_graphs.status(device)
    failed = f"; decide graphs left eager: {decide['failed']}" if decide["failed"] else ""
    return Check("", "pass", f"{captured.capture_seconds(pair):.2f} s capturing passes over the whole check; "
                 f"{decide['graphs']} decide graphs in {decide['capture_s']:.2f} s{failed}",
                 {"capture_s": captured.capture_seconds(pair), "decide": decide})


def _speed(report: Report, device: torch.device, present: list[tuple[str, str, int]], sizes: Sizes,
           synthetic: bool = False) -> None:
    pair, prompts, k = _subject(device, present, sizes, synthetic)
    report.context["speed_pair"] = pair.name
    eager = captured.eager_twin(pair) if device.type == "cuda" else None
    if eager is not None:
        report.run("capture", lambda: _capture(pair, prompts[0]))
    curve_check = report.run("price curve", lambda: speed.price_curve(pair, sizes.price_repeats))
    if curve_check.status != "pass":
        return
    session = Session(pair, prices=speed.curve_of(curve_check))
    timed = dict(new_tokens=sizes.speed_tokens, k=k, tree=SPEED_TREE, warm_up=sizes.warm_up)
    for setting in speed.SETTINGS:
        report.run(f"tokens/s {setting.label}",
                   lambda s=setting: speed.tokens_per_second(session, prompts, setting=s, **timed))
    report.run("round waits", lambda: waits.round_waits(session, prompts[0]))
    report.run("target-only waits", lambda: waits.baseline_waits(session, prompts[0]))
    if eager is None or not captured.graphed_parts(pair):
        return
    eager_curve = report.run("price curve eager", lambda: speed.price_curve(eager, sizes.price_repeats))
    if eager_curve.status == "pass":
        eager_session = Session(eager, prices=speed.curve_of(eager_curve))
        report.run(f"tokens/s eager {speed.SETTINGS[0].label}",
                   lambda: speed.tokens_per_second(eager_session, prompts, setting=speed.SETTINGS[0], **timed))
    report.run("captured = eager", lambda: captured.same_tokens(pair, eager, prompts, sizes.speed_tokens))
    report.run("capture, all told", lambda: _all_told(pair, device))


def run_all(device: torch.device, quick: bool = False, synthetic: bool = False, speed_only: bool = False,
            json_path: Path | None = None, shapes_only: bool = False) -> Report:
    """Every check on ``device``, in order: correctness (the device round's included), real pairs, then (unless
    ``quick``) speed and the Space's shapes. ``synthetic``: the speed part on the synthetic skip pair even where a
    real pair is present; ``speed_only``: the speed part and the Space's shapes alone; ``shapes_only``: the Space's
    shapes alone. ``json_path``: the report's JSON file, written after every check."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the report's lines only
    sizes = CUDA_SIZES if device.type == "cuda" else CPU_SIZES
    report = Report({**context(device), "sizes": asdict(sizes)}, json_path=json_path)
    print(f"gpu_check on {report.context['device_name']} ({device}), torch {torch.__version__}, "
          f"transformers {report.context['transformers']}", flush=True)
    present: list[tuple[str, str, int]] = []
    if not shapes_only:
        if not speed_only:
            _correctness(report, device, sizes)
            present = _real(report, device, sizes)
        elif not synthetic:
            present = real_pairs.present_pairs()
        if not quick:
            _speed(report, device, present, sizes, synthetic)
    if not quick or shapes_only:
        report.run("Space shapes", lambda: space_shapes.check_space_shapes(device, repeats=sizes.price_repeats))
    report.finish()
    return report
