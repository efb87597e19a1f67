"""Which kernel forms this CPU runs, found by trying each op on a tiny input, never from a list of CPU flags.

Terms
-----
form        one way to compute an op on a CPU: ``int4`` (PyTorch's int4 kernel on bfloat16 activations:
            kernels/gguf_q4.py), ``onednn`` (a linear layer's weight packed by oneDNN, per dtype:
            kernels/packed_linear.py, the lean target's output head), ``float64 attention`` (SDPA in float64:
            passes/decoder.py's ``Exact``, kernels/exact_rows.py). A flag list lies both ways: oneDNN refuses
            bfloat16 packing without AVX512BW even where the int4 kernel runs with bfloat16 activations (AVX2), and a
            CPU may have flags a VM hides.
probe       the op run once on a tiny input inside ``try``, its result compared with a plain reference; a refusal,
            an error or a wrong answer all read "does not run". Asked once per process and form.
portable    ``EARS_CPU_KERNELS=portable``: only the forms every CPU that PyTorch supports has, plain ATen ops
            (``F.linear``, matrix products, SDPA) and the int4 kernel; no oneDNN packing. ``best`` (the default):
            every form that runs here, the fastest chosen by measurement where the code chooses. Tests force
            ``portable`` so a machine of one class proves the code another class runs.
pays        the int4 kernel pays where its one-row pass through a (1536, 576) weight takes at most ``INT4_PAYS``
            times float32's ``F.linear`` (``int4_ratio``, timed once a process per thread count, best of
            ``RATIO_REPEATS`` interleaved, on torch's threads): under 1 on AVX512 and on AVX2's two threads, under 2
            on one thread, several times ``INT4_PAYS`` with ATen's scalar kernels (``ATEN_CPU_CAPABILITY=default``),
            where the float target decodes several times as fast (docs/measurements.md, "Where the int4 kernel
            does not pay").
machine     what else a measurement here depends on: the CPU's model name, and oneDNN's ISA ceiling where one is
            set (``ONEDNN_MAX_CPU_ISA``, as the AVX2 emulation sets it). Two CPUs of one class may share a cache
            folder (a home directory on a cluster's nodes) and block rows differently (oneDNN's native and emulated
            bfloat16: exact_head.py), so what is measured on one never serves the other.
class       what ATen's own kernels were built for here (``torch.backends.cpu.get_cpu_capability()``: ``AVX2``,
            ``AVX512``, ``DEFAULT`` on ARM without SVE, ...; ``ATEN_CPU_CAPABILITY=avx2`` lowers it).
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["INT4_PAYS", "MODES", "cpu_class", "cpu_model", "float64_attention_runs", "int4_pays", "int4_ratio",
           "int4_runs", "machine", "mode", "onednn_packs", "report", "tag", "tried"]

MODES = ("best", "portable")
INT4_PAYS = 3.0  # module terms: pays. The lean step's other work is a fraction of the float one's (docs/measurements.md)
RATIO_REPEATS = 7
ENV = "EARS_CPU_KERNELS"


def mode() -> str:
    """``$EARS_CPU_KERNELS`` as ``best`` (unset) or ``portable`` (module terms); a bad value raises ValueError."""
    raw = os.environ.get(ENV, "").strip().lower() or "best"
    if raw not in MODES:
        raise ValueError(f"{ENV}={raw!r}: use best (the default: every kernel form that runs here) or portable "
                         "(plain ATen ops and the int4 kernel only)")
    return raw


def cpu_class() -> str:
    """The class ATen's kernels run at here (module terms), e.g. ``AVX2``."""
    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return str(get()) if get is not None else "unknown"


@functools.cache
def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one, else the platform's word for it."""
    import platform

    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """The CPU's model and oneDNN's ISA ceiling where one is set (module terms)."""
    ceiling = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return cpu_model() + (f"|onednn<={ceiling.strip().upper()}" if ceiling else "")


def tag() -> str:
    """The class, and ``|portable`` in that mode: what a measurement's cache key adds (module terms)."""
    return cpu_class() + ("|portable" if mode() == "portable" else "")


def tried(fn: Callable[[], bool]) -> bool:
    """fn() (a probe: module terms), with any exception read as False."""
    try:
        return bool(fn())
    except Exception:  # a refused op raises RuntimeError, NotImplementedError, ... : all mean "not here"
        return False


