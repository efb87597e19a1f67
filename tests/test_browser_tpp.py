"""The "Point processes" tab in a real browser (Debian chromium via Python playwright), and its API.

Never `playwright install`: the browser is the system one. Skipped only when /usr/bin/chromium is missing
outside CI. Opening the tab needs only the shipped transformer pairs (assets/tpp/<process>), not the language
models. The screenshot goes to a temporary folder; `make screenshots` saves it as assets/tpp/screenshot.png.
The ratio to autoregressive sampling is read through the API with gradio_client (``/tpp_sample``, every
parameter named), as a user's script would.
"""

from __future__ import annotations

import re

import pytest

from browser_support import ARGS, CHROMIUM, legend_collisions, require_chromium, screenshot_path, served

require_chromium()

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def app_url():
    from ears_core.studio import build_app
    with served(build_app(preload=False)) as url:  # the language models are not needed here: never loaded
        yield url


@pytest.fixture(scope="module")
def page(app_url):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page(viewport={"width": 1280, "height": 1200})
        pg.goto(app_url)
        pg.get_by_role("tab", name="Point processes").click()
        pg.wait_for_selector("#tpp_sample", timeout=30_000)
        yield pg
        browser.close()


def _set_number(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(value)
    box.press("Tab")


def _wait_done(page, text: str) -> str:
    page.wait_for_function(
        "t => { const e = document.querySelector('#tpp_summary'); return e && e.innerText.includes(t) && "
        "e.innerText.includes('×') && !e.innerText.includes('running'); }", arg=text, timeout=180_000)
    return page.locator("#tpp_summary").inner_text()


def test_draft_model_run_streams_a_coloured_timeline_acceptance_and_qq(page, tmp_path):
    _set_number(page, "tpp_n", "300")
    page.locator("#tpp_sample").click()
    summary = _wait_done(page, "TPP-SD draft model")
    assert re.search(r"\b300 events\b", summary) and re.search(r"\d+(\.\d+)?×", summary)
    for plot in ("#tpp_timeline", "#tpp_accept", "#tpp_qq"):
        page.wait_for_selector(f"{plot} .js-plotly-plot .main-svg", timeout=30_000)
    names = page.eval_on_selector("#tpp_timeline .js-plotly-plot", "e => e.data.map(t => t.name)")
    assert names == ["accepted", "resampled", "bonus", "target"]
    counts = page.eval_on_selector("#tpp_timeline .js-plotly-plot", "e => e.data.map(t => t.x.length)")
    assert sum(counts) == 300 and counts[0] > 0 and counts[1] + counts[2] > 0  # drafted, replaced or bonus
    qq = page.eval_on_selector("#tpp_qq .js-plotly-plot", "e => e.data.map(t => t.name)")
    assert qq == ["autoregressive", "TPP-SD draft model", "Exp(1)"]
    for plot in ("#tpp_timeline", "#tpp_accept", "#tpp_qq"):
        assert legend_collisions(page, plot) == [], f"{plot}: the legend covers a part of the chart"
    shot = screenshot_path(tmp_path, "tpp/screenshot.png")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000


def test_choosing_process_sampler_and_a_fixed_length_reaches_the_sampler(page):
    page.locator("#tpp_process").get_by_text("multivariate Hawkes").click()
    page.locator("#tpp_method").get_by_text("seed 001 self-proposal").click()
    page.locator("#tpp_length_mode").get_by_text("fixed").click()
    rng = page.locator("#tpp_length input[type=range]")
    rng.focus()
    for _ in range(2):  # 4 -> 6 with the keyboard, as a person would
        rng.press("ArrowRight")
    assert page.locator("#tpp_length input[type=number]").input_value() == "6"
    _set_number(page, "tpp_n", "150")
    page.locator("#tpp_sample").click()
    summary = _wait_done(page, "seed 001 self-proposal")
    assert "multivariate Hawkes" in summary and re.search(r"\b150 events\b", summary)
    lengths = page.eval_on_selector("#tpp_accept .js-plotly-plot", "e => Array.from(e.data[1].y)")
    assert lengths and set(lengths) == {6}
    marks = page.eval_on_selector("#tpp_timeline .js-plotly-plot", "e => e.data.flatMap(t => Array.from(t.y))")
    assert set(marks) <= {0, 1, 2} and len(set(marks)) >= 2


def test_the_ratio_is_readable_through_the_api(app_url):
    from gradio_client import Client
    client = Client(app_url, verbose=False)
    out = client.predict(process="hawkes", sampler="draft", length_mode="fixed", length=6, n_events=100, seed=0,
                         api_name="/tpp_sample")
    stats = out[1]
    assert stats["done"] and stats["events"] == 100 and stats["sampler"] == "draft"
    assert stats["ratio"] > 0 and stats["events_per_s"] > 0 and 0 < stats["acceptance"] <= 1
    assert stats["lengths_used"] == {"6": stats["rounds"]}
