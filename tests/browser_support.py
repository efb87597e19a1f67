"""What the browser tests share: Debian's chromium (never `playwright install`), its flags, and
the rule that a missing browser fails in CI (where `make test` installs it) and skips elsewhere."""

from __future__ import annotations

import os
import socket

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def require_chromium() -> None:
    """Call at a browser test module's top: raise in CI, skip the module elsewhere."""
    if not os.path.exists(CHROMIUM) and os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing in CI: `make test` installs it with apt-get; see the Makefile")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (install it with `apt-get install -y chromium`)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
