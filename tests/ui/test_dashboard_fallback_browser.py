"""The in-cell dashboard in a page that cannot draw widgets (issue 37 part 6), in Debian's Chromium.

JupyterLab with ipywidgets' manager, anywidget and the workbench's own Lab extension disabled (what Notebook 7
or a site's server without them gives): the widget's model is never made in the page, so nothing tells the
kernel it can be drawn; after ``WORKBENCH_DASHBOARD_WAIT`` seconds the dashboard goes on as plain HTML in the
cell (header, the lines as SVG, the device table), redrawn while the run lasts, and ends on the static
figure. No sidebar here: the magics did everything. Screenshot: build/ui/dashboard-html-fallback.png.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, DONE, needs_chromium, open_notebook, run_cell, run_lab
from tests.ui.test_dashboard_browser import TRAIN, _notebook

SHOTS = Path(__file__).resolve().parents[2] / "build" / "ui"
pytestmark = [pytest.mark.slow, needs_chromium]
WITHOUT = ("@jupyter-widgets/jupyterlab-manager", "anywidget", "distributed-workbench")


@pytest.mark.timeout(420)
def test_a_page_without_the_widget_extensions_sees_the_html_dashboard(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    labconfig = tmp_path / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    disabled = {"disabledExtensions": {name: True for name in WITHOUT}}
    (labconfig / "page_config.json").write_text(json.dumps(disabled))
    wait = {"WORKBENCH_DASHBOARD_WAIT": "2"}
    with run_lab(tmp_path, {"train.ipynb": _notebook(TRAIN)}, extra_env=wait) as lab:
        with sync_playwright() as p:
            browser = p.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                headless=True, viewport={"width": 1400, "height": 1000})
            page = browser.new_page()
            try:
                open_notebook(page, lab, "train.ipynb")
                assert page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').count() == 0  # no sidebar
                cells = page.locator(".jp-Notebook .jp-Cell")
                for i in range(3):
                    run_cell(page, cells, i)
                cell = run_cell(page, cells, 3, wait=False)
                dash = cell.locator(".workbench-dashboard-html")
                expect(dash.locator("svg polyline").first).to_be_visible(timeout=90_000)
                title = dash.locator(".workbench-dash-title")
                expect(title).to_contain_text(re.compile(r"training · step \d+"))
                expect(dash.locator("[data-rank='1']").first).to_be_visible()  # the device table
                expect(title).not_to_have_text(title.inner_text(), timeout=30_000)  # redrawn as it trains
                assert cell.locator(".workbench-dashboard").count() == 0  # no widget view in the page
                cell.screenshot(path=str(SHOTS / "dashboard-html-fallback.png"))
                expect(cell.locator(".jp-InputPrompt")).to_have_text(DONE, timeout=180_000)
                expect(cell.locator(".jp-OutputArea")).to_contain_text("finished at step 300", timeout=60_000)
                run_cell(page, cells, 4)  # %dist stop
                expect(cells.nth(4)).to_contain_text("stopped")
            except Exception:
                page.screenshot(path=str(SHOTS / "dashboard-html-fallback-failure.png"), full_page=True)
                print(lab["log"].read_text()[-3000:])
                raise
            finally:
                browser.close()
