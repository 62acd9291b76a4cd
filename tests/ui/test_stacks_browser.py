"""The pool card's "Stacks" button in a real JupyterLab, in Debian's Chromium, through Playwright.

A pool started from the sidebar; "Stacks" shows every rank's stacks in a dialog, as `%dist stacks`
prints them. Screenshot: build/ui/stacks-dialog.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import alive
from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, needs_chromium, run_lab

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "ui"
BUILT = ROOT / "workbench" / "labextension"

pytestmark = [pytest.mark.slow, needs_chromium]


@pytest.fixture
def lab(tmp_path):
    """JupyterLab serving this tree's built sidebar: through its data dir, put before the environment's
    on Lab's search path (an installed copy may be an older build)."""
    env = {}
    if (BUILT / "package.json").exists():
        ours = tmp_path / "data" / "labextensions" / "distributed-workbench"
        ours.parent.mkdir(parents=True)
        ours.symlink_to(BUILT)
        env["JUPYTER_PREFER_ENV_PATH"] = "0"
    with run_lab(tmp_path, {}, extra_env=env) as server:
        yield server


@pytest.mark.timeout(240)
def test_the_stacks_button_shows_every_ranks_stacks(lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from workbench.pool.records import state as pool_state

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1400, "height": 850},
        )
        try:
            page = browser.new_page()
            page.goto(f"{lab['base']}/lab?token={lab['token']}")
            page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
            page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
            panel = page.locator("#workbench-pools")
            panel.get_by_role("button", name="Start pool").click()
            card = panel.locator(".wb-Card").first
            expect(card).to_have_attribute("data-state", "running", timeout=150_000)
            pool_id = card.get_attribute("data-pool-id")
            state = pool_state.read_state(lab["state_dir"] / f"pool-{pool_id}.json")
            pids = [rec["pid"] for rec in state.processes] + [r["pid"] for r in state.ranks]

            card.get_by_role("button", name="Stacks").click()
            dialog = page.locator(".jp-Dialog")
            expect(dialog).to_contain_text(f"Stacks of pool {state.name}")
            stacks = dialog.locator("pre.wb-Stacks")
            expect(stacks).to_contain_text("stacks of 2 ranks in 1 group", timeout=30_000)
            expect(stacks).to_contain_text("ranks 0-1: idle (no cell running)")
            page.screenshot(path=str(SHOTS / "stacks-dialog.png"))
            dialog.get_by_role("button", name="Close").click()
            expect(dialog).to_have_count(0)

            card.get_by_role("button", name="Stop").click()
            page.locator(".jp-Dialog").get_by_role("button", name="Stop pool").click()
            expect(panel.locator(".wb-Card")).to_have_count(0, timeout=60_000)
        finally:
            browser.close()
    assert alive(pids) == []
