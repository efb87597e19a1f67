"""The ZeroGPU Space (spaces/zerogpu/app.py): the Studio with each request's GPU work inside a
``spaces.GPU`` call, on a real pair on CUDA, or on the embedded pair where no GPU is attached.

Terms
-----
ZeroGPU     Hugging Face's shared GPUs for Gradio-SDK Spaces (the rules this Space keeps, as data:
            ``zerogpu_rules``). A Space holds a GPU only while a function decorated with ``spaces.GPU``
            runs. That call runs in a worker process forked from the app's, which is given the GPU; its
            arguments and each value it yields are pickled across, so a generator streams as it yields
            (spaces 0.51: ``zero/wrappers.py``). An idle worker is kept for the next call of the same
            decorated function (each decorated function keeps workers of its own).
workers     every handler that decodes goes through ONE decorated function (``gpu_call``: ``on_gpu``, by
            the handler's name), so one worker serves them all: what a call leaves there (the Session,
            its measured prices and cached baselines) serves the next call of any handler, never the
            app's own process.
graphs      the worker is a plain CUDA process once ZeroGPU has moved the weights in, so the pair's passes are
            captured there as CUDA graphs (model/cuda/graphed.py builds its static passes at the first pass, in
            the worker) and replayed while the worker lives; a fresh worker captures again.
on ZeroGPU  ``spaces.config.Config.zero_gpu`` (the Space sets SPACES_ZERO_GPU). ``import spaces`` then
            patches torch: in the thread that imported it, moving weights to "cuda" is recorded (they
            reach the GPU in each worker); in any other thread of the app's process CUDA work fails.
            Off ZeroGPU ``spaces.GPU`` returns the function it decorates unchanged.
start-up    on ZeroGPU the pair loads in the main thread while the app is built (``load_pair`` on
            "cuda:0"), and the app's process makes no Session: the worker's first call makes it
            (``PairSlot.session``), measuring the device's prices and warming up there, on the GPU, and
            no price measurement runs between requests (the GPU goes back when a call ends;
            ``StartupPair``). Off ZeroGPU, as the root app: the pair loads and warms up in a background
            thread, and its prices are measured again between requests.
duration    the GPU seconds a request asks for (``gpu_seconds``): ``START_S`` (a worker's start, the
            weights' move to the GPU, a worker's first Session and warm-up) plus ``S_PER_TOKEN`` per
            token of each decode the request makes (``decodes``: generate's speculative run and its
            target-only baseline; the race's two rules and target-only; the quality sweep's methods on
            each question), at most ``timeout_s`` (the request's decoding budget). Both are allowances,
            not measurements: no pair of this size has run on ZeroGPU's GPUs yet. The shorter a
            duration, the sooner ZeroGPU schedules the request.
budget      a request's decoding budget on ZeroGPU counts its call's start-up: ``on_gpu`` notes when the call's
            duration runs out (``call_ends``), and ``StartupPair.decode_budget_s`` is the least of
            ``timeout_s`` and what is left of the duration after the Session start-up, less ``END_MARGIN_S``,
            so a cold worker's start-up never pushes the decode past the GPU time it asked for.
quota       ZeroGPU multiplies a duration by the size's factor (1.5 on the default ``large``) and counts
            it against the visitor's daily quota; a request asking for more than the visitor has left
            is refused. ``SPACE_ENV``'s decoding budget keeps every request at most ``QUOTA_SHARE`` of an
            unauthenticated visitor's day (``request_quota``), and the page says what each asks for
            (``space_notice``).
pair        on a GPU ``GPU_TARGET`` with its preset draft Qwen2.5-0.5B-Instruct (``pair.PRESETS``: one
            tokenizer), about 16 GB in bfloat16 of the 48 GB of the default size; where no GPU is
            attached, the embedded pair. ``EARS_TARGET`` / ``EARS_DRAFT`` override. On ZeroGPU the
            picker cannot load another pair (a load must run in the main thread): it says so.
defaults    ``SPACE_ENV``: the Space's own defaults for ``Settings`` (shorter requests than the root
            app's, downloads on, presets only); a variable set in the environment wins.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Mapping

import gradio as gr
import torch

from ears_core.model.loading.hub import ModelLoadError
from ears_core.pair import EMBEDDED, ModelPair, load_pair
from ears_core.serve.pair_slot import PairSlot
from ears_core.serve.settings import Settings

from . import LAUNCH_KW, build_app, quality
from .zerogpu_rules import ZEROGPU

__all__ = ["GPU_TARGET", "START_S", "S_PER_TOKEN", "END_MARGIN_S", "call_ends", "QUOTA_SHARE", "SPACE_ENV", "HANDLERS", "StartupPair", "on_zero_gpu",
           "space_settings", "gpu_seconds", "decodes", "largest_request", "request_quota", "space_notice",
           "request_seconds", "gpu_call", "build_space", "launch_kw"]

GPU_TARGET = "Qwen/Qwen2.5-7B-Instruct"  # its preset draft: Qwen/Qwen2.5-0.5B-Instruct
# Allowances, not measurements (no 7B pair has run on a GPU here; docs/gpu.md has what has): a worker's
# start with its first Session and warm-up, and a token of one decode, a target step at worst, with room.
# They give way to figures measured on ZeroGPU's GPU once there are some.
START_S = 20.0
S_PER_TOKEN = 0.05
END_MARGIN_S = 2.0  # seconds of a call's duration kept free of decoding: the last frames' pickling and sending
QUOTA_SHARE = 0.5  # of an unauthenticated visitor's daily quota, at most, for one request: two requests a day at least
# EARS_TIMEOUT_S: START_S + 20 s of decoding = 40 s, x 1.5 on the default size = 60 s of quota (module terms: quota)
SPACE_ENV = {"EARS_MAX_NEW_TOKENS": "256", "EARS_TIMEOUT_S": "20", "EARS_ALLOW_DOWNLOAD": "1",
             "EARS_CUSTOM_MODELS": "0"}
HANDLERS = {"generate": "a Generate", "race": "a Race", "quality_sweep": "a quality sweep"}  # the ones that decode
ONE_PAIR = ("this ZeroGPU Space serves the pair it loaded when it started (ZeroGPU lends a GPU only inside a "
            "request, so a pair is placed on it at start-up): set EARS_TARGET and EARS_DRAFT in the Space's "
            "settings and restart it to serve another")


def _spaces() -> Any:
    """The package ``spaces`` (not the repository's folder of that name, which Python would also import)."""
    try:
        import spaces
    except ImportError:
        spaces = None
    if getattr(spaces, "GPU", None) is None:
        raise ImportError("the ZeroGPU Space needs the package `spaces`: pip install spaces "
                          "(spaces/zerogpu/requirements.txt pins it)")
    return spaces


def on_zero_gpu() -> bool:
    """Whether this process runs on ZeroGPU (module terms)."""
    _spaces()
    from spaces.config import Config

    return bool(Config.zero_gpu)


def space_settings(env: Mapping[str, str] | None = None, zero_gpu: bool = False) -> Settings:
    """The Space's settings: ``SPACE_ENV`` under the environment's own values, the target by the
    hardware (module terms: pair) and, on ZeroGPU, one GPU ("cuda:0": no device map to plan)."""
    env = os.environ if env is None else env
    gpu = zero_gpu or torch.cuda.is_available()  # no CUDA work: a device count (ZeroGPU answers it itself)
    given = {k: v for k, v in env.items() if v.strip()}
    settings = Settings.from_env({**SPACE_ENV, "EARS_TARGET": GPU_TARGET if gpu else EMBEDDED, **given})
    if zero_gpu and settings.device in ("auto", "cuda"):
        settings = replace(settings, device="cuda:0")
    return settings


def gpu_seconds(settings: Settings, runs: int, max_new: int) -> int:
    """The duration of a request making ``runs`` decodes of ``max_new`` tokens (module terms)."""
    return math.ceil(START_S + min(runs * max_new * S_PER_TOKEN, settings.timeout_s))


def _count(value: Any, limit: int) -> int:
    """A request's whole number at most ``limit``; a value the handler will refuse counts as the limit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value:
        return limit
    return min(int(value), limit)


def decodes(name: str, request: Mapping[str, Any], settings: Settings) -> tuple[int, int]:
    """(decodes, tokens each) that the ``name`` handler makes at most for ``request`` (its arguments by
    name; module terms: duration). A handler this module does not know: as many as its time allows."""
    if name in ("generate", "race"):
        runs = 3 if name == "race" else 1 if request.get("with_baseline") is False else 2
        return runs, _count(request.get("max_new"), settings.max_new_tokens)
    if name == "quality_sweep":  # target-only, the ordinary rule and EARS at each beta, on each question
        betas = request.get("betas")
        methods = 2 + (min(len(betas), quality.MAX_BETAS) if isinstance(betas, (list, tuple)) else quality.MAX_BETAS)
        questions = _count(request.get("questions"), quality.MAX_QUESTIONS)
        return questions * methods, min(quality.MAX_NEW, settings.max_new_tokens)
    return 1, 10**9


def request_seconds(handler: Callable, settings: Settings, name: str) -> Callable[..., int]:
    """``spaces.GPU``'s duration for the handler wired as ``name``: called with the handler's own
    arguments (``spaces.GPU`` passes them), it reads what the request will decode (``decodes``)."""
    signature = inspect.signature(handler)

    def duration(*args: Any, **kwargs: Any) -> int:
        try:
            request = signature.bind_partial(*args, **kwargs)
        except TypeError:
            return gpu_seconds(settings, *decodes("", {}, settings))
        request.apply_defaults()
        arguments = request.arguments
        return gpu_seconds(settings, *decodes(name, arguments, settings))

    return duration


def largest_request(name: str) -> dict[str, Any]:
    """The arguments of the longest request the ``name`` handler takes (its duration is the most it asks for)."""
    if name == "quality_sweep":
        return {"questions": quality.MAX_QUESTIONS, "betas": [0.0] * quality.MAX_BETAS}
    return {"max_new": None, "with_baseline": True}  # max_new: the limit's (``_count``)


def request_quota(settings: Settings, name: str) -> tuple[int, float]:
    """(seconds asked for, seconds of quota used up) by the ``name`` handler's longest request (module terms)."""
    seconds = gpu_seconds(settings, *decodes(name, largest_request(name), settings))
    return seconds, ZEROGPU.quota_seconds(seconds)


def space_notice(settings: Settings) -> str:
    """The page's line on ZeroGPU: what each request asks for at most, against a visitor's daily quota."""
    asks = ", ".join(f"{what} {request_quota(settings, name)[0]} s" for name, what in HANDLERS.items())
    size = ZEROGPU.sizes[ZEROGPU.default_size]
    quota = ZEROGPU.daily_quota_s
    return (f"On ZeroGPU each request asks for GPU time before it starts, at most: {asks}. ZeroGPU counts "
            f"{size.duration_factor:g}x that against your daily quota ({quota['unauthenticated'] // 60} min a day "
            f"without logging in, {quota['free account'] // 60} min with a free account); fewer new tokens, "
            "no baseline or fewer questions ask for less.")


_CALL = threading.local()  # .ends: time.monotonic() when this thread's GPU call's duration runs out


def call_ends() -> float | None:
    """When the GPU call this thread runs in must end (``time.monotonic()``), or None outside one."""
    return getattr(_CALL, "ends", None)


def gpu_call(settings: Settings) -> Callable[[Callable, str], Callable]:
    """``build_app``'s ``gpu_call``: each decoding handler runs inside ONE ``spaces.GPU`` function shared by
    all of them (module terms: workers), with its own request's duration."""
    spaces = _spaces()
    handlers: dict[str, Callable] = {}
    durations: dict[str, Callable[..., int]] = {}

    def duration(name: str, *args: Any, **kwargs: Any) -> int:
        return durations[name](*args, **kwargs)

    @spaces.GPU(duration=duration)
    def on_gpu(name: str, *args: Any, **kwargs: Any) -> Any:
        _CALL.ends = time.monotonic() + duration(name, *args, **kwargs)  # module terms: budget
        try:
            yield from handlers[name](*args, **kwargs)
        finally:
            _CALL.ends = None

    def wrap(handler: Callable, name: str) -> Callable:
        if not inspect.isgeneratorfunction(handler):
            raise TypeError(f"{name}: a handler that decodes streams (a generator function)")
        handlers[name], durations[name] = handler, request_seconds(handler, settings, name)

        @functools.wraps(handler)  # Gradio reads the handler's own signature through it
        def call(*args: Any, **kwargs: Any) -> Any:
            yield from on_gpu(name, *args, **kwargs)

        call.gpu_call = on_gpu  # type: ignore[attr-defined]
        return call

    return wrap


class StartupPair(PairSlot):
    """A ZeroGPU Space's slot (module terms: start-up): ``pair`` was loaded in the main thread; each
    worker's first ``session()`` makes its Session and warms it up, measuring the price curve there
    and then; nothing is measured between requests (the worker holds no GPU then). ``switch``
    refuses another pair."""

    background_prices = False

    def __init__(self, settings: Settings, pair: ModelPair) -> None:
        super().__init__(settings, lambda: pair)

    def decode_budget_s(self) -> float:
        """``timeout_s``, or less: what the GPU call has left after its start-up (module terms: budget)."""
        ends = call_ends()
        if ends is None:
            return self.settings.timeout_s
        return max(min(self.settings.timeout_s, ends - time.monotonic() - END_MARGIN_S), 0.0)

    def switch(self, target: str, draft: str | None, check: bool = True,
               progress: Callable[[str], Any] | None = None) -> Any:
        if self.same((target, draft), self.choice):
            return self.loaded  # the pair it serves: nothing to load
        raise ModelLoadError(ONE_PAIR)


def build_space(env: Mapping[str, str] | None = None, pair_loader: Callable[[], ModelPair] | None = None
                ) -> gr.Blocks:
    """The Space's app (module terms). ``pair_loader()`` loads the pair instead (tests)."""
    zero = on_zero_gpu()
    settings = space_settings(env, zero)
    wrap = gpu_call(settings)
    if not zero:
        return build_app(pair_loader, settings, gpu_call=wrap)
    pair = pair_loader() if pair_loader is not None else load_pair(
        settings.target, settings.draft, device=settings.torch_device, cache_dir=settings.cache,
        allow_download=settings.allow_download)  # here, in the main thread (module terms: on ZeroGPU)
    return build_app(preload=False, gpu_call=wrap, slot=StartupPair(settings, pair), notice=space_notice(settings))


def launch_kw(settings: Settings, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``launch()``'s keywords: the theme and css, and HOST / PORT where the environment sets them
    (else Gradio's own: a Space sets GRADIO_SERVER_NAME and GRADIO_SERVER_PORT)."""
    env = os.environ if env is None else env
    kw: dict[str, Any] = dict(LAUNCH_KW, show_error=False)
    if env.get("HOST", "").strip():
        kw["server_name"] = settings.host
    if env.get("PORT", "").strip():
        kw["server_port"] = settings.port
    return kw
