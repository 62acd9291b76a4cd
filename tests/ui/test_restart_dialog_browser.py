"""JupyterLab's "Restart Kernel?" dialog tells the truth about a notebook's pool (issue 40, point 10), in a
real JupyterLab in Debian's Chromium. JupyterLab's own dialog says "All variables will be lost": for a pool
kept by the server (``%dist start --keep``) that is untrue, its ranks keep theirs. The workbench's
session-dialogs plugin (in place of JupyterLab's, which the extension's package.json disables) says what
becomes of the pool; a notebook that drives no pool still gets JupyterLab's own words.
Screenshot: build/ui/40-10-restart-dialog-kept-pool.png.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import alive, until
from tests.ui.lab import lab_page, needs_chromium, notebook, open_notebook, rest, run_cell, run_lab

SHOTS = Path(__file__).resolve().parents[2] / "build" / "ui"

pytestmark = [pytest.mark.slow, needs_chromium, pytest.mark.timeout(420)]

RESTART = "() => { window.jupyterapp.commands.execute('kernelmenu:restart'); }"  # not awaited


def test_the_restart_dialog_says_the_kept_pool_and_its_variables_stay(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    start = "%load_ext workbench\n%dist start -n 2 --timeout 90 --keep --name team"
    notebooks = {"kept.ipynb": notebook(start), "plain.ipynb": notebook("x = 1")}
    pids: list[int] = []
    with run_lab(tmp_path, notebooks, start_s=240) as lab, sync_playwright() as p:
        try:
            failed = SHOTS / "failure-restart-dialog.png"
            with lab_page(p, tmp_path, lab, failed, width=1400, height=900) as page:
                open_notebook(page, lab, "kept.ipynb")
                cells = page.locator(".jp-Notebook .jp-Cell")
                run_cell(page, cells, 0, timeout=240_000)
                expect(cells.nth(0).locator(".jp-OutputArea")).to_contain_text("kept by the Jupyter server")
                [pool] = rest(lab, "GET", "workbench/pools")["pools"]
                pids = [r["pid"] for r in pool["ranks"]]
                def drives() -> bool:  # the listing names this notebook among those driving the pool
                    return any(n["notebook"].endswith("kept.ipynb")
                               for n in rest(lab, "GET", "workbench/pools")["pools"][0]["notebooks"])

                assert until(drives, timeout=30)  # the dialog reads that

                page.evaluate(RESTART)
                dialog = page.locator(".jp-Dialog")
                expect(dialog).to_contain_text("Restart Kernel?", timeout=30_000)
                expect(dialog).to_contain_text(
                    "The notebook's variables will be lost; pool team (2 ranks) keeps running and its ranks "
                    "keep their variables: `%dist attach team` in the restarted kernel takes it up again.")
                assert "All variables will be lost" not in dialog.inner_text()
                page.screenshot(path=str(SHOTS / "40-10-restart-dialog-kept-pool.png"))
                dialog.locator("button.jp-mod-warn").click()  # Restart
                expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(
                    timeout=90_000)
                # the kernel restarted (the old one no longer drives the pool); the pool runs on, every rank
                assert until(lambda: not drives(), timeout=60)
                [after] = rest(lab, "GET", "workbench/pools")["pools"]
                assert after["state"] == "running" and [r["pid"] for r in after["ranks"]] == pids

                # a notebook that drives no pool: JupyterLab's own dialog, through the same plugin
                open_notebook(page, lab, "plain.ipynb")
                page.evaluate(RESTART)
                expect(dialog).to_contain_text("All variables will be lost.", timeout=30_000)
                dialog.locator("button.jp-mod-reject").click()  # Cancel
                expect(dialog).to_have_count(0)
        finally:
            for found in rest(lab, "GET", "workbench/pools")["pools"]:
                rest(lab, "DELETE", f"workbench/pools/{found['id']}")
    assert until(lambda: not alive(pids), timeout=30), f"left running: {alive(pids)}"
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)
