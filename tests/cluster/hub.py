"""A real JupyterHub with batchspawner's SlurmSpawner on the two-node Slurm of :mod:`tests.cluster.infra`.

The hub and its proxy (configurable-http-proxy, from npm) run in the cluster's head namespace; each user's
Jupyter server is a Slurm job whose batch script runs on n1, as Open OnDemand and most university hubs do.
The hub's configuration is ``docs/jupyterhub_config.py`` (what a site would use) plus what this private
cluster needs: a login without password, addresses, private state folders, a service token for the REST
API. Versions: JupyterHub and batchspawner from the ``hub`` extra (pinned in pyproject.toml),
configurable-http-proxy :data:`PROXY_VERSION`, installed once into a cache folder (never the checkout).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.cluster.infra import REPO, Netns, SlurmCluster, stop_processes

PROXY_VERSION = "5.3.0"
HUB_CONFIG = REPO / "docs" / "jupyterhub_config.py"


def cache_dir() -> Path:
    base = os.environ.get("WORKBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "distributed-workbench")
    return Path(base)


def proxy_bin(timeout: float = 300) -> Path:
    """The folder holding ``configurable-http-proxy`` (npm, :data:`PROXY_VERSION`), installed into the
    cache on first use (one installer at a time: a file lock)."""
    folder = cache_dir() / f"configurable-http-proxy-{PROXY_VERSION}"
    exe = folder / "node_modules" / ".bin" / "configurable-http-proxy"
    if exe.exists():
        return exe.parent
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".chp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.exists():
            done = subprocess.run(["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund",
                                   "--loglevel=error", f"configurable-http-proxy@{PROXY_VERSION}"],
                                  capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0 or not exe.exists():
                raise RuntimeError(f"npm could not install configurable-http-proxy@{PROXY_VERSION}:\n"
                                   f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return exe.parent


def why_no_hub() -> str | None:
    """``None`` when JupyterHub, batchspawner and npm are there; else what is missing."""
    try:
        import batchspawner  # noqa: F401
        import jupyterhub  # noqa: F401
    except ImportError as exc:
        return f"needs the hub extra (pip install -e '.[hub]'): {exc}"
    if shutil.which("npm") is None or shutil.which("node") is None:
        return "needs node and npm for configurable-http-proxy"
    return None


TEST_CONFIG = """\
import json, os
c = get_config()  # noqa: F821
load_subconfig({site!r})  # noqa: F821 (the site's configuration, as docs/deployment.md shows it)
t = json.loads(os.environ["WB_HUB_TEST"])
c.JupyterHub.authenticator_class = "dummy"           # any password: a test hub only
c.Authenticator.allow_all = True
c.JupyterHub.ip = t["ip"]                             # the proxy, on head's bridge address
c.JupyterHub.port = 8000
c.JupyterHub.hub_ip = t["ip"]                         # servers on the nodes call the hub back here
c.JupyterHub.hub_port = 8081
c.JupyterHub.cookie_secret_file = t["dir"] + "/cookie_secret"
c.JupyterHub.db_url = "sqlite:///" + t["dir"] + "/jupyterhub.sqlite"
c.ConfigurableHTTPProxy.pid_file = t["dir"] + "/proxy.pid"
c.Spawner.args = ["--allow-root", *t["args"]]
c.Spawner.notebook_dir = t["work"]
c.Spawner.environment = t["env"]                      # SLURM_CONF and the server's private folders
c.BatchSpawnerBase.exec_prefix = ""                  # root submits (a site: sudo -E -u USER, the default)
c.BatchSpawnerBase.req_homedir = t["work"]           # the job's log and working folder
c.BatchSpawnerBase.req_options = t["options"]
# n1, n2 do not resolve from head (a site has DNS): squeue's "RUNNING n1" becomes n1's address
c.SlurmSpawner.state_exechost_re = r"^\\S+\\s+n(\\d+)$"
c.SlurmSpawner.state_exechost_exp = t["node_prefix"] + r"\\1"
c.JupyterHub.services = [{{"name": "probe", "api_token": t["token"]}}]
c.JupyterHub.load_roles = [{{"name": "probe-role", "services": ["probe"],
                            "scopes": ["admin:users", "admin:servers", "access:servers", "read:users"]}}]
