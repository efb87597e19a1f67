"""The Quality tab in a real browser (Debian chromium via Python playwright) on the embedded pair: the
frontier figure shows, a tiny live sweep runs with its progress bar and its results reach the figure.

Never `playwright install`: the browser is the system one. Skipped only when /usr/bin/chromium is missing
outside CI. The shipped results are a small file written here (the tab reads docs/results/bench_*quality*.json
when it exists; test_quality_app.py covers its absence).
"""

from __future__ import annotations

import json

import pytest

from browser_support import ARGS, CHROMIUM, require_chromium, screenshot_path, served
from test_quality import rows_for_figure

require_chromium()

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    from ears_core.studio import build_app, quality

    shipped = tmp_path_factory.mktemp("quality") / "bench_quality.json"
    shipped.write_text(json.dumps(dict(
        section="quality", target="embedded", draft="embedded", seeds=2, rows=rows_for_figure(),
        questions=dict(count=40, kept=["capitals"], left_out=["colours", "legs_total", "sequences"]),
        decoding=dict(temperature=0.9, k=4, max_new_tokens=16, draft_length="policy"),
        first_beta_outside_ordinary=0.5, paper=dict(speedup=1.18, accuracy_delta=-0.0084, label="paper"))))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quality, "SHIPPED", shipped)
        demo = build_app()  # the embedded pair, as `python app.py` serves it: it starts loading now
    with served(demo) as url:
        yield url


def test_the_quality_tab_shows_the_frontier_and_runs_a_live_sweep(app_url, tmp_path):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.goto(app_url)
        page.get_by_role("tab", name="Quality").click()
        page.wait_for_selector("#quality_plot .js-plotly-plot .main-svg", timeout=30_000)
        traces = page.eval_on_selector("#quality_plot .js-plotly-plot", "e => e.data.map(t => t.name)")
        assert "EARS (beta)" in traces and "EARS paper (relative to ordinary)" in traces
        assert "40 questions x 2 seeds" in page.locator("#quality_shipped").inner_text()
        box = page.locator("#quality_questions input[type=number]").first
        box.fill("2")
        box.press("Tab")
        page.locator("#quality_run").click()
        page.wait_for_function("document.querySelector('#quality_progress').innerText.includes('done in')",
                               timeout=180_000)  # 2 questions x (target-only, ordinary, EARS 0.3): 6 short runs
        assert "6 / 6 runs" in page.locator("#quality_progress").inner_text()
        live = page.locator("#quality_live").inner_text()
        for label in ("target-only", "ordinary", "ears beta=0.3"):
            assert label in live
        traces = page.eval_on_selector("#quality_plot .js-plotly-plot", "e => e.data.map(t => t.name)")
        assert {"target-only (live)", "ordinary (live)", "EARS (beta) (live)"} <= set(traces)
        page.locator("#quality_plot").screenshot(path=str(screenshot_path(tmp_path, "quality.png")))
        browser.close()
