"""Another user on the machine cannot drive, stop or read a pool through its Jupyter server (issue 27).

A real JupyterLab server (its own runtime, config and pool-state folders below a folder every user can
enter) starts a real 2-rank pool from the panel's route. A real second user (uid 65534,
:mod:`tests.security.attacker`) then sends the server's routes every verb the panel uses, with no token
and with a forged one, reads every file of the server's runtime folder (``jpserver-*.json`` holds the
token) and of the pool's state folder, and attacks every port the server and the pool listen on. What
must hold: every request is refused (401/403), no file opens, nothing listening answers as a store or
lets a subscriber hear anything, and the pool is still running with the same ranks; at the end no
process is left.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import alive
from tests.security.intruder import Intruder, can_run_as_nobody
from tests.security.test_other_user import breaches
from tests.ui.lab import run_lab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WHY_NOT = can_run_as_nobody()


def call(lab: dict, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """The server's route ``path`` with the owner's token."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(f"{lab['base']}/workbench/{path}", data=data, method=method,
                                     headers={"Authorization": f"token {lab['token']}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def running_pool(lab: dict, pool_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, body = call(lab, "GET", "pools")
        assert code == 200
        pool = next((p for p in body["pools"] if pool_id in (p["id"], p.get("request_id"))), None)
        if pool and pool["state"] == "running":
            return pool
        assert not pool or pool["state"] != "failed", pool
        time.sleep(0.5)
    pytest.fail(f"the pool did not start within {timeout} s")


@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
def test_another_user_cannot_drive_stop_or_read_a_pool_through_its_server():
    base = Path(tempfile.mkdtemp(prefix="wb-security-server-"))
    os.chmod(base, 0o755)  # only the modes of the folders below keep the other user out
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cwd_before = sorted(os.listdir())
    started: set[int] = set()
    try:
        with run_lab(base, {}) as lab:
            code, body = call(lab, "POST", "pools", {"n": 2})
            assert code == 202, body
            pool = running_pool(lab, body["pool"]["id"])
            pids = sorted(r["pid"] for r in pool["ranks"])
            started |= set(pids)
            forged = secrets.token_hex(16)
            urls = []
            one = f"pools/{pool['id']}"
            for path, method in (("pools", "GET"), ("pools", "POST"), (one, "GET"), (one, "DELETE"),
                                 (f"{one}/restart", "POST"), (f"{one}/stacks", "GET"),
                                 (f"{one}/dashboard", "GET")):
                for token in ("", f"?token={forged}"):
                    urls.append({"http": f"{lab['base']}/workbench/{path}{token}", "method": method})
            for path, method in (("api/kernels", "GET"), ("api/kernels", "POST"), ("api/contents", "GET")):
                urls.append({"http": f"{lab['base']}/{path}", "method": method})
            folders = [base / "runtime", lab["state_dir"], base / "config"]
            with Intruder(folders=folders, urls=tuple(urls)) as bad:
                bad.phase = "server"
                bad.sweep()
                assert bad.settle(), "the attacker did not get through its attacks"
                answers = list(bad.answers)
            # still running, the same ranks, nothing changed by the attacks
            code, body = call(lab, "GET", f"pools/{pool['id']}")
            assert code == 200, body
            after = body.get("pool", body)
            assert after["state"] == "running" and sorted(r["pid"] for r in after["ranks"]) == pids
            assert alive(pids) == pids
            code, _ = call(lab, "DELETE", f"pools/{pool['id']}")
            assert code in (200, 202, 204)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    requests = [a for a in answers if "http" in a]
    files = [a for a in answers if "file" in a]
    statuses, opened = sorted({a["status"] for a in requests}), sorted({a["got"] for a in files})
    print(f"{len(requests)} requests: statuses {statuses}; {len(files)} files: {opened}; "
          f"{len(answers) - len(requests) - len(files)} ports")
    assert len(requests) == len(urls)
    assert {a["uid"] for a in answers} == {65534}
    assert [a for a in requests if a["status"] not in (401, 403)] == [], "a request got through"
    assert any(a.get("file", "").startswith(str(base / "runtime")) and "jpserver" in a["file"]
               for a in answers), "the server's runtime file (it holds the token) was not tried"
    assert breaches(answers) == []
    assert alive(sorted(started)) == []
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert sorted(os.listdir()) == cwd_before
