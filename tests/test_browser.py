"""The app in a real browser: Debian's chromium driven by Python playwright, on the embedded pair.

Never `playwright install`: the browser is the system one (`apt-get install -y chromium`).
Skipped only when /usr/bin/chromium is missing. The screenshot goes to a temporary folder; `make
screenshots` saves it as assets/screenshot.png for the README (browser_support.screenshot_path).
"""

from __future__ import annotations

import re

import pytest

from browser_support import ARGS, CHROMIUM, launch, legend_collisions, require_chromium, screenshot_path, served

COPY_PROMPT = "Copy this list exactly, twice: apples, pears, plums, figs, dates, limes."

require_chromium()

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def url():
    from ears_core.studio import build_app
    with served(build_app()) as url:  # the embedded pair, as `python app.py` serves it: it starts loading now
        yield url


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(url, browser):
    pg = browser.new_page(viewport={"width": 1280, "height": 900})
    pg.goto(url)
    pg.wait_for_selector("#generate", timeout=30_000)
    # the page says when the pair it started loading at the build is ready (about a second from the cache)
    pg.wait_for_function("document.querySelector('#pair_status').innerText.includes('Ready')", timeout=120_000)
    yield pg
    pg.close()


def _set_number(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(value)
    box.press("Tab")


def _tokens(page) -> int:
    return page.locator("#tokens span.tok").count()


def test_generate_streams_coloured_tokens_and_charts(page, tmp_path):
    rng = page.locator("#beta input[type=range]")
    rng.focus()
    for _ in range(20):  # 0.10 -> 0.30 in steps of 0.01, as a person would with the keyboard
        rng.press("ArrowRight")
    assert float(page.locator("#beta input[type=number]").input_value()) == pytest.approx(0.3)
    # a prompt the n-gram drafter can copy from, so the screenshot shows accepted drafts
    page.locator("#prompt textarea").fill(COPY_PROMPT)
    _set_number(page, "max_new", "16")
    page.locator("#generate").click()
    page.wait_for_function("document.querySelectorAll('#tokens span.tok').length >= 1", timeout=60_000)
    page.wait_for_function("document.querySelector('#summary') && "  # the last yield names the model
                           "document.querySelector('#summary').innerText.includes('model:')", timeout=90_000)
    n = _tokens(page)  # 16, or fewer when the answer ends (end-of-sequence) first
    assert 1 <= n <= 16
    kinds = page.eval_on_selector_all("#tokens span.tok", "els => els.map(e => e.dataset.kind)")
    assert set(kinds) <= {"accepted", "pardoned", "resampled", "bonus", "target"}
    bg = page.eval_on_selector("#tokens span.tok", "e => getComputedStyle(e).backgroundColor")
    assert bg not in ("", "rgba(0, 0, 0, 0)")  # coloured
    title = page.locator("#tokens span.tok").first.get_attribute("title")
    assert "max P" in title and "step 0" in title
    for plot in ("#conf_plot", "#ratio_plot", "#tput_plot", "#hist_plot"):
        page.wait_for_selector(f"{plot} .js-plotly-plot .main-svg", timeout=30_000)
    traces = page.eval_on_selector("#conf_plot .js-plotly-plot", "e => e.data.map(t => t.name)")
    assert "max P_target" in traces
    for width in (1400, 1280):  # the issue's width, then the tests' own (the screenshot's)
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(800)  # plotly redraws a chart when its window resizes
        for plot in ("#conf_plot", "#ratio_plot", "#tput_plot", "#hist_plot"):
            assert legend_collisions(page, plot) == [], f"{plot} at {width} px: the legend covers a part of the chart"
    summary = page.locator("#summary").inner_text()
    assert "a tree of depth" not in summary  # EARS at T = 0.9 on "auto": a chain run
    assert not page.locator("#tree_panel").is_visible()  # a chain run: no empty tree panel in the picture
    assert re.search(rf"\b{n} / \d+", summary)  # the table counts the tokens shown
    assert "ears(beta=0.3)" in summary and "×" in summary  # the moved slider reached the run; speedup shown
    page.locator("#tokens").scroll_into_view_if_needed()
    shot = screenshot_path(tmp_path, "screenshot.png")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000


def test_stop_stops(page):
    _set_number(page, "max_new", "300")
    page.locator("#generate").click()
    page.wait_for_function("document.querySelectorAll('#tokens span.tok').length >= 3 && "
                           "!document.querySelector('#summary').innerText.includes('model:')",
                           timeout=60_000)
    page.locator("#stop").click()
    page.wait_for_timeout(1500)  # a round already in flight may still land
    n = _tokens(page)
    page.wait_for_timeout(2500)
    assert _tokens(page) == n < 300
    from ears_core.serve.session import ACTIVITY
    assert ACTIVITY.active == 0  # the decode thread ended with its request (the server runs in this process)


def test_the_page_says_loading_until_the_pair_is_ready_and_shows_the_tree_panel_for_tree_runs_only(browser):
    """A server whose (tiny) pair is still loading: the status line says so, a Generate waits for it
    and says so too, then the status turns Ready and the run's tokens come. The tree panel stays
    hidden for a chain run and shows a tree run's tree."""
    import threading

    from test_app import tiny_backend

    from ears_core.serve.settings import Settings
    from ears_core.studio import build_app

    gate = threading.Event()

    def gated_loader():
        assert gate.wait(120)
        return tiny_backend()

    demo = build_app(pair_loader=gated_loader, settings=Settings())
    pg = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        pg.goto(launch(demo))
        pg.wait_for_selector("#generate", timeout=30_000)
        assert "Loading" in pg.locator("#pair_status").inner_text()
        pg.locator("#prompt textarea").fill("the water is long and the")
        _set_number(pg, "max_new", "8")
        pg.locator("#generate").click()
        pg.wait_for_function("document.querySelector('#summary').innerText.includes('loading the model pair')",
                             timeout=30_000)
        assert _tokens(pg) == 0 and "Loading" in pg.locator("#pair_status").inner_text()
        gate.set()
        pg.wait_for_function("document.querySelector('#pair_status').innerText.includes('Ready')", timeout=60_000)
        pg.wait_for_function("document.querySelector('#summary').innerText.includes('model:')", timeout=60_000)
        assert _tokens(pg) == 8 and "tiny random pair" in pg.locator("#pair_status").inner_text()
        assert not pg.locator("#tree_panel").is_visible()  # EARS at T = 0.9 on "auto": a chain

        pg.locator("#draft_shape label", has_text=re.compile(r"^\s*tree\s*$")).click()
        pg.locator("#generate").click()
        pg.wait_for_function("document.querySelector('#summary').innerText.includes('a tree of depth')",
                             timeout=60_000)
        assert pg.locator("#tree_panel").is_visible()
        pg.wait_for_selector("#tree_plot .js-plotly-plot .main-svg", timeout=30_000)
    finally:
        gate.set()
        pg.close()
        demo.close()
