"""Live dashboard on vs off: MLP samples/s, without a browser and with JupyterLab + Chromium rendering it.

    .venv/bin/python -m bench.run --only dashboard          # part of `make bench`
    .venv/bin/python -m bench.dashboard_overhead [--rounds 4] [--steps 60] [--no-browser]

Both halves alternate "off" rounds (no publisher on the ranks, no dashboard) and "on" rounds (every
rank's publisher and device sampler, the live dashboard in the kernel) on one 2-rank CPU pool,
the order flipped every round; samples/s is timed on rank 0 around the run (``bench/loop.py``).

- without a browser: the pool of ``bench.run`` in this process; a kernel-side Dashboard follows the
  runs (its widget messages go nowhere). Also the delay from a step's end (engine clock) to the
  dashboard update that carried it (kernel clock, same host).
- with a browser: a real JupyterLab server, a notebook on its own kernel and pool, opened in Debian's
  Chromium through Playwright; each round is one cell, whose ``%%distributed`` shows the dashboard by
  itself when its run starts, scrolled into view while it runs. Skipped, with a note, where
  ``/usr/bin/chromium`` or Playwright is missing. The CPU seconds each part (kernel, engines,
  JupyterLab server, Chromium) used per second of each round say where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import BENCH, summary

SIDES = ("off", "on")
DONE = re.compile(r"^\[\d+\]:$")  # the input prompt of a cell that ran: "[12]:"


def _order(i: int) -> tuple[str, str]:
    return SIDES if i % 2 == 0 else SIDES[::-1]


def _ratio(rates: dict) -> dict:
    res = {k: summary(v, 1, 1) for k, v in rates.items()}
    off = res["off"]["median"]
    res["ratio_on_to_off"] = round(res["on"]["median"] / off, 3) if off and res["on"]["median"] else None
    return res


def without_browser(pool, rounds: int, steps: int) -> dict:
    """On vs off on ``pool`` (a ``bench.training.Pool``), the dashboard in this process."""
    from workbench import remote
    from workbench.widgets.live_dashboard import Dashboard

    s = pool.s
    if s.metrics is None:
        return {"error": "this pool has no metrics collector"}
    pool.cell("trainer_d = loop.build('mlp')")
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    kernel_cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    delays: list[float] = []
    try:
        for i in range(rounds):
            for side in _order(i):
                dash = None
                if side == "on":
                    s.apply(remote.connect_metrics, s.pool.channel)
                    pool.cell("loop.set_metrics(trainer_d, True)")
                    dash = Dashboard(s.metrics, run="latest")
                    dash.refresh()
                    dash.delays.clear()  # only this round's points count
                else:
                    pool.cell("loop.set_metrics(trainer_d, False)")
                    s.apply(remote.disconnect_metrics)
                cpu0, t0 = time.process_time(), time.perf_counter()
                pool.cell(f"r = loop.measure(trainer_d, steps={steps})")
                kernel_cpu[side].append((time.process_time() - cpu0) / (time.perf_counter() - t0))
                rates[side].append(s.pull("r", rank=0)["samples_per_s"])
                if dash is not None:
                    time.sleep(1.5)  # the last points reach the collector, then the widget
                    dash.refresh()
                    delays += list(dash.delays)
                    dash.close()
    finally:
        s.apply(remote.connect_metrics, s.pool.channel)  # as the pool had it
        pool.cell("del trainer_d", check=False)
    res = _ratio(rates)
    res["kernel_cpu_per_s"] = {k: summary(v, 1, 3) for k, v in kernel_cpu.items()}
    res["loss_point_to_widget_s"] = summary(delays, 1, 3)
    if delays:
        ordered = sorted(delays)
        res["loss_point_to_widget_s"]["p95"] = round(ordered[int(0.95 * (len(ordered) - 1))], 3)
    res["steps_per_round"] = steps
    return res


# -- with a browser ------------------------------------------------------------------------------
# In the notebook's kernel: one side of one round, its %%distributed cell run from this cell.
SETUP = """
import json
from workbench import remote
from workbench.session import current
s = current()
rates = {"off": [], "on": []}

def side(on, steps):
    s.apply(remote.connect_metrics, s.pool.channel) if on else s.apply(remote.disconnect_metrics)
    code = f"loop.set_metrics(trainer_d, {on})\\nr = loop.measure(trainer_d, steps={steps}, warmup=0)"
    get_ipython().run_cell_magic("distributed", "", code)
    rates["on" if on else "off"].append(s.pull("r", rank=0)["samples_per_s"])
