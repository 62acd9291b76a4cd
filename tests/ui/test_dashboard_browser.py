"""The live dashboard in a real JupyterLab, in Debian's Chromium, through Playwright.

A notebook on the venv's ``python3`` kernel starts a 2-engine pool and trains in ``%%distributed``
cells. The dashboard appears by itself while a run lasts (loss lines drawn in the page, a device row
per rank); when the run ends, is interrupted or fails, it says so and leaves plotly's static figure
with every point, which a saved notebook still shows after a kernel restart and a page reload.
Screenshots under build/ui/: dashboard-live.png, dashboard-finished.png, dashboard-after-reload.png (and
-hovered), dashboard-interrupted.png, dashboard-failed.png; after ``%dist restart`` (issue 24 item 5)
24-5-dashboard-after-restart-live.png and 24-5-dashboard-after-restart.png.
"""

from __future__ import annotations

import json
import re
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.ui.lab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    DONE,
    needs_chromium,
    notebook,
    open_notebook,
    run_cell,
    run_lab,
)

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "ui"
STEPS = 300
PLOTLY = "application/vnd.plotly.v1+json"

pytestmark = [pytest.mark.slow, needs_chromium]

SETUP = """%%distributed
import time
import torch
from torch.utils.data import TensorDataset
from workbench.train import MLP, Callback, MLPConfig, Trainer, make_loader, regression_data

class Slow(Callback):  # a run of 300 steps lasts long enough to watch it live
    def on_step_end(self, trainer, stats):
        time.sleep(0.05)

class Boom(Callback):  # rank 1 fails at its 20th step
    steps = 0
    def on_step_end(self, trainer, stats):
        self.steps += 1
        if rank == 1 and self.steps == 20:
            raise ValueError("bad batch")

def trainer(*callbacks):
    torch.manual_seed(0)
    model = MLP(MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1))
    loader = make_loader(TensorDataset(*regression_data(256, d_in=8, d_out=2)), batch_size=8)
    return Trainer(model, loader, lr=1e-2, callbacks=list(callbacks))"""

TRAIN = f"""%%distributed
result = trainer(Slow()).run(steps={STEPS})
print("trained", len(result.history), "steps")"""
FOREVER = "%%distributed\ntrainer(Slow()).run(steps=10**7)"
FAIL = "%%distributed\ntrainer(Boom()).run(steps=200)"


def _notebook(*cells: str) -> dict:
    return notebook("%load_ext workbench", "%dist start -n 2", SETUP, *cells, "%dist stop")


@pytest.fixture
def browser(tmp_path):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()


def _open(page, lab, name: str, set_up: int = 0):
    """Open a notebook; wait for its kernel; run its first ``set_up`` cells. Returns the notebook's cells."""
    open_notebook(page, lab, name)
    cells = page.locator(".jp-Notebook .jp-Cell")
    for i in range(set_up):
        run_cell(page, cells, i)
    return cells


def _start_training(page, cells, i: int, points: int):
    """Start training cell ``i``; once its live dashboard draws ``points`` points per rank, the cell and
    the dashboard."""
    from playwright.sync_api import expect

    cell = run_cell(page, cells, i, wait=False)
    dash = cell.locator(".workbench-dashboard")
    expect(dash).to_be_visible(timeout=90_000)
    page.wait_for_function(  # the loss lines of both ranks in the page's plotly figure
        "([d, n]) => { const el = d.querySelector('.js-plotly-plot');"
        " return el && el._fullData && el._fullData.slice(0, 2).every(t => t.y.length >= n); }",
        arg=[dash.element_handle(), points], timeout=60_000)
    return cell, dash


def _static_figure(cell, text: str, timeout: float = 60_000):
    """The static plotly figure in ``cell``'s output once its title says ``text``: its points per line."""
    from playwright.sync_api import expect

    plot = cell.locator(".jp-RenderedPlotly.js-plotly-plot")  # JupyterLab's renderer of plotly's JSON
    expect(plot.locator(".gtitle")).to_contain_text(text, timeout=timeout)
    assert cell.locator(".workbench-dashboard").count() == 0  # the live widget is gone
    return plot.evaluate("(el) => el._fullData.map(t => [t.name, t.y ? t.y.length : -1])")


