"""A pool a notebook kept (``%dist start --keep``) is marked "kept" on its card in the sidebar, in a real
JupyterLab in Debian's Chromium; its kernel restarts and the card is still there. Screenshot in build/ui/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import alive, until
from tests.server.test_keep import pool_processes
from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, Notebook, needs_chromium, rest, run_lab

SHOTS = Path(__file__).resolve().parents[2] / "build" / "ui"

pytestmark = [pytest.mark.slow, needs_chromium]


@pytest.mark.timeout(600)
def test_a_kept_pools_card_says_kept_and_stays_over_a_kernel_restart(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    pids = []
    with run_lab(tmp_path, {}, start_s=240) as lab:
        nb = Notebook(lab, tmp_path, "train.ipynb")
        try:
            out = nb.run("%load_ext workbench\n%dist start -n 2 --timeout 90 --keep --name team-kept")
            assert "kept by the Jupyter server" in out, out
            pids = pool_processes(nb)
            nb.restart()
            with sync_playwright() as p:
                browser = p.chromium.launch_persistent_context(
                    str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                    headless=True, viewport={"width": 1400, "height": 850})
                try:
                    page = browser.new_page()
                    page.goto(f"{lab['base']}/lab?token={lab['token']}")
                    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
                    page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
                    card = page.locator("#workbench-pools .wb-Card").first
                    expect(card).to_have_attribute("data-state", "running", timeout=60_000)
                    expect(card.locator(".wb-Card-title")).to_have_text("team-kept")
                    where = card.locator(".wb-Card-meta").nth(1)
                    expect(where).to_contain_text("kept by the server")
                    expect(where.locator(".wb-Card-kept")).to_have_text("kept by the server")
                    assert "`%dist attach team-kept` takes it back" in where.get_attribute("title")
                    page.screenshot(path=str(SHOTS / "kept-card.png"))
                finally:
                    browser.close()
        finally:
            nb.close()
        rest(lab, "DELETE", f"workbench/pools/{card_id(lab)}")
        assert until(lambda: not alive(pids), timeout=30), f"left running: {alive(pids)}"


def card_id(lab: dict) -> str:
    [pool] = rest(lab, "GET", "workbench/pools")["pools"]
    return pool["id"]
