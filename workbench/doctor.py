"""Where the pieces of a Jupyter set-up run, and whether they agree: ``workbench doctor``, and the one
sentence ``%dist status`` says when the sidebar cannot work.

On clusters the Jupyter server often comes from a site module and the kernel from the user's own
environment (Open OnDemand, JupyterHub): the magics, the in-cell dashboard and the CLI need the workbench in
the kernel's environment only; the sidebar also needs its server extension in the server's, at the same
version. The pieces looked at:

- this process's environment (the kernel's, when run from a notebook: ``!workbench doctor``);
- the Jupyter server, found as a kernel finds it (``JPY_PARENT_PID`` and its ``jpserver-PID.json`` in the
  Jupyter runtime folder); from a terminal, every server of this user there;
- its workbench server extension, asked over the server's own REST API with its token;
- the Lab extension and the kernel specs the server's environment has;
- the Slurm allocation this process runs in (job, nodes, GPUs, time left).

Imports nothing heavy (the CLI's other commands must stay fast): the standard library, and psutil once a
server is looked at.

>>> skew_sentence("0.1.0", "/srv/site", "0.2.0", "/home/u/env")  # doctest: +NORMALIZE_WHITESPACE
"version skew: the Jupyter server's workbench extension is 0.1.0 (in /srv/site) and this kernel's package
is 0.2.0 (in /home/u/env); install one version in both (`/srv/site/bin/pip install
distributed-workbench==0.2.0`), else the sidebar may misread the pools."
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "distributed-workbench"
LABEXTENSION = "distributed-workbench"
ASK_TIMEOUT_S = 3.0  # one request to the server, or one probe of another environment's Python
# What another environment's Python says about itself (run without this process's PYTHONPATH)
PROBE = """import importlib.metadata as m, importlib.util as u, json, sys
try:
    v = m.version("distributed-workbench")
except Exception:
    v = None
try:
    ok = u.find_spec("workbench.magics") is not None
except Exception:
    ok = False
print(json.dumps({"python": sys.executable, "prefix": sys.prefix, "version": v, "importable": ok}))"""


@dataclass
class Env:
    """A Python environment: its interpreter, prefix, and the workbench in it (``version`` None: absent)."""

    python: str
    prefix: str
    version: str | None
    importable: bool = True
    error: str = ""  # why it could not be asked

    @property
    def has_workbench(self) -> bool:
        return self.importable and self.version is not None

    def describe(self) -> str:
        if self.error:
            return f"{self.python}: could not be asked ({self.error})"
        what = f"distributed-workbench {self.version}" if self.has_workbench else "no workbench"
        return f"{self.prefix} (python {self.python}): {what}"


def this_env() -> Env:
    return Env(sys.executable, sys.prefix, package_version(), True)


def package_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return None


def probe_env(python: str) -> Env:
    """Ask ``python`` (another environment's interpreter) what it has; this one is answered at once."""
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # a venv is its link, not its target
        return this_env()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env,
                              timeout=ASK_TIMEOUT_S * 5)
        return Env(**json.loads(done.stdout.strip().splitlines()[-1]))
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        return Env(python, "?", None, False, error=str(exc) or type(exc).__name__)


@dataclass
class Server:
    """A running Jupyter server of this user, as its ``jpserver-PID.json`` says, and what it answered."""

    pid: int
    url: str
    token: str
    sock: str = ""
    parent: bool = False  # the server that started this kernel
    env: Env | None = None
    extension: dict | None = None  # its GET /workbench/info answer
    refused: str = ""  # why it gave none

    def label(self) -> str:
        return f"the Jupyter server (pid {self.pid}, {self.sock or self.url})"


def runtime_dir(env=None) -> Path:
    env = os.environ if env is None else env
    if env.get("JUPYTER_RUNTIME_DIR"):
        return Path(env["JUPYTER_RUNTIME_DIR"])
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir())


