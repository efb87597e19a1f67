"""Kernel forms found by trying (model/kernels/cpu_forms.py): the mode setting, a refused or wrong op read as
"does not run", the portable mode turning oneDNN off everywhere, and measurements kept apart per mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ears_core.model.kernels import cpu_forms, packed_linear
from ears_core.model.measuring.measured import machine_tag


def test_the_mode_is_read_and_a_bad_value_names_the_fix(monkeypatch) -> None:
    monkeypatch.delenv("EARS_CPU_KERNELS", raising=False)
    assert cpu_forms.mode() == "best"
    for raw, want in (("portable", "portable"), (" Portable ", "portable"), ("best", "best"), ("", "best")):
        monkeypatch.setenv("EARS_CPU_KERNELS", raw)
        assert cpu_forms.mode() == want
    monkeypatch.setenv("EARS_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="EARS_CPU_KERNELS='fast': use best .* or portable"):
        cpu_forms.mode()
    from ears_core import load_pair
    from ears_core.model.loading.hub import ModelLoadError

    with pytest.raises(ModelLoadError, match="EARS_CPU_KERNELS='fast'"):  # before any weights: the app shows it
        load_pair("embedded", None, device="cpu")


def test_a_refused_op_and_a_wrong_answer_both_read_as_not_running(monkeypatch) -> None:
    assert cpu_forms.tried(lambda: True) and not cpu_forms.tried(lambda: False)

    def refuse() -> bool:
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw")

    assert not cpu_forms.tried(refuse)
    cpu_forms._int4_probe.cache_clear()
    try:
        monkeypatch.setattr(torch, "_weight_int4pack_mm_for_cpu",
                            lambda x, w, group, sz: torch.zeros(x.shape[0], 32, dtype=x.dtype), raising=False)
        assert not cpu_forms.int4_runs()  # it ran, but gave zeros: not a form to use
    finally:
        monkeypatch.undo()
        cpu_forms._int4_probe.cache_clear()
    cpu_forms._onednn_probe.cache_clear()
    try:
        monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", lambda *a: refuse(), raising=False)
        assert not cpu_forms.onednn_packs(torch.bfloat16) and not packed_linear.available(torch.float32)
        layer = nn.Linear(64, 64)
        assert packed_linear.pack_layer(layer) is layer  # the plain layer runs: nothing reaches a user
    finally:
        monkeypatch.undo()
        cpu_forms._onednn_probe.cache_clear()
    cpu_forms._float64_attention_probe.cache_clear()
    try:  # the exact attention measured against the plain product: a kernel that runs but errs does not count
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda q, k, v, **kw: torch.zeros_like(q))
        assert not cpu_forms.float64_attention_runs()
    finally:
        monkeypatch.undo()
        cpu_forms._float64_attention_probe.cache_clear()
    assert cpu_forms.float64_attention_runs()


def test_portable_turns_onednn_off_and_keeps_its_measurements_apart(monkeypatch) -> None:
    from conftest import tiny_llama
    from ears_core.policy.profile import profile_key

    model = tiny_llama(0)
    monkeypatch.setenv("EARS_CPU_KERNELS", "best")
    best_tag, best_key = machine_tag(torch.bfloat16), profile_key(model)
    monkeypatch.setenv("EARS_CPU_KERNELS", "portable")
    assert profile_key(model) == best_key + "|portable"  # price curves too are cached apart
    assert not cpu_forms.onednn_packs(torch.float32) and not cpu_forms.onednn_packs(torch.bfloat16)
    layer = nn.Linear(4096, 4096)
    assert packed_linear.pack_layer(layer) is layer
    assert machine_tag(torch.bfloat16) == best_tag.replace(f"|{cpu_forms.cpu_class()}|",
                                                           f"|{cpu_forms.cpu_class()}|portable|")
    report = cpu_forms.report()
    assert report["mode"] == "portable" and report["onednn_bfloat16"] is False
    assert report["float64_attention"] is True and report["cpu_class"] == cpu_forms.cpu_class()


def test_the_probes_agree_with_the_ops_themselves() -> None:
    """Where a probe says a form runs, the op runs on a real shape; where it says not, the op raises or is absent."""
    from ears_core.model.kernels.gguf_q4 import int4_linear, pack_q4_1
    from ears_core.model.kernels.int4_linear import q4_1_blocks

    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 128).to(torch.bfloat16)
    if cpu_forms.int4_runs():
        assert int4_linear(x, pack_q4_1(*q4_1_blocks(w))).shape == (2, 64)
    for dtype in (torch.float32, torch.bfloat16):
        if cpu_forms.onednn_packs(dtype):
            assert packed_linear.PackedLinear(nn.Linear(128, 64, dtype=dtype))(x.to(dtype)).shape == (2, 64)
        elif cpu_forms.mode() == "best" and torch.backends.mkldnn.is_available():
            with pytest.raises(Exception):
                torch.ops.mkldnn._reorder_linear_weight(w.to(dtype), None)


def test_the_int4_kernel_pays_where_aten_vectorises_and_not_with_its_scalar_kernels() -> None:
    """cpu_forms.py, pays: the ratio is timed here. ATen's scalar kernels (``ATEN_CPU_CAPABILITY=default``, as the
    suite's DEFAULT leg runs) take 6.5-11x float32's time at one row, AVX512 0.45x, AVX2 0.9x on two threads and
    1.6x on one (docs/measurements.md)."""
    if not cpu_forms.int4_runs():
        assert cpu_forms.int4_ratio() is None and not cpu_forms.int4_pays()
        return
    ratio = cpu_forms.int4_ratio()
    assert ratio > 0 and cpu_forms.report()["int4_over_float32"] == round(ratio, 2)
    if cpu_forms.cpu_class() == "DEFAULT":
        assert ratio > cpu_forms.INT4_PAYS and not cpu_forms.int4_pays()
    elif cpu_forms.cpu_class() in ("AVX2", "AVX512"):
        assert ratio < cpu_forms.INT4_PAYS and cpu_forms.int4_pays()


def test_measurements_are_kept_apart_per_cpu_model_and_onednn_ceiling(monkeypatch) -> None:
    """cpu_forms.py, machine: two CPUs of one class sharing a cache, or the AVX2 emulation beside the native run,
    never read each other's measurements."""
    from conftest import tiny_llama
    from ears_core.policy.profile import profile_key

    model = tiny_llama(0)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    assert cpu_forms.machine() == cpu_forms.cpu_model() != ""
    plain_tag, plain_key = machine_tag(torch.bfloat16), profile_key(model)
    assert f"|{cpu_forms.cpu_model()}|" in plain_tag and f"|{cpu_forms.cpu_model()}|" in plain_key
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core")
    assert cpu_forms.machine() == cpu_forms.cpu_model() + "|onednn<=AVX512_CORE"
    assert machine_tag(torch.bfloat16) != plain_tag and profile_key(model) != plain_key
    monkeypatch.setattr(cpu_forms, "cpu_model", lambda: "another CPU of this class")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert machine_tag(torch.bfloat16) != plain_tag and profile_key(model) != plain_key
