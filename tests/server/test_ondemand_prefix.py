"""An Open OnDemand-style server (issue 37 part 3): ``--ServerApp.base_url=/node/HOST/PORT/`` with XSRF checks
off (``disable_check_xsrf``, as OnDemand's Jupyter app starts it). Every workbench route, under that prefix,
refuses every verb of a request without the server's auth, tried adversarially: no token, a wrong token (in
the header and in the URL), a forged login cookie (signed with another secret), and a cross-origin request
carrying the real login cookie. Controls that show each refusal is the auth's: the token, and the real
cookie from the same origin, are let in. Nothing is started by a refused request (no pool, no file, no
process).

A real ``jupyter server`` process with the workbench extension; plain HTTP requests.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import subprocess
import sys
import urllib.parse
from pathlib import Path

import psutil
import pytest
import tornado.web

from tests.conftest import until
from tests.ui.lab import free_port, stop_server
from workbench.server.handlers import ROUTES

PREFIX = "/node/vm/8899/"
VERBS = ("GET", "POST", "PUT", "PATCH", "DELETE")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Server:
    def __init__(self, port: int, token: str, state: Path, proc: subprocess.Popen):
        self.port, self.token, self.state, self.proc = port, token, state, proc

    def call(self, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
        """One request; (status, headers, body text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            if body is None and method in ("POST", "PUT", "PATCH"):
                body = b'{"n": 1}'  # a valid start request: refused only for want of auth
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.headers, r.read().decode(errors="replace")
        finally:
            conn.close()


@pytest.fixture(scope="module")
def ondemand(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ondemand")
    config = tmp / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps({"ServerApp": {
        "jpserver_extensions": {"workbench.server": True}, "base_url": PREFIX, "disable_check_xsrf": True}}))
    # allow_unauthenticated_access keeps its default (true): each handler's own decorators are what refuses
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTER_DATA_DIR=str(tmp / "data"), WORKBENCH_STATE_DIR=str(tmp / "pool-state"),
               HOME=str(tmp))
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
                             f"--port={port}", "--ServerApp.ip=127.0.0.1",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(port, token, tmp / "pool-state", proc)
    try:
        def up():
            try:
                return server.call("GET", f"{PREFIX}api/status?token={token}")[0] == 200
            except OSError:
                return proc.poll() is not None  # stop waiting: it died
        assert until(up, 60, every=0.2) and proc.poll() is None, (tmp / "server.log").read_text()[-3000:]
        yield server
    finally:
        left = stop_server(proc)
        log.close()
        assert left == [], left


def login_cookie(server: Server) -> str:
    """The server's own login cookie, as a browser gets it: the login form posted with the token."""
    status, headers, _ = server.call("POST", f"{PREFIX}login",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"},
                                     body=urllib.parse.urlencode({"password": server.token}).encode())
    assert status == 302, status
    cookie = next(c for c in headers.get_all("Set-Cookie") if c.startswith("username-"))
    return cookie.split(";", 1)[0]


def forged(cookie: str) -> str:
    """A cookie of the same name and shape, signed with a secret that is not the server's."""
    name, _ = cookie.split("=", 1)
    user = json.dumps({"username": "mallory", "name": "mallory", "display_name": "mallory"})
    value = tornado.web.create_signed_value(secrets.token_bytes(32), name, user).decode()
    return f"{name}={value}"


def paths() -> list[tuple[str, str]]:
    return [(route.example, verb) for route in ROUTES for verb in VERBS]


def test_every_route_under_the_prefix_refuses_every_verb_without_the_servers_auth(ondemand):
    cookie = login_cookie(ondemand)
    host = f"127.0.0.1:{ondemand.port}"
    attacks = {
        "no token": {},
        "a wrong token": {"Authorization": f"token {secrets.token_hex(16)}"},
        "a forged cookie": {"Cookie": forged(cookie)},
        "a cross-origin request with the real cookie": {"Cookie": cookie, "Origin": "http://evil.example"},
    }
    before = {p.pid for p in psutil.Process(ondemand.proc.pid).children(recursive=True)}
    let_in = []
    for example, verb in paths():
        path = PREFIX + example.lstrip("/")
        for what, headers in attacks.items():
            status, _, body = ondemand.call(verb, path, headers={"Host": host, **headers})
            if status < 400 or status not in (403, 404, 405):
                let_in.append(f"{verb} {path} with {what}: {status} {body[:200]}")
        status, _, body = ondemand.call(verb, f"{path}?token={secrets.token_hex(16)}", headers={"Host": host})
        if status not in (403, 404, 405):
            let_in.append(f"{verb} {path}?token=WRONG: {status} {body[:200]}")
    assert let_in == [], "\n".join(let_in)
    # nothing was started by any of them
    assert not ondemand.state.exists() or not list(ondemand.state.glob("pool-*.json"))
    assert {p.pid for p in psutil.Process(ondemand.proc.pid).children(recursive=True)} <= before

    # the controls: the token, and the real cookie from the server's own origin, are let in under the prefix
    for headers in ({"Authorization": f"token {ondemand.token}"},
                    {"Cookie": cookie, "Origin": f"http://{host}"}, {"Cookie": cookie}):
        status, _, body = ondemand.call("GET", f"{PREFIX}workbench/info", headers={"Host": host, **headers})
        assert status == 200 and "launchers" in json.loads(body), (headers, status, body)
    # with XSRF checks off, the real cookie alone may change things from the server's own origin: a
    # stop of an unknown pool is answered (404 with the sentence), not refused
    status, _, body = ondemand.call("DELETE", f"{PREFIX}workbench/pools/nosuch",
                                    headers={"Host": host, "Cookie": cookie, "Origin": f"http://{host}"})
    assert status == 404 and "no pool 'nosuch'" in json.loads(body)["message"], (status, body)
    # and nothing is served outside the prefix
    token = {"Authorization": f"token {ondemand.token}"}
    status, _, _ = ondemand.call("GET", "/workbench/info", headers=token)
    assert status == 404

