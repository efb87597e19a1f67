"""Where a lean target step's time goes on this machine, taken apart by leaving pieces out (not a test).

The embedded lean int4 target (model/passes/lean_llama.py, its layers run by model/passes/decoder.py) decodes a run
of one-token passes after a prompt of each of ``--contexts`` tokens (64 by default), as target-only decoding does;
the mean pass is measured whole, then with the output head, the int4 matrix calls, the attention and the RMSNorms left
out in turn (each replaced by a ready tensor of the right shape, so what follows runs on the same shapes; each stays
left out while the next is), each the best of ``--repeats`` runs. The differences are the pieces' prices; what is
left is every other op and the Python around them. It also times the same int4 matrix calls back to back, outside a
pass: what the kernel costs on its own.

    python scripts/lean_step_parts.py [--steps 96] [--repeats 5] [--threads 2] [--widths 1,2,3,4,5] [--contexts 64,512,1000]

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F

import ears_core.model.passes.decoder as decoder
from ears_core.model.loading.embedded import prepare_embedded
from ears_core.model.kernels.gguf_q4 import GROUP
from ears_core.model.loading.target_path import lean_embedded


def mean_pass_ms(model: Any, steps: int, repeats: int, width: int = 1, context: int = 64) -> float:
    """Best of ``repeats`` runs of the mean pass over ``width`` tokens (all rows' logits, as a verify pass
    keeps them) over ``steps`` consecutive passes after a ``context``-token prompt, each cut back to one new
    position as a round that keeps one token would."""
    ids = torch.randint(0, 49000, (1, context), generator=torch.Generator().manual_seed(0))
    step = torch.full((1, width), 7)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            cache = model.new_cache(context + steps + width)  # no growing inside the timing
            model(ids, past_key_values=cache, logits_to_keep=1)
            t0 = time.perf_counter()
            for _ in range(steps):
                model(step, past_key_values=cache, logits_to_keep=width)
                if width > 1:
                    cache.crop(cache.get_seq_length() - width + 1)
            best = min(best, (time.perf_counter() - t0) / steps * 1e3)
    return best


class _Functional:
    """``torch.nn.functional`` with some functions replaced (module-level ``F`` of the pass, model/passes/decoder.py)."""

    def __init__(self, **replaced: Any) -> None:
        self.replaced = replaced

    def __getattr__(self, name: str) -> Any:
        return self.replaced.get(name) or getattr(F, name)


@contextmanager
def left_out(model: Any, piece: str) -> Iterator[None]:
    ready: dict[tuple, torch.Tensor] = {}

    def zeros(*shape: int) -> torch.Tensor:
        return ready.setdefault(shape, torch.zeros(shape, dtype=torch.bfloat16))

    saved = (decoder.int4_rows, decoder.F, model._logits)
    gone = saved[1].replaced if isinstance(saved[1], _Functional) else {}  # functions already left out
    if piece == "the output head":
        model._logits = lambda h: zeros(h.shape[0], model.embed.weight.shape[0])
    elif piece == "the int4 matrix calls":
        decoder.int4_rows = lambda x, w, bias=None: zeros(x.shape[0], w.out_features)
    elif piece == "attention":
        decoder.F = _Functional(**gone, scaled_dot_product_attention=lambda q, k, v, **kw: q)
    elif piece == "the RMSNorms":
        decoder.F = _Functional(**gone, rms_norm=lambda x, shape, weight, eps: x,
                                layer_norm=lambda x, shape, weight, bias, eps: x)  # decoder.py: norm
    try:
        yield
    finally:
        decoder.int4_rows, decoder.F, model._logits = saved


def int4_back_to_back_ms(model: Any, repeats: int) -> float:
    """The pass's int4 matrix calls, one after another with nothing between them (best of ``repeats``)."""
    weights = [w for layer in model.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    xs = {w.in_features: torch.randn(1, w.in_features).to(torch.bfloat16) for w in weights}
    op = torch.ops.aten._weight_int4pack_mm_for_cpu
    best = float("inf")
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        for w in weights:
            op(xs[w.in_features], w.packed, GROUP, w.scales_zeros)
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--widths", type=lambda v: [int(w) for w in v.split(",")], default=[1],
                    help="pass widths to take apart, e.g. 1,2,3,4,5 (a verify pass over m tokens keeps m rows)")
    ap.add_argument("--contexts", type=lambda v: [int(c) for c in v.split(",")], default=[64],
                    help="prompt lengths before the passes, e.g. 64,256,512,1000 (attention reads the whole cache)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = lean_embedded(prepare_embedded())
    if model is None:
        raise SystemExit("the lean target does not run on this CPU (its int4 kernel does not run here or rows are not exact)")
    for context in a.contexts:
        for width in a.widths:
            whole = mean_pass_ms(model, a.steps, a.repeats, width, context)
            print(f"a pass over {width} token(s) after {context}: {whole:.2f} ms (mean of {a.steps}, best of {a.repeats})")
            rest = whole
            with ExitStack() as gone:  # each piece stays left out while the next is
                for piece in ("the output head", "the int4 matrix calls", "attention", "the RMSNorms"):
                    gone.enter_context(left_out(model, piece))
                    without = mean_pass_ms(model, a.steps, a.repeats, width, context)
                    print(f"  {piece}: {rest - without:.2f} ms")
                    rest = without
            print(f"  every other op: {rest:.2f} ms")
    print(f"the same int4 calls back to back: {int4_back_to_back_ms(model, a.repeats):.2f} ms")


if __name__ == "__main__":
    main()
