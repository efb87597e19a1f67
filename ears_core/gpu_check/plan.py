"""The order the GPU check runs in, and the device context its report starts with.

Terms
-----
subject    the pair the speed part measures: the largest real pair present (real_pairs.py), else the
           synthetic skip pair (synthetic.py) in the device's default dtype (bfloat16 on CUDA).
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from ears_core.gpu_check import captured, correctness, real_pairs, speed, waits
from ears_core.gpu_check.outcome import Check, Report
from ears_core.gpu_check.synthetic import SKIP_CPU, SKIP_GPU, skip_pair
from ears_core.model.cuda.graphed import graphed_or_eager
from ears_core.model.loading.hub import resolve_dtype
from ears_core.pair import ModelPair, load_pair
from ears_core.rules import EARSRule
from ears_core.serve.session import Session

__all__ = ["run_all", "context"]


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
        ctx.update(device_name=f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads")
    return ctx


def _correctness(report: Report, device: torch.device) -> None:
    tokens = 48 if device.type == "cuda" else 24  # the CPU form runs in the test suite
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        report.run(f"greedy equality {name}", lambda d=dtype: correctness.greedy_equality(device, d, tokens))
    report.run("greedy equality captured bfloat16",
               lambda: correctness.greedy_equality(device, torch.bfloat16, tokens, captured=True))
    report.run("lossless ordinary rule", lambda: correctness.lossless(device))
    report.run("EARS emits its exact law", lambda: correctness.lossless(device, rule=EARSRule(beta=0.3),
                                                                        expect="emitted"))
    report.run("same decisions as CPU", lambda: correctness.same_decisions(device))
    report.run("bad draft ids", lambda: correctness.bad_draft_ids(device))
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        report.run(f"KV rollback {name}", lambda d=dtype: correctness.rollback(device, d))


def _real(report: Report, device: torch.device) -> list[tuple[str, str, int]]:
    present = real_pairs.present_pairs()
    if not present:
        report.run("real pairs", lambda: Check("", "skip", "none present: prepare the embedded pair (python -m "
                                               "ears_core.model.loading.embedded --prepare) or put a preset's target and "
                                               "draft in the Hugging Face cache", {}))
    for target, draft, _ in present:
        tokens = 48 if device.type == "cuda" else 24  # a 2-core CPU decodes a 135M target at about 30 tokens/s
        report.run(f"real pair {target}", lambda t=target, d=draft: real_pairs.check_real_pair(t, d, device, tokens))
    return present


def _subject(device: torch.device, present: list[tuple[str, str, int]], synthetic: bool = False
             ) -> tuple[ModelPair, list[torch.Tensor], int]:
    """The speed part's pair, its prompts and new tokens per run (module terms)."""
    cuda = device.type == "cuda"
    new_tokens, n_prompts = (128, 3) if cuda else (32, 2)
    if present and not synthetic:
        pair = load_pair(present[0][0], present[0][1], device=device)
        return pair, [pair.encode(p) for p in real_pairs.REAL_PROMPTS[:n_prompts]], new_tokens
    shape = SKIP_GPU if cuda else SKIP_CPU
    dtype = resolve_dtype(None, device)
    target, draft = skip_pair(device, dtype, shape)
    target, draft = graphed_or_eager(target), graphed_or_eager(draft)  # as load_pair does on CUDA
    pair = ModelPair(target, draft, None, device, dtype, f"synthetic skip pair ({shape.layers} layers <- "
                     f"{shape.draft_layers}, {shape.params_m:.0f}M parameters)", shape.vocab, "synthetic")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, shape.vocab, (1, 32), generator=g).to(device) for _ in range(n_prompts)]
    return pair, prompts, new_tokens


def _capture(pair: ModelPair, prompt: torch.Tensor) -> Check:
    seconds = captured.prepare(pair, prompt)
    parts = captured.graphed_parts(pair)
    graphs = sum(len(p.runner.bank.graphs) for p in parts)
    if not parts:
        return Check("", "skip", "nothing in this pair runs as captured graphs (EARS_CUDA_GRAPHS=0, or a model the "
                     "static pass cannot run: model/passes/static_decoder.py)", {})
    return Check("", "pass", f"{graphs} graphs of {len(parts)} models captured in {seconds:.2f} s",
                 {"capture_s": round(seconds, 3), "graphs": graphs, "models": len(parts)})


def _speed(report: Report, device: torch.device, present: list[tuple[str, str, int]], synthetic: bool = False) -> None:
    pair, prompts, new_tokens = _subject(device, present, synthetic)
    report.context["speed_pair"] = pair.name
    eager = captured.eager_twin(pair) if device.type == "cuda" else None
    if eager is not None:
        report.run("capture", lambda: _capture(pair, prompts[0]))
    curve_check = report.run("price curve", lambda: speed.price_curve(pair))
    if curve_check.status != "pass":
        return
    session = Session(pair, prices=speed.curve_of(curve_check))
    report.run("tokens/s", lambda: speed.tokens_per_second(session, prompts, new_tokens))
    report.run("round waits", lambda: waits.round_waits(session, prompts[0]))
    if eager is None or not captured.graphed_parts(pair):
        return
    eager_curve = report.run("price curve eager", lambda: speed.price_curve(eager))
    if eager_curve.status == "pass":
        eager_session = Session(eager, prices=speed.curve_of(eager_curve))
        report.run("tokens/s eager", lambda: speed.tokens_per_second(eager_session, prompts, new_tokens))
    report.run("captured = eager", lambda: captured.same_tokens(pair, eager, prompts, new_tokens))
    report.run("capture, all told", lambda: Check("", "pass", f"{captured.capture_seconds(pair):.2f} s capturing "
                                                  "over the whole check", {"capture_s": captured.capture_seconds(pair)}))



def run_all(device: torch.device, quick: bool = False, synthetic: bool = False, speed_only: bool = False) -> Report:
    """Every check on ``device``, in order: correctness, real pairs, then (unless ``quick``) speed.
    ``synthetic``: the speed part on the synthetic skip pair even where a real pair is present;
    ``speed_only``: the speed part alone."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the report's lines only
    report = Report(context(device))
    print(f"gpu_check on {report.context['device_name']} ({device}), torch {torch.__version__}, "
          f"transformers {report.context['transformers']}", flush=True)
    present: list[tuple[str, str, int]] = []
    if not speed_only:
        _correctness(report, device)
        present = _real(report, device)
    elif not synthetic:
        present = real_pairs.present_pairs()
    if not quick:
        _speed(report, device, present, synthetic)
    return report
