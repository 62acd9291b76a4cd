"""Server and kernel in different environments (issue 37 part 5), as on clusters where the Jupyter server
comes from a site module and the kernel from the user's own environment.

Two real environments: this one (the kernel's: it has the workbench) and a second venv for the server, made
here in a second (no pip: a ``.pth`` names this venv's site-packages, which makes jupyter_server importable
there, while this venv's own ``.pth`` files, the editable workbench's among them, are not processed, so the
workbench is not). A real ``jupyter server`` runs from the second one and starts a kernel from this one.

- Without the workbench in the server's environment: the magics, a pool, the in-cell dashboard and the CLI
  work from the kernel; ``%dist status`` says once why the sidebar is not available; ``workbench doctor``
  names both environments and what to install where.
- With another version there (a workbench labelled 0.0.9 in the server's environment, its extension on):
  ``%dist status`` and ``workbench doctor`` name the skew in one sentence.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import sysconfig
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import alive, until
from tests.ui.lab import Notebook, free_port, rest, stop_server

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
VERSION = subprocess.run([sys.executable, "-c", "import workbench.doctor as d; print(d.package_version())"],
                         capture_output=True, text=True).stdout.strip()


def bare_venv(folder: Path) -> Path:
    """A venv that sees this one's packages but not the workbench; its ``site-packages``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    site = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "zz-main-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return site


def probe(python: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, cwd="/",
                          timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def server_envs(tmp_path_factory):
    """{"bare": a venv without the workbench, "skewed": one with a workbench labelled 0.0.9}."""
    base = tmp_path_factory.mktemp("envs")
    bare = base / "bare"
    bare_venv(bare)
    skewed = base / "skewed"
    site = bare_venv(skewed)
    (site / "repo.pth").write_text(str(ROOT) + "\n")  # the same code, under another version's label
    meta = site / "distributed_workbench-0.0.9.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: distributed-workbench\nVersion: 0.0.9\n")
    check = ("import importlib.util as u, importlib.metadata as m; "
             "print(u.find_spec('jupyter_server') is not None, u.find_spec('workbench.magics') is not None, "
             "m.version('distributed-workbench'))")
    assert probe(bare / "bin" / "python", check).split()[:2] == ["True", "False"]
    assert probe(skewed / "bin" / "python", check).split() == ["True", "True", "0.0.9"]
    return {"bare": bare, "skewed": skewed}