def _saved_outputs(path: Path, i: int, timeout: float = 30) -> list:
    """Cell ``i``'s outputs in the saved file, once the save has written them."""
    deadline = time.monotonic() + timeout
    while True:
        outputs = json.loads(path.read_text())["cells"][i]["outputs"]
        if outputs or time.monotonic() > deadline:
            return outputs
        time.sleep(0.2)


def _reload_to_image(page, lab, name: str, i: int):
    """Reload the page and open ``name`` again: cell ``i`` and the saved PNG of its plotly figure, shown."""
    from playwright.sync_api import expect

    page.reload()
    cell = _open(page, lab, name).nth(i)
    cell.scroll_into_view_if_needed()
    image = cell.locator(".jp-RenderedPlotly img.plot-img")
    expect(image).to_be_visible(timeout=30_000)
    return cell, image


@contextmanager
def _page(browser, lab, name: str, errors: list[str] | None = None):
    """A new page; when the test fails on it, its screenshot (build/ui/<name>-failure.png), the tail of
    the server's log and the page's errors. With ``errors``, the page's errors are collected there."""
    page = browser.new_page()
    if errors is not None:
        page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield page
    except Exception:
        page.screenshot(path=str(SHOTS / f"{name}-failure.png"), full_page=True)
        print(lab["log"].read_text()[-4000:])
        if errors:
            print("page errors:", *errors, sep="\n")
        raise


@pytest.mark.timeout(480)
def test_dashboard_is_live_then_static_and_survives_save_restart_reload(tmp_path, browser):
    from playwright.sync_api import expect

    with run_lab(tmp_path, {"train.ipynb": _notebook(TRAIN)}) as lab:
        with _page(browser, lab, "dashboard") as page:
            cells = _open(page, lab, "train.ipynb", set_up=3)
            # live: appeared by itself (no --monitor, no wb.dashboard()), lines drawn in the page, devices
            cell, dash = _start_training(page, cells, 3, points=20)
            plot = dash.locator(".js-plotly-plot").first
            assert plot.locator(".scatterlayer .trace path.js-line").count() >= 2
            panel = dash.locator(".workbench-device-panel")
            expect(panel.locator("tr[data-rank='1']")).to_be_visible()
            expect(panel).to_contain_text("no GPU detected")
            assert "power" not in panel.inner_text() and "°C" not in panel.inner_text()
            expect(dash.locator(".workbench-dashboard-header")).to_contain_text("training")
            dash.screenshot(path=str(SHOTS / "dashboard-live.png"))

            # the run ended: plotly's static figure with every step of both ranks, no widget left
            expect(cell.locator(".jp-OutputArea")).to_contain_text(f"trained {STEPS} steps", timeout=90_000)
            points = _static_figure(cell, f"finished at step {STEPS}")
            assert points[:2] == [["rank 0", STEPS], ["rank 1", STEPS]], points
            cell.screenshot(path=str(SHOTS / "dashboard-finished.png"))
            run_cell(page, cells, 4)  # %dist stop
            expect(cells.nth(4)).to_contain_text("stopped")

            # save, restart the kernel, reload the page: the figure is still there
            page.evaluate("() => { window.jupyterapp.commands.execute('docmanager:save'); }")
            outputs = _saved_outputs(lab["work"] / "train.ipynb", 3)
            shown = [o for o in outputs if o["output_type"] == "display_data"]
            assert [PLOTLY in o["data"] for o in shown] == [True], outputs
            assert "VBox" not in json.dumps(outputs) and "widget-view" not in json.dumps(outputs)
            page.evaluate("() => { window.jupyterapp.commands.execute('kernelmenu:restart'); }")
            page.locator(".jp-Dialog .jp-mod-accept").click(timeout=15_000)  # "Confirm Kernel Restart"
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(
                timeout=60_000)
            # JupyterLab's plotly renderer saved a PNG of the figure with it (what GitHub shows) and
            # shows that first; hovering makes it the interactive figure again, from the saved JSON
            cell, image = _reload_to_image(page, lab, "train.ipynb", 3)
            assert image.get_attribute("src").startswith("data:image/png;base64,")
            cell.screenshot(path=str(SHOTS / "dashboard-after-reload.png"))
            image.dispatch_event("mouseenter")
            points = _static_figure(cell, f"finished at step {STEPS}")
            assert points[:2] == [["rank 0", STEPS], ["rank 1", STEPS]], points
            assert "model not found" not in page.locator(".jp-Notebook").inner_text()
            cell.screenshot(path=str(SHOTS / "dashboard-after-reload-hovered.png"))


