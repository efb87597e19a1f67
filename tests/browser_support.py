"""What the browser tests share: Debian's chromium (never `playwright install`), its flags, the
rule that a missing browser fails in CI (where `make test` installs it) and skips elsewhere, and
where screenshots go.

Screenshots go to the test's temporary folder, so `make test` leaves the work tree as it was. The
README's pictures are refreshed on purpose only: `make screenshots` sets EARS_SCREENSHOTS=assets,
and the browser tests then write assets/screenshot.png and assets/tpp/screenshot.png.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

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


def screenshot_path(tmp_path: Path, name: str) -> Path:
    """Where a test saves the screenshot ``name`` (e.g. "tpp/screenshot.png"): under tmp_path, or
    under the folder EARS_SCREENSHOTS names (relative to the repository) when it is set."""
    folder = os.environ.get("EARS_SCREENSHOTS", "").strip()
    base = (ROOT / folder) if folder else tmp_path
    path = base / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
