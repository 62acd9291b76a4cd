"""The person at the browser of a hub test: runs inside the cluster's head namespace (the only place the
hub's address is reachable), logs in through JupyterHub's login page in Debian's Chromium, works in a
notebook of the server the hub spawned as a Slurm job, and writes what it saw as JSON.

Usage: ``python tests/cluster/hub_browser.py SPEC_JSON RESULT_FILE`` (see tests/cluster/test_hub_browser.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

from tests.conftest import until
from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, open_notebook, run_cell
from tests.ui.test_dashboard_browser import _start_training

WHERE = ("%%distributed\nimport os, socket\n"
         "print('WHERE', rank, socket.gethostname(), os.environ.get('SLURM_JOB_ID'),\n"
         "      os.environ.get('SLURM_STEP_ID'))")


def _numbered(steps: str) -> list[str]:
    """The numbered steps among squeue's ``JOB.STEP`` ids (not a job's batch or extern step)."""
    return [s for s in steps.split() if s.split(".")[-1].isdigit()]


def squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True).stdout.strip()


def session(page, spec: dict, out: dict) -> None:
    from playwright.sync_api import expect

    hub, user, shots = spec["hub"], spec["user"], Path(spec["shots"])
    t0 = time.perf_counter()
    page.goto(f"{hub}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "any password: a test hub")
    page.click("#login_submit")
    # the hub submits the server's job and shows its progress page until the server answers
    page.wait_for_url(re.compile(rf"/user/{user}/lab"), timeout=180_000)
    out["login_to_lab_s"] = time.perf_counter() - t0
    out["job_at_login"] = squeue("-o", "%i %T %D %N")
    open_notebook(page, {"base": f"{hub}/user/{user}", "token": ""}, spec["notebook"])
    cells = page.locator(".jp-Notebook .jp-Cell")
    for i in range(3):  # %load_ext, %dist start -n 2, the Trainer's set-up
        run_cell(page, cells, i)
    out["start_cell"] = cells.nth(1).locator(".jp-OutputArea").inner_text()
    where = run_cell(page, cells, 3).locator(".jp-OutputArea").inner_text()
    out["where"] = sorted(re.findall(r"WHERE (\d) (\S+) (\S+) (\S+)", where))

    cell, dash = _start_training(page, cells, 4, points=20)  # the live dashboard in the cell
    expect(dash.locator(".workbench-dashboard-header")).to_contain_text("training")
    out["steps_while_training"] = squeue("-s", "-o", "%i")
    page.screenshot(path=str(shots / "hub-live-dashboard.png"))
    page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
    card = page.locator("#workbench-pools .wb-Card").first
    expect(card).to_have_attribute("data-state", "running", timeout=60_000)
    out["card"] = card.inner_text()
    card.get_by_role("button", name="Stacks").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator("pre.wb-Stacks")).to_contain_text("stacks of 2 ranks", timeout=60_000)
    out["stacks"] = dialog.locator("pre.wb-Stacks").inner_text()[:2000]
    dialog.get_by_role("button", name="Close").click()
    card.get_by_role("button", name="Open dashboard").click()
    docked = page.locator(".wb-DashboardPanel")
    expect(docked.locator(".main-svg").first).to_be_visible(timeout=90_000)
    expect(docked.locator(".workbench-dashboard-header")).to_contain_text(re.compile(r"step \d+"),
                                                                        timeout=60_000)
    page.screenshot(path=str(shots / "hub-card-and-docked-dashboard.png"))

    expect(cell.locator(".jp-OutputArea")).to_contain_text("trained", timeout=180_000)
    plot = cell.locator(".jp-RenderedPlotly.js-plotly-plot")  # the run ended: plotly's static figure
    expect(plot.locator(".gtitle")).to_contain_text("finished at step", timeout=60_000)
    stop = run_cell(page, cells, 5)  # %dist stop
    out["stop_cell"] = stop.locator(".jp-OutputArea").inner_text()
    expect(page.locator("#workbench-pools .wb-Card")).to_have_count(0, timeout=60_000)
    # the pool's steps end as Slurm completes them (slurmstepd reaps the tasks): awaited, bounded
    t_stop = time.monotonic()
    until(lambda: not _numbered(squeue("-s", "-o", "%i")), 30, every=0.2)
    out["steps_gone_s"] = time.monotonic() - t_stop
    out["steps_after_stop"] = squeue("-s", "-o", "%i")

    # the hub's own page: Stop My Server
    page.goto(f"{hub}/hub/home")
    t1 = time.perf_counter()
    page.locator("#stop").click()
    expect(page.locator("#stop")).to_be_hidden(timeout=120_000)  # hidden once the hub says it stopped
    out["hub_stop_s"] = time.perf_counter() - t1


def main() -> None:
    spec, result_file = json.loads(sys.argv[1]), sys.argv[2]
    out: dict = {}
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            spec["profile"], executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1600, "height": 1000})
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            session(page, spec, out)
        except BaseException:
            out["error"] = traceback.format_exc()
            try:
                page.screenshot(path=str(Path(spec["shots"]) / "hub-failure.png"), full_page=True)
            except Exception:
                pass
        finally:
            out["page_errors"] = errors
            browser.close()
    Path(result_file).write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
