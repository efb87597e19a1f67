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
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

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


def launch(demo: Any) -> str:
    """Serve a built app on a free local port without blocking; its URL."""
    from ears_core.studio import LAUNCH_KW
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **LAUNCH_KW)
    return f"http://127.0.0.1:{port}/"


@contextmanager
def served(demo: Any) -> Iterator[str]:
    """``launch(demo)``, closed again on the way out."""
    try:
        yield launch(demo)
    finally:
        demo.close()


def screenshot_path(tmp_path: Path, name: str) -> Path:
    """Where a test saves the screenshot ``name`` (e.g. "tpp/screenshot.png"): under tmp_path, or
    under the folder EARS_SCREENSHOTS names (relative to the repository) when it is set."""
    folder = os.environ.get("EARS_SCREENSHOTS", "").strip()
    base = (ROOT / folder) if folder else tmp_path
    path = base / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# Bounding boxes of a plotly chart's parts, in page pixels: the legend's background, the chart's title,
# the subplot titles (annotations), the plot areas (their drag rectangles) and the axis titles.
_COLLISIONS_JS = """el => {
  const boxes = sel => [...el.querySelectorAll(sel)].map(n => n.getBoundingClientRect())
    .filter(r => r.width > 0 && r.height > 0);
  const hit = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const parts = {"title": ".g-gtitle text", "subplot title": ".annotation-text-g text", "plot area": "rect.nsewdrag",
                 "x-axis title": ".g-xtitle text, .g-x2title text", "y-axis title": ".g-ytitle text, .g-y2title text"};
  const out = [];
  for (const legend of boxes(".legend rect.bg"))
    for (const [name, sel] of Object.entries(parts))
      if (boxes(sel).some(b => hit(legend, b))) out.push(name);
  return out;
}"""


def legend_collisions(page, chart: str) -> list[str]:
    """The parts of the plotly chart inside ``chart`` (a CSS selector) that its legend covers: its title, a
    subplot title, a plot area or an axis title. Empty when the legend sits clear of them all."""
    return page.eval_on_selector(f"{chart} .js-plotly-plot", _COLLISIONS_JS)
