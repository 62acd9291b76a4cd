"""A pool kept by the Jupyter server: ``%dist start --keep`` hands the pool over, so it outlives the kernel.

The kernel finds its server as Jupyter tells it: jupyter_client puts the pid of the process that launched
a kernel in its environment (``JPY_PARENT_PID``), and a Jupyter server writes ``jpserver-<pid>.json``
into the Jupyter runtime folder (readable by its user only) with its URL and token. The hand-over is the
panel's own start request, ``POST /workbench/pools``, with that token like every other verb: the server
starts the pool as one of its own (a panel-started pool), and the kernel then attaches to it. The server
holds it past kernel restarts, applies its idle release, and stops it when it shuts down.

>>> server = find_server()                                    # doctest: +SKIP
>>> pool_id = hand_over(PoolConfig(n=2, keep=True), progress=print, server=server)   # doctest: +SKIP
engines up: 2/2
running
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from workbench.config import PoolConfig
from workbench.errors import CannotKeep, PoolStartError
from workbench.pool.cluster import registration_wait

POLL_S = 0.2  # how often the kernel looks at the pool the server is starting
CALL_TIMEOUT_S = 30.0  # one request to the server (a listing asks each pool's controller, 2 s at most)
NOT_HELD = "nothing would hold the pool once this kernel ends"


@dataclass(frozen=True)
class JupyterServer:
    """The Jupyter server this kernel runs under: where it listens, and the token its API takes."""

    url: str  # e.g. "http://127.0.0.1:8888/" (the base URL included)
    token: str
    pid: int
    sock: str = ""  # a unix socket it listens on instead of a port

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """One request to the workbench API (``path`` under ``/workbench/``); its JSON answer.

        An error answer raises: 400 a ``ValueError`` with the server's sentence (a config it refused),
        403 and 404 :class:`CannotKeep` saying why, anything else :class:`PoolStartError`.
        """
        url = urllib.parse.urljoin(self.url, "workbench/" + path)
        data = json.dumps(body).encode() if body is not None else (b"" if method in ("POST", "DELETE")
                                                                    else None)
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        if self.token:
            request.add_header("Authorization", f"token {self.token}")
        try:
            with self._opener().open(request, timeout=CALL_TIMEOUT_S) as reply:
                return json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise self._refused(exc.code, _message(exc), method, path) from None
        except OSError as exc:
            raise CannotKeep(f"cannot keep the pool: the Jupyter server (pid {self.pid}) did not answer at "
                             f"{self.sock or self.url} ({exc}).") from None

    def _opener(self):
        if not self.sock:
            return urllib.request.build_opener()
        return urllib.request.build_opener(_UnixHandler(self.sock))

    def _refused(self, code: int, message: str, method: str, path: str) -> Exception:
        if code == 400:
            return ValueError(message)
        if code == 403:
            return CannotKeep(f"cannot keep the pool: the Jupyter server (pid {self.pid}) refused this "
                              f"kernel's token ({message}).")
        if code == 404 and path == "pools":
            return CannotKeep(f"cannot keep the pool: the Jupyter server (pid {self.pid}) does not serve the "
                              "workbench extension; enable it with `jupyter server extension enable "
                              "workbench.server` and restart the server.")
        return PoolStartError(f"the Jupyter server answered {method} /workbench/{path} with {code}: "
                              f"{message}")


def find_server(env: dict[str, str] | None = None) -> JupyterServer:
    """The Jupyter server that started this kernel, or :class:`CannotKeep` saying why there is none.

    >>> find_server({})
    Traceback (most recent call last):
    ...
    workbench.errors.CannotKeep: cannot keep the pool: this kernel was not started by a Jupyter server \
