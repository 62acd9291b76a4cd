"""Reattaching, as a person meets it in a real JupyterLab in Debian's Chromium (issue 40, points 8 and 10).

A notebook on the plain Python kernel starts a pool with ``--keep``; then, in the page:
- the start says how to take the pool back once, in short lines (it said it twice, and a long line wrapped
  leaving a lone "`)");
- after the restart ``%dist status`` offers ``%dist attach`` first (it offered ``%dist start`` first);
- "Use in notebook" gives a kernel that loaded the magics the attach line only (it gave every
  non-workbench kernel ``%load_ext`` again: "already loaded");
- the attached notebook names the Jupyter server as the keeper (it said "the JupyterLab panel (started
  it)");
- the pool stopped from its card, ``%dist attach`` to another goes ahead, saying once that the old one was
  stopped (it was refused: "this notebook already drives pool ...").
Screenshots: build/ui/40-10-keep-output.png, 40-8-status-after-restart.png,
40-8-use-in-notebook.png, 40-8-attach-after-panel-stop.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import alive, until
from tests.ui.lab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    needs_chromium,
    notebook,
    open_notebook,
    rest,
    run_cell,
    run_lab,
)

SHOTS = Path(__file__).resolve().parents[2] / "build" / "ui"
NAME = "team-kept"

pytestmark = [pytest.mark.slow, needs_chromium]


NOTEBOOK = notebook(f"%load_ext workbench\n%dist start -n 2 --timeout 90 --keep --name {NAME}",
                    "%load_ext workbench\n%dist status")


@pytest.mark.timeout(600)
def test_keep_restart_and_attach_again_say_what_is_true(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    pids: list[int] = []
    with run_lab(tmp_path, {"keep.ipynb": NOTEBOOK}, start_s=240) as lab, sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1400, "height": 900})
        page = browser.new_page()
        cells = page.locator(".jp-Notebook .jp-Cell")

        def run(index: int) -> None:
            run_cell(page, cells, index, timeout=180_000)

        def output(index: int) -> str:
            return cells.nth(index).locator(".jp-OutputArea").inner_text()

        try:
            open_notebook(page, lab, "keep.ipynb")
            run(0)
            started = output(0)
            assert "kept by the Jupyter server: it outlives this kernel." in started, started
            assert started.count(f"`%dist attach {NAME}`") == 1, started  # the hint once
            assert not [line for line in started.splitlines() if line.strip() in ("`)", ")")], started
            assert max(len(line) for line in started.splitlines()) <= 80, started  # short: nothing wraps
            cells.nth(0).scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "40-10-keep-output.png"))
            [pool] = rest(lab, "GET", "workbench/pools")["pools"]
            pids = [r["pid"] for r in pool["ranks"]]

            # the kernel restarts (JupyterLab's dialog, confirmed); the kept pool's ranks run on
            page.evaluate("() => { void window.jupyterapp.commands.execute('notebook:restart-kernel'); }")
            dialog = page.locator(".jp-Dialog")
            dialog.get_by_role("button", name="Confirm Kernel Restart").click()
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(
                timeout=90_000)
            assert set(alive(pids)) == set(pids)  # the ranks ran on

            # after the restart: the kept pool's attach comes first
            run(1)
            status = output(1)
            assert status.startswith(f"this notebook drives no pool: `%dist attach {NAME}` (2 ranks, kept by "
                                     "the Jupyter server)"), status
            assert status.index("%dist attach") < status.index("%dist start"), status
            page.screenshot(path=str(SHOTS / "40-8-status-after-restart.png"))

            # "Use in notebook": this kernel loaded the magics (cell 2): the attach line only
            page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
            card = page.locator(f'#workbench-pools .wb-Card[data-pool-id="{pool["id"]}"]')
            expect(card).to_have_attribute("data-state", "running", timeout=60_000)
            cells.nth(1).locator(".jp-InputPrompt").click()
            card.get_by_role("button", name="Use in notebook").click()
            expect(cells).to_have_count(3, timeout=30_000)
            expect(cells.nth(2).locator(".jp-InputArea-editor")).to_have_text(f"%dist attach {NAME}")
            page.screenshot(path=str(SHOTS / "40-8-use-in-notebook.png"))
            run(2)
            attached = output(2)
            assert f"attached to pool {NAME}" in attached, attached
            assert "notebooks: the Jupyter server (keeps it), keep.ipynb" in attached, attached
            assert "JupyterLab panel (started it)" not in attached, attached

            # another pool from the panel; the kept one stopped from its card; attach to the new one
            page.locator("#workbench-pools").get_by_role("button", name="Start pool").click()
            other = page.locator("#workbench-pools .wb-Card").nth(1)
            expect(other).to_have_attribute("data-state", "running", timeout=150_000)
            other_name = other.locator(".wb-Card-title").inner_text()
            card.get_by_role("button", name="Stop").click()
            page.locator(".jp-Dialog").get_by_role("button", name="Stop pool").click()
            expect(card).to_have_count(0, timeout=60_000)
            assert until(lambda: not alive(pids), 30), alive(pids)
            page.evaluate("window.jupyterapp.commands.execute('notebook:insert-cell-below')")
            cells.nth(3).locator(".jp-InputArea-editor").click()
            page.keyboard.type(f"%dist attach {other_name}")
            run(3)
            again = output(3)
            assert f"workbench: pool {NAME} was stopped (by the JupyterLab panel at" in again, again
            assert f"attached to pool {other_name}" in again, again
            assert "already drives" not in again, again
            page.screenshot(path=str(SHOTS / "40-8-attach-after-panel-stop.png"))
        except Exception:
            page.screenshot(path=str(SHOTS / "40-8-reattach-failure.png"))
            raise
        finally:
            browser.close()
    assert not alive(pids)