@contextmanager
def server_from(venv: Path, tmp: Path, extension: bool):
    """``jupyter server`` run by ``venv``'s Python (cwd and PYTHONPATH nowhere near this checkout), its
    ``python3`` kernel spec this environment's Python (the user's kernel)."""
    kernels = tmp / "data" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (the user's environment)", "language": "python"}))
    config = tmp / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": {"workbench.server": True}}} if extension else {}))
    port, token = free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JPY_PARENT_PID", "VIRTUAL_ENV")}
    env.update(HOME=str(tmp), JUPYTER_CONFIG_DIR=str(config), JUPYTER_DATA_DIR=str(tmp / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), WORKBENCH_STATE_DIR=str(tmp / "pool-state"),
               IPYTHONDIR=str(tmp / "ipython"), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    (tmp / "work").mkdir()
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen([str(venv / "bin" / "python"), "-m", "jupyter_server", "--no-browser",
                                 "--allow-root", f"--port={port}", "--ServerApp.ip=127.0.0.1",
                                 f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp / 'work'}"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp / "work")
        lab = {"base": f"http://127.0.0.1:{port}", "token": token, "state_dir": tmp / "pool-state"}
        try:
            def up():
                try:
                    return rest(lab, "GET", "api/status") is not None
                except OSError:
                    return proc.poll() is not None
            assert until(up, 60, every=0.2) and proc.poll() is None, (tmp / "server.log").read_text()[-3000:]
            yield lab, proc
        finally:
            assert stop_server(proc) == []


TRAIN = """%%distributed
import torch
from torch.utils.data import TensorDataset
from workbench.train import MLP, MLPConfig, Trainer, make_loader, regression_data
torch.manual_seed(0)
model = MLP(MLPConfig(d_in=8, d_hidden=16, d_out=2, n_layers=1))
loader = make_loader(TensorDataset(*regression_data(256, d_in=8, d_out=2)), batch_size=8)
result = Trainer(model, loader, lr=1e-2).run(steps=40)
print("trained", len(result.history))"""


def run_with_updates(nb: Notebook, code: str) -> str:
    """Run a cell; the text of everything it showed, the updates of its displays included (the dashboard
    replaces its live widget by its static figure through an update)."""
    out: list[str] = []

    def hook(msg):
        c = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(c["text"])
        elif msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            out.append(c["data"].get("text/plain", "") + "\n")
        elif msg["msg_type"] == "error":
            out.append("\n".join(c["traceback"]) + "\n")

    nb.client.execute_interactive(code, timeout=180, output_hook=hook)
    return "".join(out)


@pytest.mark.timeout(300)
def test_a_server_without_the_workbench_and_a_kernel_with_it(server_envs, tmp_path):
    with server_from(server_envs["bare"], tmp_path, extension=False) as (lab, server):
        nb = Notebook(lab, tmp_path)
        try:
            first = nb.run("%load_ext workbench\n%dist status")
            second = nb.run("%dist status")
            cli = f"!{sys.executable} -m workbench.cli"
            started = nb.run("%dist start -n 2")
            pids = nb.value("from workbench import session; import json\n"
                            "print('VALUE', json.dumps(session.current().pids()))")
            trained = run_with_updates(nb, TRAIN)
            pools = nb.run(f"{cli} pools")
            doctor = nb.run(f"{cli} doctor")
            stopped = nb.run("%dist stop")
        finally:
            nb.close()
    bare = str(server_envs["bare"])
    note = (f"the JupyterLab sidebar is not available: the Jupyter server (pid {server.pid}, "
            f"{lab['base']}/) runs from {bare}, and it has no workbench server extension (404 on "
            "/workbench/info); the magics, the in-cell dashboard and `workbench pools` work without it")
    both = first + second
    assert note in both and both.count("sidebar is not available") == 1, both  # said once
    assert "2 ranks" in started, started
    # the in-cell dashboard: live while the run lasted, then its static figure with how the run ended
    assert "workbench dashboard (live)" in trained and "run 1 finished at step 40" in trained, trained
    assert "trained 40" in trained
    assert "local" in pools and "2" in pools, pools
    print(doctor)
    assert f"environment: {bare} (python" in doctor and ": no workbench" in doctor, doctor
    assert f"{sys.prefix} (python {sys.executable}): distributed-workbench {VERSION}" in doctor, doctor
    assert "workbench server extension: none: it has no workbench server extension" in doctor, doctor
    assert f"kernel spec python3: {sys.prefix}" in doctor, doctor
    assert "what to install where:" in doctor and f"into {bare} for the sidebar" in doctor, doctor
    assert "stopped pool" in stopped
    assert until(lambda: alive(pids) == [], 15)


@pytest.mark.timeout(180)
def test_a_version_skew_is_named_in_one_sentence(server_envs, tmp_path):
    with server_from(server_envs["skewed"], tmp_path, extension=True) as (lab, _):
        info = rest(lab, "GET", "workbench/info")
        nb = Notebook(lab, tmp_path)
        try:
            status = nb.run("%load_ext workbench\n%dist status")
            doctor = nb.run(f"!{sys.executable} -m workbench.cli doctor")
        finally:
            nb.close()
    skewed = str(server_envs["skewed"])
    assert (info["version"], info["prefix"]) == ("0.0.9", skewed), info
    sentence = (f"version skew: the Jupyter server's workbench extension is 0.0.9 (in {skewed}) and this "
                f"kernel's package is {VERSION} (in {sys.prefix}); install one version in both "
                f"(`{skewed}/bin/pip install distributed-workbench=={VERSION}`), else the sidebar may "
                "misread the pools.")
    assert sentence in status.replace("\n", " "), status
    assert "workbench server extension: 0.0.9" in doctor, doctor
    assert "Version skew: the Jupyter server's workbench extension is 0.0.9" in doctor, doctor
