"""The sidebar's Start dialog reaching a real one-node Slurm: JupyterLab and Chromium run on the "head node"
(the Slurm box's network namespace), the slurm fields go through the dialog, the pool comes up as a Slurm
job with 2 ranks, and Stop on its card releases the job. Screenshots: build/ui/slurm-*.png."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, needs_chromium, run_lab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), needs_chromium]

SHOTS = Path(__file__).resolve().parents[2] / "build" / "ui"


def _in_page(page, path: str):
    """A GET of the workbench API from inside the page (this process cannot reach the namespace)."""
    return page.evaluate("""async path => {
        const settings = window.jupyterapp.serviceManager.serverSettings;
        const r = await fetch(settings.baseUrl + path, {headers: {Authorization: `token ${settings.token}`}});
        return await r.json();
    }""", path)


def test_the_slurm_dialog_starts_and_stops_a_pool_on_slurm(slurm_box, workdir):
    from playwright.sync_api import expect, sync_playwright

    box, ns = slurm_box
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Chromium on the head node too: Playwright talks to it over a pipe, so a wrapper can enter the namespace
    chromium = workdir / "chromium-in-ns"
    chromium.write_text(f'#!/bin/sh\nexec nsenter --net={ns.path} {CHROMIUM} "$@"\n')
    chromium.chmod(0o755)
    with run_lab(workdir / "lab", {}, wrap=["nsenter", f"--net={ns.path}"], extra_env=box.env) as lab, \
            sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(workdir / "chromium-profile"), executable_path=str(chromium), args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1400, "height": 850})
        page = browser.new_page()
        try:
            page.goto(f"{lab['base']}/lab?token={lab['token']}")
            page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
            page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
            panel = page.locator("#workbench-pools")
            panel.get_by_role("button", name="Advanced…").click()
            form = page.locator(".jp-Dialog .wb-StartForm")
            form.locator('[name="launcher"]').select_option("slurm")
            form.locator('[name="n"]').fill("2")
            form.locator('[name="partition"]').fill("debug")
            form.locator('[name="time"]').fill("10")
            form.locator('[name="interface"]').select_option("lo")  # the nodes are this machine
            form.locator('[name="timeout"]').fill("120")
            page.screenshot(path=str(SHOTS / "slurm-dialog.png"))
            page.locator(".jp-Dialog").get_by_role("button", name="Start").click()

            card = panel.locator(".wb-Card").first
            expect(card).to_have_attribute("data-state", "running", timeout=200_000)
            expect(card.locator(".wb-Card-counts")).to_contain_text("2 ranks")
            expect(card.locator(".wb-Card-meta").nth(1)).to_contain_text("slurm")
            jobs = box.squeue()
            assert len(jobs) == 1 and jobs[0].endswith("RUNNING"), jobs
            pool = _in_page(page, "workbench/pools")["pools"][0]
            assert pool["options"]["launcher"] == "slurm" and pool["options"]["partition"] == "debug"
            page.screenshot(path=str(SHOTS / "slurm-pool-running.png"))

            card.get_by_role("button", name="Stop").click()
            page.locator(".jp-Dialog").get_by_role("button", name="Stop pool").click()
            expect(panel.locator(".wb-Card")).to_have_count(0, timeout=60_000)
            deadline = time.monotonic() + 30
            while box.squeue() and time.monotonic() < deadline:
                time.sleep(0.3)
            assert box.squeue() == [], "stop must release the Slurm job"
        except Exception:
            page.screenshot(path=str(SHOTS / "slurm-failure.png"))
            print(json.dumps(_in_page(page, "workbench/pools"), indent=1)[:3000])
            print(lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()
