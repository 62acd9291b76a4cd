"""The live dashboard in a real JupyterLab, in Debian's Chromium, through Playwright.

A notebook on the venv's ``python3`` kernel starts a 2-engine pool, trains a Trainer in a
``%%distributed`` cell; the dashboard appears by itself, its loss plot holds every step of both
ranks in the browser and its device panel shows both ranks with readings. Screenshot:
build/ui/dashboard.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, needs_chromium, run_lab

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "ui"
STEPS = 300

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
]

TRAIN = f"""%%distributed
import torch
from torch.utils.data import TensorDataset
from workbench.train import MLP, MLPConfig, Trainer, make_loader, regression_data
torch.manual_seed(0)
model = MLP(MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1))
loader = make_loader(TensorDataset(*regression_data(256, d_in=8, d_out=2)), batch_size=8)
result = Trainer(model, loader, lr=1e-2).run(steps={STEPS})
print("trained", len(result.history), "steps")"""

NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": src}
        for src in ("%load_ext workbench", "%dist start -n 2", TRAIN, "%dist stop")
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server; the venv's python3 kernel (which has workbench)."""
    with run_lab(tmp_path, {"train.ipynb": NOTEBOOK}) as server:
        yield server


@pytest.mark.timeout(240)
def test_dashboard_appears_and_renders_loss_and_devices(lab, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1400, "height": 1000})
        page = browser.new_page()
        try:
            page.goto(f"{lab['base']}/lab/tree/train.ipynb?token={lab['token']}")
            select = page.locator(".jp-Dialog").get_by_role("button", name="Select")
            try:  # JupyterLab may ask which kernel to start even though the notebook names one
                select.click(timeout=15_000)
            except PlaywrightTimeout:
                pass
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(
                timeout=90_000)
            cells = page.locator(".jp-Notebook .jp-Cell")
            cells.nth(3).locator(".jp-InputPrompt").click()  # run every cell above `%dist stop`
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-above'); }")
            cell = cells.nth(2)
            dash = cell.locator(".workbench-dashboard")
            expect(dash).to_be_visible(timeout=90_000)  # appeared by itself: no --monitor, no wb.dashboard()
            expect(cell.locator(".jp-OutputArea")).to_contain_text(f"trained {STEPS} steps", timeout=60_000)
            expect(dash.locator(".workbench-dashboard-header")).to_contain_text("finished", timeout=30_000)

            # the loss plot in the browser holds every step of both ranks, drawn as lines
            plot = dash.locator(".js-plotly-plot").first  # the loss and throughput figure
            expect(plot).to_be_visible()
            points = ("(d) => { const el = d.querySelector('.js-plotly-plot');"
                      " return ((el && el._fullData) || []).map(t => t.y ? t.y.length : -1); }")
            try:  # both ranks' loss traces hold every step
                page.wait_for_function(f"([d, n]) => ({points})(d).slice(0, 2).join() === [n, n].join()",
                                       arg=[dash.element_handle(), STEPS], timeout=60_000)
            finally:
                print("points per trace in the browser:", dash.evaluate(points))
            assert plot.locator(".scatterlayer .trace path.js-line").count() >= 2
            names = plot.evaluate("(el) => el._fullData.map(t => t.name)")
            assert names[:2] == ["rank 0", "rank 1"]

            # the device panel: one row per rank, with readings (CPU here: no GPU detected)
            panel = dash.locator(".workbench-device-panel")
            expect(panel.locator("tr[data-rank='0']")).to_be_visible()
            expect(panel.locator("tr[data-rank='1']")).to_be_visible()
            expect(panel).to_contain_text("no GPU detected")
            for rank in (0, 1):
                row = panel.locator(f"tr[data-rank='{rank}']").inner_text()
                assert "%" in row and "MiB" in row and "–\t–\t–\t–" not in row, row
            dash.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)
            dash.screenshot(path=str(SHOTS / "dashboard-widget.png"))

            cells.nth(3).locator(".jp-InputPrompt").click()
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-cell'); }")
            expect(cells.nth(3)).to_contain_text("stopped", timeout=60_000)
        except Exception:
            page.screenshot(path=str(SHOTS / "dashboard-failure.png"), full_page=True)
            print(lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()
