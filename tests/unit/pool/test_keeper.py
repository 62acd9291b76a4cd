"""How a kernel finds the Jupyter server to hand a kept pool to (``find_server``: the environment and the
runtime folder's ``jpserver-<pid>.json`` in, a server or a sentence out)."""

from __future__ import annotations

import json
import os

import pytest

from workbench.errors import CannotKeep
from workbench.pool.keeper import find_server

pytestmark = pytest.mark.timeout(30)


def _env(tmp_path, info: dict | None, pid: int | None = None) -> dict[str, str]:
    """The environment of a kernel whose parent is ``pid`` (default: this process), with ``info`` as that
    parent's server file (None: it wrote none)."""
    pid = os.getpid() if pid is None else pid
    if info is not None:
        (tmp_path / f"jpserver-{pid}.json").write_text(json.dumps({"pid": pid, **info}))
    return {"JPY_PARENT_PID": str(pid), "JUPYTER_RUNTIME_DIR": str(tmp_path)}


def test_a_server_is_found_with_its_url_and_token(tmp_path):
    server = find_server(_env(tmp_path, {"url": "http://127.0.0.1:8888/lab-base/", "token": "t0k"}))
    assert (server.url, server.token, server.pid, server.sock) == \
        ("http://127.0.0.1:8888/lab-base/", "t0k", os.getpid(), "")


def test_a_server_on_a_unix_socket_is_reached_over_it(tmp_path):
    server = find_server(_env(tmp_path, {"url": "http+unix://%2Ftmp%2Fj.sock/", "sock": "/tmp/j.sock",
                                         "base_url": "/b/", "token": "t"}))
    assert (server.url, server.sock) == ("http://localhost/b/", "/tmp/j.sock")


def test_a_parent_that_is_no_server_is_said(tmp_path):
    with pytest.raises(CannotKeep, match=r"the process that started this kernel \(pid \d+\) is no running "
                                         r"Jupyter server \(it wrote no .*jpserver-\d+\.json\)"):
        find_server(_env(tmp_path, None))


def test_a_server_file_left_by_a_server_that_is_gone_does_not_count(tmp_path):
    gone = 2 ** 22 + 1  # above the default pid_max: no such process
    with pytest.raises(CannotKeep, match="is no running Jupyter server"):
        find_server(_env(tmp_path, {"url": "http://127.0.0.1:1/", "token": "t"}, pid=gone))


def test_a_server_with_a_password_and_no_token_is_said(tmp_path):
    with pytest.raises(CannotKeep, match="signs in with a password and has no token"):
        find_server(_env(tmp_path, {"url": "http://127.0.0.1:8888/", "token": "", "password": True}))