@pytest.mark.timeout(480)
def test_dashboard_after_an_interrupt_and_after_a_failure(tmp_path, browser):
    from playwright.sync_api import expect

    with run_lab(tmp_path, {"faults.ipynb": _notebook(FOREVER, FAIL)}) as lab:
        with _page(browser, lab, "dashboard-faults") as page:
            cells = _open(page, lab, "faults.ipynb", set_up=3)

            # Ctrl-C (the kernel's interrupt) while it trains: "interrupted at step N", every point kept
            cell, _ = _start_training(page, cells, 3, points=30)
            page.evaluate("() => { window.jupyterapp.commands.execute('kernelmenu:interrupt'); }")
            expect(cell.locator(".jp-InputPrompt")).to_have_text(DONE, timeout=60_000)
            points = _static_figure(cell, "interrupted at step")
            title = cell.locator(".jp-RenderedPlotly .gtitle").text_content()
            last = int(re.search(r"interrupted at step (\d+)", title).group(1))  # the title's lines run on
            assert points[0][1] >= 30 and max(points[0][1], points[1][1]) == last, (points, title)
            cell.screenshot(path=str(SHOTS / "dashboard-interrupted.png"))

            # rank 1 raises at its 20th step: "failed: rank 1: ValueError: bad batch", its points kept (20:
            # the step had ended; the publisher, called before the user's callbacks, recorded it)
            cell = run_cell(page, cells, 4)
            points = _static_figure(cell, "failed: rank 1: ValueError: bad batch")
            assert points[1] == ["rank 1", 20] and points[0][1] >= 19, points
            expect(cell.locator(".jp-OutputArea")).to_contain_text("ValueError")  # the cell's own error
            cell.screenshot(path=str(SHOTS / "dashboard-failed.png"))
            run_cell(page, cells, 5)
            expect(cells.nth(5)).to_contain_text("stopped")


@pytest.mark.timeout(480)
def test_after_dist_restart_the_next_runs_dashboard_shows_every_rank(tmp_path, browser):
    """Issue 24 item 5: after ``%dist restart`` the next run's dashboard listed only "rank 0" though both
    ranks trained. The same notebook a person drives: a run, ``%dist restart``, the set-up again, a run."""
    from playwright.sync_api import expect

    with run_lab(tmp_path, {"again.ipynb": _notebook(TRAIN, "%dist restart", SETUP, TRAIN)}) as lab:
        with _page(browser, lab, "dashboard-restart") as page:
            cells = _open(page, lab, "again.ipynb", set_up=4)  # the first run went to its end
            _static_figure(cells.nth(3), f"finished at step {STEPS}")
            restarted = run_cell(page, cells, 4)
            expect(restarted.locator(".jp-OutputArea")).to_contain_text("the process group is re-formed")
            run_cell(page, cells, 5)
            # live: both ranks' lines drawn and a device row each
            cell, dash = _start_training(page, cells, 6, points=20)
            rows = dash.locator(".workbench-device-panel tr[data-rank]")
            expect(rows).to_have_count(2)
            assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.rank)")) == ["0", "1"]
            dash.screenshot(path=str(SHOTS / "24-5-dashboard-after-restart-live.png"))
            # ended: the static figure has every step of both ranks
            expect(cell.locator(".jp-OutputArea")).to_contain_text(f"trained {STEPS} steps", timeout=90_000)
            points = _static_figure(cell, f"finished at step {STEPS}")
            assert points[:2] == [["rank 0", STEPS], ["rank 1", STEPS]], points
            # two lines a person can see: each rank's own loss (the world's mean on both drew one line)
            apart = cell.locator(".jp-RenderedPlotly.js-plotly-plot").evaluate(
                "el => el._fullData[0].y.some((v, i) => v !== el._fullData[1].y[i])")
            assert apart, "rank 0's and rank 1's loss lines are one line"
            cell.screenshot(path=str(SHOTS / "24-5-dashboard-after-restart.png"))
            run_cell(page, cells, 7)
            expect(cells.nth(7)).to_contain_text("stopped")