"""


class Hub:
    """JupyterHub (and its proxy) in the cluster's head namespace, spawning servers as Slurm jobs.

    >>> hub = Hub(cluster, tmp_path, notebooks={"train.ipynb": nb}).start()   # doctest: +SKIP
    >>> hub.url                                                                # doctest: +SKIP
    'http://10.77.6.1:8000'
    >>> hub.stop()                                                             # doctest: +SKIP
    """

    def __init__(self, cluster: SlurmCluster, workdir: Path, notebooks: dict[str, dict], *,
                 options: str = "--nodes=2 --exclusive"):
        self.cluster, self.dir = cluster, Path(workdir)
        self.work = self.dir / "work"  # the user's notebook folder and HOME, where the job runs
        self.notebooks, self.options = notebooks, options
        self.token = secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None
        self.log = self.dir / "hub.log"
        self.ip = cluster.address("head")
        self.url = f"http://{self.ip}:8000"

    def start(self, timeout: float = 90) -> Hub:
        proxy = proxy_bin()
        hubdir = self.dir / "hub"
        settings = self.dir / "settings" / "@jupyterlab" / "apputils-extension"
        for d in (hubdir, self.work, settings, self.dir / "runtime"):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.dir, self.work):
            d.chmod(0o755)
        # the news toast covers screenshots: off through its setting
        (settings / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        for name, nb in self.notebooks.items():
            (self.work / name).write_text(json.dumps(nb))
        config = hubdir / "jupyterhub_config.py"
        config.write_text(TEST_CONFIG.format(site=str(HUB_CONFIG)))
        server_env = {
            **self.cluster.env, "PYTHONPATH": str(REPO), "HOME": str(self.work),
            "JUPYTER_CONFIG_DIR": str(self.dir / "config"), "JUPYTER_DATA_DIR": str(self.dir / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.dir / "runtime"), "IPYTHONDIR": str(self.dir / "ipython"),
            "WORKBENCH_STATE_DIR": str(self.dir / "pool-state"),
        }
        args = ["--LabApp.news_url=None", "--LabApp.expose_app_in_browser=True",
                f"--LabApp.user_settings_dir={self.dir / 'settings'}",
                f"--LabApp.workspaces_dir={self.dir / 'workspaces'}"]
        test = {"ip": self.ip, "dir": str(hubdir), "work": str(self.work), "token": self.token,
                "env": server_env, "args": args, "options": self.options,
                "node_prefix": self.cluster.subnet + ".1"}
        env = {**os.environ, **self.cluster.env, "WB_HUB_TEST": json.dumps(test),
               "WORKBENCH_VENV": sys.prefix,
               "PATH": f"{Path(sys.executable).parent}:{proxy}:{os.environ.get('PATH', '')}"}
        hub = str(Path(sys.executable).parent / "jupyterhub")
        self.proc = self.cluster.head.popen([hub, "-f", str(config)], log=self.log, env=env, cwd=hubdir)
        deadline = time.monotonic() + timeout
        while "JupyterHub is now running at" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterHub did not start:\n{self.log_tail()}")
            time.sleep(0.2)
        return self

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """One call to the hub's REST API (``/hub/api/PATH``) with the service token, from head."""
        return request(self.cluster.head, method, f"{self.url}/hub/api/{path}", self.token, body)

    def pids(self) -> set[int]:
        """The hub's process and its children (the proxy)."""
        if self.proc is None:
            return set()
        try:
            return {self.proc.pid, *(c.pid for c in psutil.Process(self.proc.pid).children(recursive=True))}
        except psutil.Error:
            return {self.proc.pid}

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"

    def stop(self) -> None:
        """SIGTERM: the hub stops the servers it spawned (their jobs cancelled) and its proxy."""
        if self.proc is not None:
            stop_processes([self.proc.pid], grace=30)
            self.proc.wait(5)
            self.proc = None
        with contextlib.suppress(OSError, ValueError):  # the proxy, should the hub have left it
            stop_processes([int((self.dir / "hub" / "proxy.pid").read_text())])


REQUEST = """
import json, sys, urllib.request, urllib.error
method, url, token, body = sys.argv[1:5]
headers = {"Authorization": "token " + token} if token else {}
req = urllib.request.Request(url, method=method, headers=headers, data=body.encode() if body else None)
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        code, text = r.status, r.read().decode()
except urllib.error.HTTPError as e:
    code, text = e.code, e.read().decode()
print(json.dumps([code, text]))
"""


def request(ns: Netns, method: str, url: str, token: str = "", body: dict | None = None) -> tuple[int, dict]:
    """One HTTP request made from inside ``ns`` (this process has no route there): status and JSON."""
    done = ns.run([sys.executable, "-c", REQUEST, method, url, token, json.dumps(body) if body else ""],
                  timeout=90)
    code, text = json.loads(done.stdout)
    try:
        return code, json.loads(text) if text else {}
    except ValueError:
        return code, {"text": text}
