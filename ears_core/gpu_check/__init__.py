"""``python -m ears_core.gpu_check``: the CUDA path of ears_core checked in one command.

It needs torch, transformers, accelerate, safetensors and scipy only (no gradio, plotly or test
packages) and no network. It prints one line per check, a verdict, then one line of JSON
(``gpu_check: {...}``), and writes the same JSON to one file (``--json``; default ``gpu_check.json`` in
``$OUT`` where that is set, else in the working directory), rewritten after every check so that a run
stopped at a time limit keeps what finished. Exit code 0: every check held (skips allowed); 1: a check
failed; 2: no CUDA device is visible (one line says so; ``--device cpu`` runs the same checks on the CPU,
smaller, which the test suite does so that the check never rots). ``scripts/gpu_round.sh`` runs it under a
time limit on a machine with a GPU.

What it checks (each module defines its terms):
  correctness.py   greedy equality (chain and tree, today's rounds and the device rounds, float32 and
                   bfloat16, captured and eager) on a small Llama-shaped pair built in memory; the ordinary
                   rule lossless and EARS exact (chi-square over many seeded rows, through verify and through
                   the device round's device_verify); verify / verify_tree deciding on the device exactly as on
                   the CPU; bad draft ids on the unchecked path; the KV-cache rollback against a fresh prefill.
  device_rounds.py the device round's verify and tree walk on the device against today's on the CPU, every
                   registered rule; whole runs at T = 0.9 with and without the device round, the same tokens.
  real_pairs.py    the prepared embedded pair and presets in the local Hugging Face cache, if present
                   (skipped, never passed, when not): greedy equality on five prompts, EARS 0.1 at T = 0.9.
  speed.py         (left out by ``--quick``) the price curve m = 1..16, the draft step, tokens/s like for like
                   (target-only; a fixed-k chain and the device chain at that k; a fixed tree and the device
                   tree of that spec; at T = 0 and at EARS 0.1, T = 0.9) for the largest pair present (else, or
                   with ``--synthetic``, a synthetic layer-skip pair, synthetic.py).
  waits.py         the waits a round of the device chain and tree: one read, nothing else (counted, and on CUDA
                   under ``set_sync_debug_mode("error")``).
  captured.py      on CUDA, the same pair with its passes as captured CUDA graphs (the default) and eager:
                   capture time, both price curves and tokens/s, and the same greedy tokens.
  space_shapes.py  (left out by ``--quick``; alone with ``--space-shapes``) the ZeroGPU Space's default pair at its
                   real shapes (Qwen2.5-7B-Instruct drafted by Qwen2.5-0.5B-Instruct) with seeded random weights:
                   memory, a cold request's first token, capture, V(m), the draft step, the step against its
                   weights' read time at the measured bandwidth, a chain round's cost in target steps.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["main"]

NO_CUDA = ("gpu_check: no CUDA device is visible (torch {torch}, CUDA build {cuda}): run it on a machine with an "
           "NVIDIA GPU and a CUDA build of torch, or pass --device cpu to run the same checks on the CPU")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m ears_core.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--quick", action="store_true", help="correctness only: leave out the speed part")
    ap.add_argument("--synthetic", action="store_true",
                    help="the speed part on the synthetic skip pair even where a real pair is present")
    ap.add_argument("--speed-only", action="store_true",
                    help="the speed part and the Space's shapes alone (no correctness checks)")
    ap.add_argument("--space-shapes", action="store_true",
                    help="the Space's default pair at its real shapes, random weights, alone (space_shapes.py)")
    ap.add_argument("--json", type=Path, default=None,
                    help="the report's JSON file (default: gpu_check.json in $OUT where that is set, else here)")
    return ap.parse_args(argv)


def json_path(given: Path | None) -> Path:
    """Where the report's JSON goes (see ``--json``)."""
    return given if given is not None else Path(os.environ.get("OUT") or ".") / "gpu_check.json"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(NO_CUDA.format(torch=torch.__version__, cuda=torch.version.cuda), flush=True)
        from ears_core.gpu_check.outcome import EXIT_NO_CUDA
        return EXIT_NO_CUDA
    from ears_core.gpu_check.plan import run_all

    report = run_all(torch.device(args.device), quick=args.quick, synthetic=args.synthetic,
                     speed_only=args.speed_only, json_path=json_path(args.json), shapes_only=args.space_shapes)
    print(report.summary_line(), flush=True)
    print(report.json_line(), flush=True)
    print(f"the report as JSON: {report.json_path}", flush=True)
    return report.exit_code()


if __name__ == "__main__":  # pragma: no cover - __main__.py is the entry point
    sys.exit(main())
