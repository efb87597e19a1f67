"""Server configuration from environment variables: models, device, address and public limits.

Terms
-----
pair        the target and the draft the app loads first. ``EARS_TARGET`` / ``EARS_DRAFT`` take
            what ``load_pair`` takes: ``embedded``, a Hugging Face id or a local folder.
            ``EARS_DRAFT=ngram`` (or ``none``) drafts by n-gram prompt lookup, no draft model.
            Unset ``EARS_DRAFT`` means: the embedded draft for the embedded target, the preset's
            draft for a preset target (``ears_core.pair.PRESETS``), else n-gram lookup.
device      ``auto`` (CUDA when a GPU is visible, else CPU), ``cpu``, ``cuda`` (accelerate's
            device map spreads a target that does not fit one GPU) or ``cuda:N`` (one GPU).
limits      what one request may ask of a public server: new tokens, prompt characters and
            seconds of decoding; the queue holds at most ``queue_size`` waiting requests and
            runs ``concurrency`` at once.

``Settings.from_env()`` reads the variables below and raises ``SettingsError`` (a ValueError)
naming the variable, the bad value and the fix. Nothing is read at import time.

=======================  ==========  ====================================================
variable                 default     meaning
=======================  ==========  ====================================================
EARS_TARGET              embedded    target model: embedded, hub id or folder
EARS_DRAFT               (see pair)  draft model, or ngram
EARS_DEVICE              auto        auto, cpu, cuda, cuda:N
HOST                     127.0.0.1   address to bind (0.0.0.0 in the Docker image)
PORT                     7860        port to bind
EARS_MAX_NEW_TOKENS      512         upper bound of the max-new-tokens field
EARS_MAX_PROMPT_CHARS    4000        longest prompt accepted, in characters
EARS_QUEUE_SIZE          64          requests waiting at most; more are turned away
EARS_CONCURRENCY         1           requests decoded at once (more time each other: a run that
                                     overlapped another is labelled contended, never cached)
EARS_TIMEOUT_S           120         seconds of decoding per request before it stops
EARS_ALLOW_DOWNLOAD      0           1: fetch picked models from the hub (a GPU Space)
EARS_CUSTOM_MODELS       1           0: the picker offers presets only, no free text
EARS_CACHE               ~/.cache/ears_studio   the prepared embedded model
=======================  ==========  ====================================================
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from ears_core.pair import AUTO, NGRAM  # EARS_DRAFT values: the target's default draft; n-gram prompt lookup

__all__ = ["Settings", "SettingsError", "NGRAM", "AUTO"]

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """An environment variable has a value the app cannot use; the message names the fix."""


@dataclass(frozen=True)
class Settings:
    target: str = "embedded"
    draft: str = AUTO  # "auto": the default draft for the target (see the module docstring)
    device: str = "auto"
    host: str = "127.0.0.1"
    port: int = 7860
    max_new_tokens: int = 512
    max_prompt_chars: int = 4000
    queue_size: int = 64
    concurrency: int = 1
    timeout_s: float = 120.0
    allow_download: bool = False
    custom_models: bool = True
    cache: str | None = None

    def __post_init__(self) -> None:
        if not _DEVICE.match(self.device):
            raise SettingsError(f"EARS_DEVICE={self.device!r} is not a device: use auto, cpu, cuda or cuda:N")
        for var, value, lo, hi in (("PORT", self.port, 1, 65535), ("EARS_MAX_NEW_TOKENS", self.max_new_tokens, 1, 8192),
                                   ("EARS_MAX_PROMPT_CHARS", self.max_prompt_chars, 1, 1_000_000),
                                   ("EARS_QUEUE_SIZE", self.queue_size, 1, 10_000),
                                   ("EARS_CONCURRENCY", self.concurrency, 1, 64),
                                   ("EARS_TIMEOUT_S", self.timeout_s, 0.001, 86_400)):
            if not lo <= value <= hi:
                raise SettingsError(f"{var}={value!r} is out of range: set it between {lo} and {hi}, or unset it "
                                    "for the default")
        if not self.target.strip():
            raise SettingsError("EARS_TARGET is empty: set it to 'embedded', a Hugging Face id or a folder, "
                                "or unset it for the embedded model")

    @property
    def torch_device(self) -> str | None:
        """The device for ``load_pair``: None lets it pick (CUDA if available, else CPU)."""
        return None if self.device == "auto" else self.device

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """Read the variables in the module docstring from ``env`` (default ``os.environ``)."""
        env = os.environ if env is None else env

        def text(var: str, default: str | None) -> str | None:
            value = env.get(var)
            return default if value is None or not value.strip() else value.strip()

        def number(var: str, default: float, kind: type) -> float:
            raw = text(var, None)
            if raw is None:
                return default
            try:
                value = kind(raw)
            except ValueError:
                what = "a whole number" if kind is int else "a number"
                raise SettingsError(f"{var}={raw!r} is not {what}: set it to e.g. {default:g}, "
                                    "or unset it for the default") from None
            if value != value:  # NaN
                raise SettingsError(f"{var}={raw!r} is not a number: set it to e.g. {default:g}")
            return value

        def flag(var: str, default: bool) -> bool:
            raw = env.get(var)
            if raw is None:
                return default
            value = raw.strip().lower()
            if value in _TRUE:
                return True
            if value in _FALSE:
                return False
            raise SettingsError(f"{var}={raw!r} is not a yes/no value: set it to 1 or 0")

        draft = text("EARS_DRAFT", None) or AUTO
        if draft.lower() in {NGRAM, "none"}:
            draft = NGRAM
        return cls(
            target=text("EARS_TARGET", "embedded"),
            draft=draft,
            device=(text("EARS_DEVICE", "auto") or "auto").lower(),
            host=text("HOST", "127.0.0.1"),
            port=number("PORT", 7860, int),
            max_new_tokens=number("EARS_MAX_NEW_TOKENS", 512, int),
            max_prompt_chars=number("EARS_MAX_PROMPT_CHARS", 4000, int),
            queue_size=number("EARS_QUEUE_SIZE", 64, int),
            concurrency=number("EARS_CONCURRENCY", 1, int),
            timeout_s=number("EARS_TIMEOUT_S", 120.0, float),
            allow_download=flag("EARS_ALLOW_DOWNLOAD", False),
            custom_models=flag("EARS_CUSTOM_MODELS", True),
            cache=text("EARS_CACHE", None),
        )
