"""A real Jupyter server with the workbench extension (pytest-jupyter), its state files in a temp dir."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403  (the jp_* fixtures)


@pytest.fixture
def jp_server_config(tmp_path, monkeypatch):
    # pools of other tests (and of people) must not show up here
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path / "pool-state"))
    return {"ServerApp": {"jpserver_extensions": {"workbench.server": True},
                          "allow_unauthenticated_access": False}}


@pytest.fixture
def api(jp_fetch):
    """``await api("GET", "pools")`` -> (status, JSON body); never raises for an HTTP error."""
    from tornado.httpclient import HTTPClientError

    async def call(method: str, *parts: str, body=None, **kw):
        if body is not None and not isinstance(body, str):
            body = json.dumps(body)
        if method in ("POST", "PUT") and body is None:
            body = ""
        try:
            r = await jp_fetch("workbench", *parts, method=method, body=body, **kw)
        except HTTPClientError as exc:
            r = exc.response
        text = r.body.decode() if r.body else ""
        return r.code, (json.loads(text) if text else None), text

    return call


async def wait_for(api, pool_id: str, state: str, timeout: float = 90.0) -> dict:
    """Poll GET /workbench/pools until the pool reaches ``state``; fail with what it said last."""

    def reached(pool: dict) -> bool:
        if pool["state"] == "failed" and state != "failed":
            pytest.fail(f"pool {pool_id} failed to start: {pool['error']}")
        return pool["state"] == state

    return await wait_until(api, pool_id, reached, timeout, f"reach {state!r}")


async def wait_until(api, pool_id: str, holds, timeout: float = 60.0, what: str = "get there") -> dict:
    """Poll GET /workbench/pools until ``holds(pool)`` for the pool; fail with what it said last."""
    import asyncio

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        code, body, _ = await api("GET", "pools")
        assert code == 200
        last = next((p for p in body["pools"] if pool_id in (p["id"], p["request_id"])), None)
        if last is not None and holds(last):
            return last
        await asyncio.sleep(0.2)
    pytest.fail(f"pool {pool_id} did not {what} in {timeout} s; last seen: {last}")


@contextlib.contextmanager
def owner_process(script: str, grace: float = 30.0):
    """Another process that starts a pool (``script`` prints its id, then reads stdin until it closes):
    ``(proc, pool_id)``. At the end its stdin is closed (it stops its pool and exits); it is killed if it has
    not exited within ``grace`` s."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ))
    try:
        pool_id = proc.stdout.readline().strip()
        assert pool_id, "the other process did not start its pool"
        yield proc, pool_id
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
