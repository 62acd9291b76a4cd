"""A real JupyterLab server with the panel polling: its log stays quiet, also while it shuts down.

The sidebar lists the pools every 1.5 s; each listing asks each pool's controller which ranks are busy.
Neither that nor stopping the server with the panel still polling may write noise into the server's log:
no controller line per poll, no 500 (``cannot schedule new futures after shutdown``), no traceback.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.parse

import pytest

from tests.conftest import alive
from tests.ui.lab import run_lab

pytestmark = [pytest.mark.slow]


class KeepAlive:
    """One HTTP/1.1 connection reused for every request, as a browser tab keeps it."""

    def __init__(self, lab: dict):
        url = urllib.parse.urlparse(lab["base"])
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        self.headers = {"Authorization": f"token {lab['token']}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body=None) -> tuple[int, dict | None]:
        self.conn.request(method, path, body=None if body is None else json.dumps(body), headers=self.headers)
        r = self.conn.getresponse()
        text = r.read()
        return r.status, (json.loads(text) if text else None)


def _poll_until_gone(lab: dict, seen: list[tuple[int, str]], stop: threading.Event) -> None:
    """Poll the pools as fast as the server answers until it is gone; record each status."""
    client = KeepAlive(lab)
    while not stop.is_set():
        try:
            status, body = client.call("GET", "/workbench/pools")
        except (OSError, http.client.HTTPException):
            return  # the server closed the connection: it is gone
        seen.append((status, (body or {}).get("message", "")))
        time.sleep(0.02)


@pytest.mark.timeout(240)
def test_polling_and_shutdown_leave_the_server_log_quiet(tmp_path):
    seen: list[tuple[int, str]] = []
    stop = threading.Event()
    poller = None
    with run_lab(tmp_path, {}) as lab:
        api = KeepAlive(lab)
        status, body = api.call("POST", "/workbench/pools", {"n": 2})
        assert status == 202, body
        request_id = body["pool"]["request_id"]
        deadline = time.monotonic() + 150
        while True:
            status, body = api.call("GET", "/workbench/pools")
            pool = next(p for p in body["pools"] if request_id in (p["id"], p["request_id"]))
            if pool["state"] == "running":
                break
            assert pool["state"] == "starting" and time.monotonic() < deadline, pool
            time.sleep(0.3)
        # a notebook open too: the server then takes a while to shut its kernel down after our extension
        status, kernel = api.call("POST", "/api/kernels", {"name": "python3"})
        assert status == 201, kernel
        for _ in range(15):  # what the panel does for a while: each listing asks the controller
            status, body = api.call("GET", "/workbench/pools")
            # idle; "unknown" where the controller did not answer that look in time (a loaded machine)
            states = {r["state"] for r in body["pools"][0]["ranks"]}
            assert status == 200 and states <= {"idle", "unknown"}, body
            time.sleep(0.2)
        pids = [r["pid"] for r in body["pools"][0]["ranks"]]
        poller = threading.Thread(target=_poll_until_gone, args=(lab, seen, stop), daemon=True)
        poller.start()
        time.sleep(0.5)
    stop.set()
    poller.join(timeout=30)

    log = lab["log"].read_text()
    noise = [line for line in log.splitlines()
             if "queue_request" in line or "cannot schedule new futures" in line or "Traceback" in line
             or re.search(r"\b500 (GET|POST|DELETE)", line)]
    assert not noise, "\n".join(noise[:20])
    # while it shut down the panel got its pools, or a clean 503 saying why not
    assert seen and {code for code, _ in seen} <= {200, 503}, seen[-5:]
    for code, message in seen:
        if code == 503:
            assert message == "the Jupyter server is shutting down.", message
    assert not alive(pids), "the server's pool outlived it"
