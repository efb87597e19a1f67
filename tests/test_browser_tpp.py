"""The "Point processes" tab in a real browser (Debian chromium via Python playwright).

Never `playwright install`: the browser is the system one. Skipped only when /usr/bin/chromium is
missing outside CI. Opening the tab needs only the shipped TPP (assets/tpp), not the language models.
The screenshot goes to a temporary folder; `make screenshots` saves it as assets/tpp/screenshot.png.
"""

from __future__ import annotations

import re

import pytest

from browser_support import ARGS, CHROMIUM, free_port, require_chromium, screenshot_path

require_chromium()

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def page():
    from ears_core.studio import LAUNCH_KW, build_app
    demo = build_app()  # the language models load lazily, on a first Generate: not needed here
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **LAUNCH_KW)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            pg = browser.new_page(viewport={"width": 1280, "height": 1000})
            pg.goto(f"http://127.0.0.1:{port}/")
            pg.get_by_role("tab", name="Point processes").click()
            pg.wait_for_selector("#tpp_sample", timeout=30_000)
            yield pg
            browser.close()
    finally:
        demo.close()


def _set_number(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(value)
    box.press("Tab")


def test_sampling_draws_timeline_laws_qq_and_throughput(page, tmp_path):
    _set_number(page, "tpp_n", "150")
    page.locator("#tpp_sample").click()
    page.wait_for_function("document.querySelector('#tpp_summary') && "
                           "document.querySelector('#tpp_summary').innerText.includes('Speedup')", timeout=90_000)
    for plot in ("#tpp_timeline", "#tpp_laws", "#tpp_qq", "#tpp_tput"):
        page.wait_for_selector(f"{plot} .js-plotly-plot .main-svg", timeout=30_000)
    names = page.eval_on_selector("#tpp_timeline .js-plotly-plot", "e => e.data.map(t => t.name)")
    assert {"speculative: accepted", "speculative: resampled", "autoregressive"} <= set(names)
    # every event of both runs is on the timeline: 150 speculative + 150 autoregressive markers
    n_points = page.eval_on_selector("#tpp_timeline .js-plotly-plot", "e => e.data.map(t => t.x.length)")
    assert sum(n_points) == 300
    laws = page.eval_on_selector("#tpp_laws .js-plotly-plot", "e => e.data.map(t => t.name)")
    assert laws == ["proposal q", "target p*", "envelope M·q"]
    title = page.eval_on_selector("#tpp_laws .js-plotly-plot", "e => e.layout.title.text")
    assert re.search(r"M_time = \d+\.\d+", title)
    # the envelope lies above the target everywhere on the drawn grid
    above = page.eval_on_selector("#tpp_laws .js-plotly-plot",
                                  "e => { const p = Array.from(e._fullData[1].y), m = Array.from(e._fullData[2].y);"
                                  " return p.length > 100 && m.every((v, i) => v >= p[i] * (1 - 1e-9)); }")
    assert above
    summary = page.locator("#tpp_summary").inner_text()
    assert "speculative (l=4)" in summary and "autoregressive" in summary and "×" in summary
    assert re.search(r"\b150\b", summary)
    shot = screenshot_path(tmp_path, "tpp/screenshot.png")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000


def test_moving_l_reaches_the_sampler(page):
    rng = page.locator("#tpp_l input[type=range]")
    rng.focus()
    for _ in range(4):  # 4 -> 8 with the keyboard, as a person would
        rng.press("ArrowRight")
    assert page.locator("#tpp_l input[type=number]").input_value() == "8"
    page.locator("#tpp_sample").click()
    page.wait_for_function("document.querySelector('#tpp_summary').innerText.includes('l=8')", timeout=90_000)
    # the renewal model: its law does not move with the history, so nearly every proposal stands (>= 0.85)
    page.locator("#tpp_model").get_by_text("renewal").click()
    page.locator("#tpp_sample").click()
    page.wait_for_function("document.querySelector('#tpp_summary').innerText.includes('l=8') && "
                           "/\\b0\\.(8[5-9]|9\\d)\\d\\b/.test(document.querySelector('#tpp_summary').innerText)",
                           timeout=90_000)