"""


def _notebook(rounds: int, steps: int, out: Path) -> dict:
    """Setup cells, then one cell per side per round, then the rates written to ``out``."""
    setup = SETUP.strip()
    warm = (
        f"%%distributed\nimport sys\nsys.path.insert(0, {str(BENCH)!r})\nimport loop\n"
        "trainer_d = loop.build('mlp')\ntrainer_d.run(steps=20)  # warm-up: a dashboard shows once here"
    )
    cells = ["%load_ext workbench", "%dist start -n 2", setup, warm]
    cells += [f"side({side == 'on'}, {steps})" for i in range(rounds) for side in _order(i)]
    cells += [f"json.dump(rates, open({str(out)!r}, 'w'))", "%dist stop"]
    return {
        "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": c}
                  for c in cells],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }


def _parts(root: int, browser_pid: int | None) -> dict[str, list[psutil.Process]]:
    """The processes of each part: the JupyterLab server, its kernel, the kernel's engines, Chromium."""
    parts: dict[str, list[psutil.Process]] = {"server": [], "kernel": [], "engines": [], "chromium": []}
    try:
        server = next(p for p in psutil.Process(root).children() if "jupyterlab" in " ".join(p.cmdline()))
    except (StopIteration, psutil.Error):
        return parts
    parts["server"] = [server]
    for kernel in server.children():
        parts["kernel"].append(kernel)
        parts["engines"] += kernel.children(recursive=True)
    if browser_pid:
        try:
            parts["chromium"] = [psutil.Process(browser_pid), *psutil.Process(browser_pid).children(True)]
        except psutil.Error:
            pass
    return parts


def _cpu(parts: dict[str, list[psutil.Process]]) -> dict[str, float]:
    out = {}
    for name, procs in parts.items():
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        out[name] = total
    return out


def with_browser(rounds: int, steps: int, screenshot: Path | None = None) -> dict:
    """On vs off in a real JupyterLab rendered by Chromium on the same cores; a note where it cannot run."""
    from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, run_lab

    if not Path(CHROMIUM).exists():
        return {"skipped": f"no browser: {CHROMIUM} is not installed (apt-get install chromium)"}
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        return {"skipped": "no browser: playwright is not installed (pip install playwright)"}
    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-dash-"))
    out = tmp / "rates.json"
    nb = _notebook(rounds, steps, out)
    cpu: dict[str, dict[str, list[float]]] = {side: {} for side in SIDES}
    with run_lab(tmp, {"bench.ipynb": nb}) as lab, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        browser_pid = _browser_pid(os.getpid())
        try:
            page.goto(f"{lab['base']}/lab/tree/bench.ipynb?token={lab['token']}")
            try:  # JupyterLab may ask which kernel to start even though the notebook names one
                page.locator(".jp-Dialog").get_by_role("button", name="Select").click(timeout=15_000)
            except Exception:
                pass
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(
                timeout=120_000)
            cells = page.locator(".jp-Notebook .jp-Cell")
            kinds = [None] * 4 + [s for i in range(rounds) for s in _order(i)] + [None, None]
            for i, kind in enumerate(kinds):
                cell = cells.nth(i)
                cell.scroll_into_view_if_needed()
                cell.locator(".jp-InputPrompt").click()
                parts = _parts(os.getpid(), browser_pid)
                before, t0 = _cpu(parts), time.perf_counter()
                page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-cell'); }")
                expect(cell.locator(".jp-InputPrompt")).to_have_text(DONE, timeout=300_000)
                if kind is not None:
                    wall = time.perf_counter() - t0
                    after = _cpu(parts)
                    for name in after:
                        cpu[kind].setdefault(name, []).append((after[name] - before[name]) / wall)
                    if kind == "on" and screenshot is not None and not screenshot.exists():
                        cell.screenshot(path=str(screenshot))
                if "Traceback" in cell.locator(".jp-OutputArea").inner_text():
                    raise RuntimeError(f"cell {i} failed: {cell.inner_text()[-1500:]}")
        finally:
            browser.close()
    if not out.exists():
        return {"error": "the notebook did not write its rates"}
    res = _ratio(json.loads(out.read_text()))
    res["cpu_per_s"] = {side: {k: summary(v, 1, 3) for k, v in parts.items()} for side, parts in cpu.items()}
    res["steps_per_round"] = steps
    return res


def _browser_pid(me: int) -> int | None:
    """Chromium's main process among this process's descendants (started by Playwright's driver)."""
    for p in psutil.Process(me).children(recursive=True):
        try:
            if p.name().startswith("chrom") and "--type=" not in " ".join(p.cmdline()):
                return p.pid
        except psutil.Error:
            pass
    return None


def run(pool, rounds: int, steps: int, browser: bool = True) -> dict:
    """Both halves: ``{"no browser": ..., "browser": ...}``."""
    out = {"no browser": without_browser(pool, rounds, steps)}
    if browser:
        shot = BENCH.parent / "build" / "ui" / "bench-dashboard.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.unlink(missing_ok=True)
        out["browser"] = with_browser(rounds, steps, shot)
    else:
        out["browser"] = {"skipped": "skipped (--no-browser)"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--only-browser", action="store_true")
    args = ap.parse_args()
    if args.only_browser:
        print(json.dumps({"browser": with_browser(args.rounds, args.steps)}, indent=1))
        return
    from bench.training import Pool

    pool = Pool()
    try:
        print(json.dumps(run(pool, args.rounds, args.steps, browser=not args.no_browser), indent=1))
    finally:
        pool.stop()


if __name__ == "__main__":
    main()
