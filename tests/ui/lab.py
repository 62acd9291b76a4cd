"""A real JupyterLab server for browser tests, and the flags Debian's Chromium needs here."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import output_hook

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason="needs Debian's chromium: apt-get install chromium")


def chromium(p, tmp_path: Path, width: int = 1600, height: int = 1000):
    """Debian's Chromium (``p``: Playwright's sync API), headless, its own profile in ``tmp_path``."""
    return p.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
        headless=True, viewport={"width": width, "height": height})


@contextlib.contextmanager
def lab_page(p, tmp_path: Path, lab: dict, failure_shot: Path, **size):
    """A page of Debian's Chromium (:func:`chromium`, ``size``: its width and height) for the block on
    ``lab``; should the block fail, a screenshot to ``failure_shot`` and the server log's tail printed; the
    browser closed after."""
    browser = chromium(p, tmp_path, **size)
    page = browser.new_page()
    try:
        yield page
    except Exception:
        page.screenshot(path=str(failure_shot))
        print(lab["log"].read_text()[-4000:])
        raise
    finally:
        browser.close()


def descendants() -> set[int]:
    """The pids of this process's descendants now: taken before a test, for :func:`assert_nothing_left`."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def assert_nothing_left(before: set[int], pids=(), wait: float = 30) -> None:
    """Every one of ``pids`` (a pool's engines) has ended within ``wait`` s, and no process this test
    started (a descendant not in ``before``) still runs."""
    from tests.conftest import alive, until

    assert until(lambda: not alive(list(pids)), wait), alive(list(pids))
    left = descendants() - before
    assert not alive(list(left)), left


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_server(proc: subprocess.Popen, grace: float = 30) -> list[int]:
    """Stop a Jupyter server this test started (SIGTERM: it shuts its kernels down; SIGKILL after
    ``grace`` s); the pids of its children then that still run (none, for a server that cleaned up)."""
    import psutil

    from tests.conftest import alive, until

    running = proc.poll() is None
    children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)] if running else []
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    until(lambda: alive(children) == [], 15)
    return alive(children)


@contextlib.contextmanager
def run_lab(tmp_path: Path, notebooks: dict[str, dict], install_kernel: str | tuple[str, ...] = (),
            wrap: list[str] = (), extra_env: dict[str, str] | None = None, start_s: float = 60):
    """JupyterLab with its own config, data, runtime, settings and pool-state dirs, serving ``notebooks``.

    ``install_kernel``: the workbench kernel specs to install for it (one name or several). ``wrap``: a
    command the server runs under (e.g. ``nsenter --net=...``: another network namespace, which this
    process cannot reach, so readiness is read from the server's log); ``extra_env``: more environment;
    ``start_s``: how long the server may take to answer (a bound, not a speed check).

    Yields ``{"base", "token", "state_dir", "work", "log"}``. On exit the server is stopped (it
    stops its kernels and the pools it started) and any pool left in its state dir is ended.
    """
    home, work = tmp_path / "home", tmp_path / "work"
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    for d in (home, work, settings):
        d.mkdir(parents=True)
    # the news toast covers screenshots: turn it off through its setting
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    for name, nb in notebooks.items():
        (work / name).write_text(json.dumps(nb))
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               WORKBENCH_STATE_DIR=str(tmp_path / "pool-state"), IPYTHONDIR=str(tmp_path / "ipython"),
               **(extra_env or {}))
    if install_kernel:
        names = [install_kernel] if isinstance(install_kernel, str) else list(install_kernel)
        cmd = [sys.executable, "-m", "workbench.cli", "kernels", "install", "--user", *names]
        subprocess.run(cmd,
                       env=env, check=True, capture_output=True, timeout=60)
    port, token = free_port(), secrets.token_hex(16)
    log_path = tmp_path / "lab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [*wrap, sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
         "--LabApp.news_url=None", "--LabApp.expose_app_in_browser=True",
         f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
         f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if wrap:
                    if f"127.0.0.1:{port}/lab" not in log_path.read_text():
                        raise OSError("not yet")
                else:
                    urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + log_path.read_text()[-3000:])
                time.sleep(0.3)
        yield {"base": base, "token": token, "state_dir": tmp_path / "pool-state", "work": work,
               "log": log_path, "process": proc}
    finally:
        proc.terminate()  # the server shuts its kernels down and stops the pools it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        from workbench.pool.records import state as pool_state

        for path in (tmp_path / "pool-state").glob("pool-*.json"):  # anything left over: end it
            pool_state.terminate((pool_state.read_state(path) or pool_state.PoolState()).processes)


