"""A real JupyterLab server for browser tests, and the flags Debian's Chromium needs here."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
]
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason="needs Debian's chromium: apt-get install chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
               "log": log_path}
    finally:
        proc.terminate()  # the server shuts its kernels down and stops the pools it started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        from workbench.pool import state as pool_state

        for path in (tmp_path / "pool-state").glob("pool-*.json"):  # anything left over: end it
            pool_state.terminate((pool_state.read_state(path) or {}).get("processes", []))


def open_notebook(page, lab: dict, name: str) -> None:
    """Open ``name`` in JupyterLab and wait until its kernel is idle."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    page.goto(f"{lab['base']}/lab/tree/{name}?token={lab['token']}")
    try:  # JupyterLab may ask which kernel to start even though the notebook names one
        page.locator(".jp-Dialog").get_by_role("button", name="Select").click(timeout=15_000)
    except PlaywrightTimeout:
        pass
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(timeout=90_000)