(no JPY_PARENT_PID in its environment), so nothing would hold the pool once this kernel ends; start it \
without --keep, or from the JupyterLab panel.
    """
    env = os.environ if env is None else env
    parent = env.get("JPY_PARENT_PID", "")
    if not parent.isdigit():
        raise CannotKeep("cannot keep the pool: this kernel was not started by a Jupyter server (no "
                         f"JPY_PARENT_PID in its environment), so {NOT_HELD}; start it without --keep, or "
                         "from the JupyterLab panel.")
    from jupyter_core.paths import jupyter_runtime_dir

    pid = int(parent)
    path = Path(env.get("JUPYTER_RUNTIME_DIR") or jupyter_runtime_dir()) / f"jpserver-{pid}.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        info = None
    if not info or info.get("pid") != pid or not psutil.pid_exists(pid):
        raise CannotKeep(f"cannot keep the pool: the process that started this kernel (pid {pid}) is no "
                         f"running Jupyter server (it wrote no {path}), so {NOT_HELD}; start it without "
                         "--keep, or from the JupyterLab panel.")
    if not info.get("token") and info.get("password"):
        raise CannotKeep(f"cannot keep the pool: the Jupyter server (pid {pid}) signs in with a password and "
                         "has no token, which a kernel could send; start the server with a token (its "
                         "default), or start the pool from the JupyterLab panel.")
    sock = info.get("sock") or ""
    url = f"http://localhost{info.get('base_url') or '/'}" if sock else info["url"]  # over the socket
    return JupyterServer(url=url, token=info.get("token") or "", pid=pid, sock=sock)


def hand_over(config: PoolConfig, progress: Callable[[str], None] = lambda msg: None, *,
              server: JupyterServer | None = None) -> str:
    """Have the Jupyter server start a pool like ``config`` and keep it; its id once every rank is ready.

    Its progress (``engines up: 1/2`` ...) goes to ``progress``. A start that fails raises
    :class:`PoolStartError` with the server's sentence; Ctrl-C or a start past its time asks the server
    to stop what it began: nothing is left running.
    """
    server = server or find_server()
    pool = server.call("POST", "pools", {**config.to_dict(), "keep": True})["pool"]
    request_id = pool["request_id"]
    # as long as the kernel itself would wait: the engines' registration, then the group's forming
    wait = registration_wait(config.timeout, pool["n"] or 1) + config.timeout + 30
    deadline = time.monotonic() + wait
    said = None
    try:
        while True:
            pool = server.call("GET", f"pools/{request_id}")["pool"]
            if pool["message"] != said:
                said = pool["message"]
                progress(f"the Jupyter server starts the pool: {said}")
            if pool["state"] == "running":
                return pool["id"]
            if pool["state"] == "failed":
                raise PoolStartError(pool["error"] or "the Jupyter server could not start the pool.")
            if time.monotonic() > deadline:
                raise PoolStartError(f"the Jupyter server had not started the pool within {wait:.0f} s; "
                                     "it was stopped. Try a longer --timeout.")
            time.sleep(POLL_S)
    except BaseException:  # a failed start is dismissed, Ctrl-C or a late one stopped: nothing left
        _quietly_stop(server, request_id)
        raise


def stop_kept(pool_id: str) -> bool:
    """Ask the Jupyter server that keeps the pool to stop it (its own session ends it: the side channel
    and the idle timer with it); False where no server of this kernel answers."""
    try:
        find_server().call("DELETE", f"pools/{pool_id}")
    except Exception:
        return False
    return True


def _quietly_stop(server: JupyterServer, request_id: str) -> None:
    try:
        server.call("DELETE", f"pools/{request_id}")
    except Exception:
        pass  # the server is gone (its pools with it) or the start is dismissed already


def _message(exc: urllib.error.HTTPError) -> str:
    """The sentence of an error answer (``{"message": ...}``), else its reason."""
    try:
        return json.loads(exc.read())["message"]
    except Exception:
        return exc.reason or str(exc.code)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (a server started with ``--sock``)."""

    def __init__(self, path: str, **kwargs):
        super().__init__("localhost", **kwargs)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class _UnixHandler(urllib.request.AbstractHTTPHandler):
    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def http_open(self, request):
        return self.do_open(lambda host, **kw: _UnixConnection(self._path, **kw), request)

    http_request = urllib.request.AbstractHTTPHandler.do_request_