def open_notebook(page, lab: dict, name: str) -> None:
    """Open ``name`` in JupyterLab and wait until its kernel is idle."""
    from playwright.sync_api import expect

    page.goto(f"{lab['base']}/lab/tree/{name}?token={lab['token']}")
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    select = page.locator(".jp-Dialog").get_by_role("button", name="Select")
    # JupyterLab may ask which kernel to start even though the notebook names one: answer it if it does,
    # never wait for a question that does not come (that wait was 15 s of every browser test)
    expect(idle.or_(select).first).to_be_attached(timeout=90_000)
    if not idle.count() and select.count():
        select.click()
    expect(idle).to_be_attached(timeout=90_000)


DONE = re.compile(r"^\[\d+\]:$")  # the prompt of a cell that ran
KERNELS = {"python3": "Python 3 (ipykernel)", "workbench-cpu": "Python 3 (workbench, CPU)"}


def notebook(*sources: str, kernel: str = "python3") -> dict:
    """A notebook of code cells, one a source, on ``kernel`` (a name of :data:`KERNELS`): for
    :func:`run_lab`."""
    return {
        "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": src}
                  for src in sources],
        "metadata": {"kernelspec": {"name": kernel, "display_name": KERNELS[kernel], "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }


def run_cell(page, cells, i: int, wait: bool = True, timeout: float = 120_000):
    """Run cell ``i`` of the open notebook (``cells``: its cells' locator) and, with ``wait``, wait until it
    has run (else only until it started or was queued: the kernel's queue keeps the order); the cell.

    A request sent while the kernel's connection settles can be lost (under load the command was seen to run
    nothing): it is sent again only while the prompt still says "[ ]:", so a cell never runs twice."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    cell = cells.nth(i)
    select = page.locator(".jp-Dialog").get_by_role("button", name="Select")
    for attempt in range(3):
        try:
            # under load JupyterLab may still ask which kernel to start after the notebook's is idle (once,
            # at 64 ranks): the notebook names its kernel, so the dialog's choice is it
            if select.count():
                select.click()
            cell.scroll_into_view_if_needed()
            cell.locator(".jp-InputPrompt").click(timeout=15_000)
        except PlaywrightError:  # a notebook just opened may render its cells anew: find the cell again
            if attempt == 2:
                raise
            continue
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-cell'); }")
        try:
            expect(cell.locator(".jp-InputPrompt")).not_to_have_text("[ ]:", timeout=10_000)
            break
        except (AssertionError, PlaywrightTimeout):
            continue
    else:
        raise AssertionError(f"cell {i} never started: its prompt still says '[ ]:' after 3 tries")
    if wait:
        expect(cell.locator(".jp-InputPrompt")).to_have_text(DONE, timeout=timeout)
    return cell


def rest(lab: dict, method: str, path: str, body: dict | None = None) -> dict:
    """One authenticated call to the server's REST API; its JSON answer."""
    request = urllib.request.Request(f"{lab['base']}/{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"token {lab['token']}"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        text = reply.read()
    return json.loads(text) if text else {}


class Notebook:
    """A notebook's kernel, started by the server (``/api/sessions``), driven over its connection file."""

    def __init__(self, lab: dict, tmp_path, path: str = "keep.ipynb"):
        from jupyter_client.blocking import BlockingKernelClient

        self.lab = lab
        session = rest(lab, "POST", "api/sessions",
                       {"path": path, "type": "notebook", "kernel": {"name": "python3"}})
        self.kernel_id = session["kernel"]["id"]
        self.client = BlockingKernelClient(
            connection_file=str(tmp_path / "runtime" / f"kernel-{self.kernel_id}.json"))
        self.client.load_connection_file()
        # no heartbeat: on a loaded machine a missed beat (1 s) reads as "Kernel died"; the timeouts bound it
        self.client.start_channels(hb=False)
        self.client.wait_for_ready(timeout=90)

    def run(self, code: str, timeout: float = 180) -> str:
        """Run a cell; everything it showed (colours removed), its error included."""
        out: list[str] = []
        self.client.execute_interactive(code, timeout=timeout, output_hook=output_hook(out))
        return ANSI.sub("", "".join(out))

    def value(self, code: str, timeout: float = 180):
        """The JSON a cell prints after ``VALUE``."""
        text = self.run(code, timeout)
        assert "VALUE" in text, text
        return json.loads(text.split("VALUE", 1)[1].splitlines()[0])

    def pid(self) -> int:
        return self.value("import os, json; print('VALUE', os.getpid())")

    def restart(self) -> None:
        rest(self.lab, "POST", f"api/kernels/{self.kernel_id}/restart", {})
        self.client.wait_for_ready(timeout=90)

    def close(self) -> None:
        self.client.stop_channels()