@functools.cache
def _int4_probe() -> bool:
    from ears_core.model.kernels.gguf_q4 import available, dequantize_q4_1, int4_linear, pack_q4_1

    if not available():
        return False
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (32, 64), generator=g, dtype=torch.uint8)  # (N, K)
    d = torch.rand(32, 2, generator=g) / 8 + 0.01  # (N, K / 32): exact in bfloat16 only roughly
    m = -torch.rand(32, 2, generator=g)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)  # (r, K)
    got = int4_linear(x, pack_q4_1(codes, d, m)).float()  # (r, N)
    want = x.float() @ dequantize_q4_1(codes, d, m).t()
    return got.shape == want.shape and bool(torch.allclose(got, want, rtol=3e-2, atol=0.15))


def int4_runs() -> bool:
    """Whether PyTorch's CPU int4 kernel runs here with bfloat16 activations and gives the right answer (module
    terms: probe); the lean target and the draft head's int4 variant need it."""
    return tried(_int4_probe)


def int4_ratio() -> float | None:
    """The int4 kernel's one-row time over float32 ``F.linear``'s through the same (1536, 576) weight on torch's
    threads (module terms: pays); None where the kernel does not run here."""
    return _int4_ratio(torch.get_num_threads()) if int4_runs() else None


@functools.cache
def _int4_ratio(threads: int) -> float:
    import time

    from ears_core.model.kernels.int4_linear import q4_1_blocks
    from ears_core.model.kernels.gguf_q4 import int4_linear, pack_q4_1

    w = torch.randn(1536, 576, generator=torch.Generator().manual_seed(0)) / 24  # (N, K) float32
    packed = pack_q4_1(*q4_1_blocks(w))
    x = torch.randn(1, 576, generator=torch.Generator().manual_seed(1))  # (1, K)
    xb = x.to(torch.bfloat16)
    calls = (lambda: int4_linear(xb, packed), lambda: F.linear(x, w))
    best = [float("inf")] * 2
    with torch.inference_mode():
        for _ in range(RATIO_REPEATS + 1):  # one more round to warm both up; interleaved: a busy moment hits both
            for i, call in enumerate(calls):
                start = time.perf_counter()
                call()
                best[i] = min(best[i], time.perf_counter() - start)
    return best[0] / best[1]


def int4_pays() -> bool:
    """Whether the int4 kernel runs here and pays against float32 (module terms): the embedded target's default."""
    ratio = int4_ratio()
    return ratio is not None and ratio <= INT4_PAYS


@functools.cache
def _onednn_probe(dtype: torch.dtype) -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g).to(dtype)  # (out, in)
    x = torch.randn(3, 64, generator=g).to(dtype)  # (r, in)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "").float()
    return bool(torch.allclose(got, F.linear(x.float(), w.float()), rtol=2e-2, atol=0.1))


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and runs a ``dtype`` linear weight here (module terms: probe); never when portable."""
    return mode() == "best" and tried(lambda: _onednn_probe(dtype))


@functools.cache
def _float64_attention_probe() -> bool:
    from ears_core.model.passes.decoder import Exact

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 8, generator=g)  # (m, H, D): three rows, two query heads a key/value head
    kv = torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64)  # (2, Hkv, n, D): two cached positions, three new
    new = kv[:, :, 2:].clone()
    kv[:, :, 2:] = 0
    got = Exact(None, torch.float64)(q, new, (kv[:, :, 2:], kv[0][None], kv[1][None]))  # the lean target's, (m, H D)
    keys, values = kv[0].repeat_interleave(2, 0).float(), kv[1].repeat_interleave(2, 0).float()  # (H, n, D) each
    want = torch.softmax(q.transpose(0, 1) @ keys.transpose(1, 2) * 8 ** -0.5, -1) @ values  # (H, m, D): the plain product
    return bool(torch.allclose(got, want.transpose(0, 1).reshape(3, 32), atol=1e-5))


def float64_attention_runs() -> bool:
    """Whether SDPA runs in float64 with grouped queries here (module terms: probe): the exact attention, as the lean
    target runs it (``decoder.Exact``) against the plain softmax product."""
    return tried(_float64_attention_probe)


def report() -> dict[str, object]:
    """What this machine runs, for the docs and the bench: the class, the mode and each form's probe."""
    ratio = int4_ratio()
    return {"cpu_class": cpu_class(), "mode": mode(), "int4": int4_runs(),
            "int4_over_float32": None if ratio is None else round(ratio, 2),
            "onednn_bfloat16": onednn_packs(torch.bfloat16), "onednn_float32": onednn_packs(torch.float32),
            "float64_attention": float64_attention_runs()}
