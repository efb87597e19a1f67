"""The plug-in's pieces without an engine: settings, the vLLM checks, the CPU expand fix, counters."""

from __future__ import annotations

import json

import pytest
import torch

import ears_vllm
from ears_vllm import counters, plugin


def test_settings():
    assert ears_vllm.config_from_env({}) is None
    assert ears_vllm.config_from_env({"EARS_VLLM_RULE": " "}) is None
    assert ears_vllm.config_from_env({"EARS_VLLM_RULE": "ears"}) == ears_vllm.RuleConfig("ears", 0.1)
    assert ears_vllm.config_from_env({"EARS_VLLM_RULE": "EARS", "EARS_VLLM_BETA": "0.3"}).beta == 0.3
    assert ears_vllm.config_from_env({"EARS_VLLM_RULE": "ordinary", "EARS_VLLM_BETA": "5"}) == ears_vllm.RuleConfig("standard")
    assert ears_vllm.config_from_env({"EARS_VLLM_RULE": "entropy"}).name == "ears-entropy"
    for env, word in [({"EARS_VLLM_RULE": "bogus"}, "EARS_VLLM_RULE"),
                      ({"EARS_VLLM_RULE": "typical"}, "typical acceptance"),
                      ({"EARS_VLLM_RULE": "ears", "EARS_VLLM_BETA": "-0.1"}, "EARS_VLLM_BETA"),
                      ({"EARS_VLLM_RULE": "ears", "EARS_VLLM_BETA": "nan"}, "EARS_VLLM_BETA"),
                      ({"EARS_VLLM_RULE": "ears", "EARS_VLLM_BETA": "abc"}, "EARS_VLLM_BETA")]:
        with pytest.raises(ears_vllm.ConfigError) as err:
            ears_vllm.config_from_env(env)
        assert word in str(err.value) and "\n" not in str(err.value)


def test_this_vllm_is_known():
    plugin.check_vllm()  # the pinned vLLM: no ConfigError


def test_expand_fix():
    """vLLM 0.32's CPU expand fallback returns garbage; the plug-in's gives expand_kernel's result."""
    from vllm.utils import cpu_triton_utils as ctu

    temps = torch.tensor([0.9, 0.0, 0.7])
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    want = torch.tensor([0.9, 0.9, 1.0, 1.0, 1.0, 0.7])
    out = torch.full((6,), -7.0)
    ears_vllm.expand_kernel_impl(out, temps, cu, 0, 1, 128)
    assert torch.equal(out, want)
    ints = torch.tensor([5, 0, 3], dtype=torch.int32)
    out_i = torch.empty(6, dtype=torch.int32)
    ears_vllm.expand_kernel_impl(out_i, ints, cu, 0, 0, 128)
    assert out_i.tolist() == [5, 5, 0, 0, 0, 3]
    original = plugin._ORIGINAL_EXPAND_IMPL or ctu._expand_kernel_impl
    if original is not ears_vllm.expand_kernel_impl:  # the bug as reported: the output is never written
        from vllm.platforms import current_platform

        current_platform.import_kernels()  # the C++ kernels built for this CPU (vllm._C or _C_AVX512 / _C_AVX2)
        stale = torch.full((6,), -7.0)
        original(stale, temps, cu, 0, 1, 128)
        assert not torch.equal(stale, want)


def test_counters_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv(counters.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(counters.ENV_RUN, "r1")
    c = counters.Counters("ears(beta=0.1)")
    c.add(1, 6, 4, 1)
    c.add(1, 3, 3, 0)
    (tmp_path / "counters-r1-99999.json").write_text(json.dumps({"rule": "x", "calls": 1, "drafted": 1,
                                                                 "accepted": 1, "pardoned": 1}))
    (tmp_path / "counters-r0-1.json").write_text(json.dumps({"calls": 100}))  # another run: not summed
    total = ears_vllm.read_counters()
    assert (total["calls"], total["drafted"], total["accepted"], total["pardoned"], total["processes"]) == (3, 10, 8, 2, 2)
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(counters.PrometheusCollector("ears(beta=0.1)"))
    text = generate_latest(registry).decode()
    assert 'ears_vllm_pardoned_tokens_total{rule="ears(beta=0.1)"} 2.0' in text