def find_servers(env=None) -> list[Server]:
    """The server that started this kernel (``JPY_PARENT_PID``) first, then every other live server of
    this user in the runtime folder."""
    import psutil

    env = os.environ if env is None else env
    parent = env.get("JPY_PARENT_PID", "")
    found = []
    for path in sorted(runtime_dir(env).glob("jpserver-*.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = info.get("pid")
        if not isinstance(pid, int) or not psutil.pid_exists(pid):
            continue
        sock = info.get("sock") or ""
        url = f"http://localhost{info.get('base_url') or '/'}" if sock else info.get("url", "")
        found.append(Server(pid, url, info.get("token") or "", sock, parent=str(pid) == parent))
    return sorted(found, key=lambda s: not s.parent)


def ask_extension(server: Server) -> Server:
    """Fill in what the server's workbench extension says (``GET workbench/info``), and its environment."""
    request = urllib.request.Request(server.url.rstrip("/") + "/workbench/info")
    if server.token:
        request.add_header("Authorization", f"token {server.token}")
    try:
        if server.sock:
            raise OSError(f"it listens on the unix socket {server.sock}, which this check does not ask")
        with urllib.request.urlopen(request, timeout=ASK_TIMEOUT_S) as reply:
            server.extension = json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        server.refused = ("it has no workbench server extension (404 on /workbench/info)" if exc.code == 404
                          else f"it answered /workbench/info with {exc.code}")
    except (OSError, ValueError) as exc:
        server.refused = f"it did not answer ({exc})"
    try:
        server.env = probe_env(interpreter_of(server.pid))
    except Exception as exc:  # another user's process, or gone
        server.env = Env("?", "?", None, False, error=str(exc))
    return server


def interpreter_of(pid: int) -> str:
    """The Python a process was started with, as it was named (a venv's ``bin/python`` is a link to the
    base interpreter: resolving it would lose the venv): its ``argv[0]``, found on its own PATH if bare."""
    import psutil

    proc = psutil.Process(pid)
    argv0 = proc.cmdline()[0]
    if "/" in argv0:
        return os.path.normpath(os.path.join(proc.cwd(), argv0))
    for folder in proc.environ().get("PATH", "").split(os.pathsep):
        if folder and os.access(os.path.join(folder, argv0), os.X_OK):
            return os.path.join(folder, argv0)
    return proc.exe()


def server_version(server: Server) -> str | None:
    """The workbench version of the server's extension (None: it has none; "older than 0.1.1": it does
    not say)."""
    if server.extension is None:
        return None
    return server.extension.get("version") or "(older, unnamed)"


def skew_sentence(server_version: str, server_prefix: str, kernel_version: str, kernel_prefix: str) -> str:
    """The one sentence that names a version skew between the server extension and the kernel's package."""
    return (f"version skew: the Jupyter server's workbench extension is {server_version} "
            f"(in {server_prefix}) and this kernel's package is {kernel_version} (in {kernel_prefix}); "
            f"install one version in both (`{server_prefix}/bin/pip install {PACKAGE}=={kernel_version}`), "
            "else the sidebar may misread the pools.")


def sidebar_problem(server: Server, kernel: Env) -> str | None:
    """Why the sidebar cannot work with this server and kernel, in one sentence; None when it can."""
    where = server.env.prefix if server.env and not server.env.error else "its environment"
    if server.extension is None:
        return (f"the JupyterLab sidebar is not available: {server.label()} runs from {where}, and "
                f"{server.refused}; the magics, the in-cell dashboard and `workbench pools` work without it "
                f"(install {PACKAGE} {kernel.version or ''} into {where} for the sidebar; `workbench doctor` "
                "says more).")
    theirs = server_version(server)
    if kernel.version and theirs != kernel.version:
        return skew_sentence(theirs, where, kernel.version, kernel.prefix)
    return None


_said = False


def sidebar_note(env=None) -> str | None:
    """For ``%dist status``: once per kernel, the sentence saying why the sidebar cannot work with the
    server that started this kernel; None when it can, when no server started it (a console, VS Code), or
    when it was said already."""
    global _said
    if _said:
        return None
    _said = True
    servers = [s for s in find_servers(env) if s.parent]
    if not servers:
        return None
    return sidebar_problem(ask_extension(servers[0]), this_env())


# -- the Lab extension and kernel specs an environment has ---------------------------------------------

def data_dirs(prefix: str, env=None) -> list[Path]:
    """Where a Jupyter server running from ``prefix`` looks for Lab extensions and kernel specs."""
    env = os.environ if env is None else env
    user = env.get("JUPYTER_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".local", "share", "jupyter")
    dirs = [Path(user), Path(prefix) / "share" / "jupyter", Path("/usr/local/share/jupyter"),
            Path("/usr/share/jupyter")]
    extra = [Path(p) for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    return list(dict.fromkeys(extra + dirs))


def labextension(prefix: str, env=None) -> tuple[str, str] | None:
    """(version, folder) of the first workbench Lab extension a server from ``prefix`` would load."""
    for d in data_dirs(prefix, env):
        package = d / "labextensions" / LABEXTENSION / "package.json"
        if package.exists():
            try:
                return json.loads(package.read_text()).get("version", "?"), str(package.parent)
            except (OSError, ValueError):
                return "?", str(package.parent)
    return None


@dataclass
class Spec:
    name: str
    python: str
    folder: str
    env: Env | None = None


def kernel_specs(prefix: str, env=None) -> list[Spec]:
    """The kernel specs a server from ``prefix`` offers (the first of each name), with their Pythons."""
    seen: dict[str, Spec] = {}
    for d in data_dirs(prefix, env):
        for spec_file in sorted((d / "kernels").glob("*/kernel.json")):
            name = spec_file.parent.name
            if name in seen:
                continue
            try:
                argv = json.loads(spec_file.read_text()).get("argv") or ["?"]
            except (OSError, ValueError):
                argv = ["?"]
            seen[name] = Spec(name, argv[0], str(spec_file.parent))
    if "python3" not in seen:  # ipykernel's built-in spec: the server's own Python
        seen["python3"] = Spec("python3", str(Path(prefix) / "bin" / "python"), "(built in)")
    return list(seen.values())


# -- the allocation ----------------------------------------------------------------------------------------

def allocation(env=None) -> dict | None:
    """The Slurm job this process runs in (None: none): id, nodes, GPUs, time left (``squeue %L``)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    gpus = env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_JOB_GPUS") or env.get("SLURM_GPUS")
    out = {"job": job, "nodes": env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "?",
           "nodelist": env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "?",
           "gpus": gpus or "none", "time_left": "?"}
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True,
                              timeout=ASK_TIMEOUT_S * 2)
        out["time_left"] = done.stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


# -- the report ------------------------------------------------------------------------------------------

@dataclass
class Report:
    kernel: Env
    servers: list[Server]
    labext: dict[str, tuple[str, str] | None] = field(default_factory=dict)  # server prefix -> found
    specs: dict[str, list[Spec]] = field(default_factory=dict)  # server prefix -> specs
    alloc: dict | None = None

    def advice(self) -> list[str]:
        """What to install where, one sentence each."""
        out = []
        if not self.kernel.has_workbench:
            out.append(f"this environment ({self.kernel.prefix}) has no workbench: "
                       f"`{self.kernel.python} -m pip install {PACKAGE}`, then start the kernel from it.")
        for server in self.servers:
            problem = sidebar_problem(server, self.kernel)
            if problem:
                out.append(problem[0].upper() + problem[1:])
            prefix = server.env.prefix if server.env else "?"
            if server.extension is not None and self.labext.get(prefix) is None:
                out.append(f"{server.label()} serves the workbench API but its environment ({prefix}) has no "
                           f"workbench Lab extension: reinstall {PACKAGE} there (the wheel carries it).")
            for spec in self.specs.get(prefix, []):
                if spec.env is not None and not spec.env.has_workbench and spec.name.startswith("workbench"):
                    out.append(f"kernel spec {spec.name} runs {spec.python}, which has no workbench: "
                               f"`{spec.python} -m pip install {PACKAGE}`, or `workbench kernels install "
                               "--user` from an environment that has it.")
            if not any(s.env is not None and s.env.has_workbench for s in self.specs.get(prefix, [])):
                out.append(f"no kernel spec of {server.label()} runs a Python with the workbench: `workbench "
                           f"kernels install --user` here ({self.kernel.prefix}) offers one.")
        return out

    def format(self) -> str:
        lines = ["workbench doctor", "", "this process (the kernel's environment when run from a notebook):",
                 f"  {self.kernel.describe()}"]
        if not self.servers:
            lines += ["", "Jupyter server: none of this user runs here (looked in "
                          f"{runtime_dir()}); the magics and the CLI need none."]
        for server in self.servers:
            role = "the server that started this kernel" if server.parent else "a Jupyter server of this user"
            lines += ["", f"{role}: pid {server.pid} at {server.sock or server.url}",
                      f"  environment: {server.env.describe() if server.env else '?'}",
                      "  workbench server extension: " + (f"{server_version(server)}" if server.extension
                                                          is not None else f"none: {server.refused}")]
            prefix = server.env.prefix if server.env else "?"
            found = self.labext.get(prefix)
            lines.append("  workbench Lab extension: " + (f"{found[0]} ({found[1]})" if found else "none"))
            for spec in self.specs.get(prefix, []):
                has = spec.env.describe() if spec.env else "?"
                lines.append(f"  kernel spec {spec.name}: {has}")
        lines += ["", "allocation: " + (
            f"inside Slurm job {self.alloc['job']} ({self.alloc['nodes']} node(s): {self.alloc['nodelist']}; "
            f"GPUs on this node: {self.alloc['gpus']}; time left {self.alloc['time_left']})"
            if self.alloc else "not inside a Slurm job")]
        advice = self.advice()
        lines += ["", "what to install where:" if advice else "everything agrees: nothing to install."]
        lines += [f"  - {a}" for a in advice]
        return "\n".join(lines)


def report(env=None) -> Report:
    kernel = this_env()
    servers = [ask_extension(s) for s in find_servers(env)]
    rep = Report(kernel, servers, alloc=allocation(env))
    pythons: dict[str, Env] = {}
    for server in servers:
        prefix = server.env.prefix if server.env else "?"
        rep.labext[prefix] = labextension(prefix, env)
        specs = kernel_specs(prefix, env)
        for spec in specs:
            if spec.python not in pythons:
                pythons[spec.python] = probe_env(spec.python)
            spec.env = pythons[spec.python]
        rep.specs[prefix] = specs
    return rep
