"""Hugging Face's rules for a ZeroGPU Space, as data: what the Space's front matter and requirements are
checked against (tests/test_zerogpu_space.py) and what its requests are sized by (``zerogpu``). When
Hugging Face changes a list, the change is one line here; ``SOURCES`` and ``CHECKED`` say where each
rule was read and when.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

__all__ = ["GpuSize", "ZeroGpuRules", "ZEROGPU", "SOURCES", "CHECKED"]

CHECKED = "2026-08-22"  # the hub-docs commit of that day; spaces 0.51.3
SOURCES = MappingProxyType({
    "python_versions": "hub-docs docs/hub/spaces-zerogpu.md, Supported Versions",
    "torch_versions": "hub-docs docs/hub/spaces-zerogpu.md, Supported Versions (full list); any other version stops "
                      "the build with \"No candidate PyTorch version found for ZeroGPU\"",
    "sdk": "hub-docs docs/hub/spaces-zerogpu.md, Compatibility: the Gradio SDK only",
    "platform_packages": "spaces: ZeroGPU installs its own; a pin in requirements.txt can clash at build time",
    "hardware": "huggingface_hub SpaceHardware.ZERO_A10G, the flavour `hf repos create --flavor` takes; free "
                "accounts in good standing may host ZeroGPU Spaces (hub-docs spaces-zerogpu.md)",
    "sizes": "hub-docs docs/hub/spaces-zerogpu.md, Technical Specifications; the duration factor from spaces 0.51.3 "
             "zero/configs.json and zero/client.py (get_duration_seconds)",
    "daily_quota_s": "hub-docs docs/hub/spaces-zerogpu.md, Usage Tiers",
})


@dataclass(frozen=True)
class GpuSize:
    """One ``spaces.GPU(size=...)``: its hardware, memory, the factor a requested duration is multiplied by
    before it is scheduled and counted against a visitor's quota, and its quota cost against ``large``'s."""

    hardware: str
    memory_gb: int
    duration_factor: float
    quota_cost: float


@dataclass(frozen=True)
class ZeroGpuRules:
    """What a ZeroGPU Space must be (see the module's docstring)."""

    sdk: str
    python_versions: tuple[str, ...]
    torch_versions: tuple[str, ...]
    platform_packages: tuple[str, ...]  # installed by the platform: never pinned in the Space's requirements
    hardware: str  # the front matter's suggested_hardware and the flavour a Space is created with
    default_size: str
    sizes: Mapping[str, GpuSize] = field(default_factory=dict)
    daily_quota_s: Mapping[str, int] = field(default_factory=dict)  # account tier -> seconds of GPU a day

    def quota_seconds(self, duration_s: float, size: str | None = None) -> float:
        """The quota a request asking for ``duration_s`` seconds on ``size`` (default: the default size) uses
        up at most."""
        gpu = self.sizes[size or self.default_size]
        return duration_s * gpu.duration_factor * gpu.quota_cost


ZEROGPU = ZeroGpuRules(
    sdk="gradio",
    python_versions=("3.12.12", "3.10.13"),
    torch_versions=("2.8.0", "2.9.1", "2.10.0", "2.11.0"),
    platform_packages=("spaces",),
    hardware="zero-a10g",
    default_size="large",
    sizes=MappingProxyType({
        "large": GpuSize("half an NVIDIA RTX Pro 6000 Blackwell", 48, 1.5, 1.0),
        "xlarge": GpuSize("a whole NVIDIA RTX Pro 6000 Blackwell", 96, 1.0, 2.0),
    }),
    daily_quota_s=MappingProxyType({"unauthenticated": 120, "free account": 300, "PRO account": 2400}),
)
