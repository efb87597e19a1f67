"""Per-round work outside the two model passes (``StepRecord.overhead_ms``), on the embedded pair.

One prompt, 64 tokens, fixed K = 1 and 2, the chain policy (K <= 4) and the cost-model tree (the
default shape, depth 4, at most 8 nodes), at T = 0 and 0.9; prints this
machine's price curve, tokens/s, drafts per round, acceptance, and the mean overhead per round in
ms and in target steps, then target-only tokens/s. Run it alone on the machine.

    python scripts/measure_overhead.py
"""
import statistics
import time

from ears_core import load_pair
from ears_core.policy.costs import describe
from ears_core.serve.session import RunConfig, Session

session = Session(load_pair())
t = time.perf_counter()
session.warm_up()
print(f"warm-up {time.perf_counter() - t:.1f} s\n{describe(session.prices)}")
ids = session.encode("Why do leaves change colour in autumn? Answer in a few sentences.")
for mode, k, shape in (("fixed", 1, "chain"), ("fixed", 2, "chain"), ("policy", 4, "chain"), ("policy", 4, "tree")):
    for temperature in (0.0, 0.9):
        run = session.speculative(ids, RunConfig(rule="standard", params={}, temperature=temperature, k=k,
                                                 max_new_tokens=64, draft_length=mode, draft_shape=shape))
        for _ in run:
            pass
        steps, stats, step_ms = run.gen.steps, run.gen.stats(), session.prices.step_ms
        overhead = statistics.mean(s.overhead_ms for s in steps)
        print(f"{mode} {shape} K={k} T={temperature}: {stats.tokens_per_s:.1f} tokens/s, {stats.drafted / len(steps):.2f} drafts/round, "
              f"acceptance {stats.acceptance_rate}, overhead {overhead:.2f} ms = {overhead / step_ms:.3f} step")
base = session.baseline(ids, RunConfig(rule="standard", params={}, temperature=0.0, max_new_tokens=64))
for _ in base:
    pass
print(f"target-only {base.gen.stats().tokens_per_s:.1f} tokens/s")
