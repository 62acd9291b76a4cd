"""The docked dashboard's last picture is the pool's last run, whenever the pool stops, and it survives a
page reload (issue 40, point 1; and point 9's console 404 on each stop). Real JupyterLab, Debian's Chromium.

A pool started from the sidebar's Start button; a notebook attaches and trains while the pool's dashboard is
docked; then Stop on the card. Before: the server closed the dashboard's source as the stop began, the page's
next question (the pool's state file still there while its processes stopped) made a new, empty source, and
the last picture was "no training run yet · 2 idle" (3 of 3 here, 10 s or 75 s after the run); the stop
then showed as a 404 in the console, and a reloaded page had nothing to draw.
Screenshots: build/ui/40-1-last-picture-stopped.png, 40-1-last-picture-reloaded.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import alive, until
from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, Notebook, needs_chromium, open_notebook, rest, run_lab
from tests.ui.test_dashboard_docked_browser import IDLE_NOTEBOOK

SHOTS = Path(__file__).resolve().parents[2] / "build" / "ui"
FINISHED = "run 1 finished at step 60"

pytestmark = [pytest.mark.slow, needs_chromium]

TRAIN = """%%distributed
import torch
from torch.utils.data import TensorDataset
from workbench.train import MLP, MLPConfig, Trainer, make_loader, regression_data
torch.manual_seed(0)
loader = make_loader(TensorDataset(*regression_data(256, d_in=8, d_out=2)), batch_size=8)
trainer = Trainer(MLP(MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1)), loader, lr=1e-2)
result = trainer.run(steps=60)
"""


@pytest.mark.timeout(480)
def test_the_last_picture_is_the_last_run_after_a_stop_from_the_card_and_a_reload(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    pids: list[int] = []
    with run_lab(tmp_path, {"idle.ipynb": IDLE_NOTEBOOK}) as lab, sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1600, "height": 1000})
        errors: list[str] = []
        nb = None
        try:
            page = browser.new_page()
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            open_notebook(page, lab, "idle.ipynb")
            page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
            panel = page.locator("#workbench-pools")
            panel.get_by_role("button", name="Start pool").click()
            card = panel.locator(".wb-Card").first
            expect(card).to_have_attribute("data-state", "running", timeout=150_000)
            name = card.locator(".wb-Card-title").inner_text()
            [pool] = rest(lab, "GET", "workbench/pools")["pools"]
            pids = [r["pid"] for r in pool["ranks"]]

            card.get_by_role("button", name="Open dashboard").click()
            docked = page.locator(".wb-DashboardPanel")
            header = docked.locator(".workbench-dashboard-header")
            expect(header).to_contain_text("no training run yet", timeout=60_000)

            nb = Notebook(lab, tmp_path, "train.ipynb")  # another notebook attaches and trains
            out = nb.run(f"%load_ext workbench\n%dist attach {name}")
            assert f"attached to pool {name}" in out, out
            out = nb.run(TRAIN)
            assert "Traceback" not in out, out
            expect(header).to_contain_text(FINISHED, timeout=60_000)
            expect(docked.locator(".main-svg").first).to_be_visible()

            card.get_by_role("button", name="Stop").click()
            page.locator(".jp-Dialog").get_by_role("button", name="Stop pool").click()
            status = docked.locator(".wb-DashboardPanel-status")
            expect(status).to_have_text(f"Pool {name} stopped: this is its last picture.", timeout=60_000)
            expect(header).to_contain_text(FINISHED)
            expect(docked.locator(".main-svg").first).to_be_visible()
            assert docked.locator(".main-svg .scatterlayer .trace").count() >= 1
            page.screenshot(path=str(SHOTS / "40-1-last-picture-stopped.png"))
            assert until(lambda: not alive(pids), 30), alive(pids)
            assert not any("404" in e for e in errors), errors  # the stop is no failed request

            # a reload: the restored panel draws the last picture again, and says the pool stopped
            page.reload()
            expect(status).to_have_text(f"Pool {name} stopped: this is its last picture.", timeout=90_000)
            expect(header).to_contain_text(FINISHED)
            expect(docked.locator(".main-svg").first).to_be_visible(timeout=30_000)
            page.screenshot(path=str(SHOTS / "40-1-last-picture-reloaded.png"))
            assert not any("404" in e for e in errors), errors
        except Exception:
            page.screenshot(path=str(SHOTS / "40-1-last-picture-failure.png"))
            print("errors in the page:", *errors, sep="\n")
            raise
        finally:
            if nb is not None:
                nb.close()
            browser.close()
    assert not alive(pids)
