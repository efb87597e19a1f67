"""Decoding speed by the thread that decodes, and with or without huge pages (docs/measurements.md).

Modes (each in its own process: an OpenMP pool, once made, lasts as long as its thread):

same      the main thread decodes every run (its first run gives it its pool)
other     the main thread first runs a parallel torch op, as loading the models there once did, and each
          run decodes in a new thread: two pools on the cores, so libgomp's idle workers sleep and every
          parallel region waits for a wake-up (model/passing.py)
passing   the main thread does no torch work (``load_pair`` loads in a passing thread); each run decodes
          in a new thread, one at a time

Each run: EARS beta 0.1, T = 0.9, fixed K = 2, a chain, ``--tokens`` new tokens on one prompt; with
``--target-only``, plain target decoding instead. Prints one tokens/s figure a run, after a warm-up run. Huge pages for the
weights are on by default (``ears_core/__init__.py``); ``THP_MEM_ALLOC_ENABLE=0`` in the environment turns
them off. Run it alone on the machine.

    python scripts/measure_threads.py --mode same --runs 6
    THP_MEM_ALLOC_ENABLE=0 python scripts/measure_threads.py --mode same --runs 6 --target-only
"""

from __future__ import annotations

import argparse
import threading

import torch

from ears_core import load_pair
from ears_core.serve.session import RunConfig, Session

PROMPT = "Why do leaves change colour in autumn? Answer in a few sentences."


def one_run(session: Session, ids, cfg: RunConfig, target_only: bool) -> float:
    run = session.baseline(ids, cfg) if target_only else session.speculative(ids, cfg)
    for _ in run:
        pass
    return run.gen.stats().tokens_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("same", "other", "passing"), default="same")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--target-only", action="store_true")
    a = ap.parse_args()
    session = Session(load_pair())
    ids = session.encode(PROMPT)
    cfg = RunConfig(rule="ears", params={"beta": 0.1}, temperature=0.9, k=2, max_new_tokens=a.tokens,
                    draft_length="fixed", draft_shape="chain")
    if a.mode == "other":
        torch.randn(512, 512) @ torch.randn(512, 512)  # a parallel region: the main thread's pool
    for i in range(a.runs + 1):  # run 0 warms up (first calls of each kernel) and is not counted
        if a.mode == "same":
            tps = one_run(session, ids, cfg, a.target_only)
        else:
            out: list[float] = []
            t = threading.Thread(target=lambda: out.append(one_run(session, ids, cfg, a.target_only)))
            t.start()
            t.join()
            tps = out[0]
        print(f"run {i}: {tps:.1f} tokens/s" if i else f"warm-up: {tps:.1f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
