"""A pool that outlives its kernel (issue 28): ``%dist start --keep`` in a real kernel of a real Jupyter
server (JupyterLab in its own process, its kernels started through its REST API) hands the pool to the
server; after a real kernel restart ``%dist attach`` takes it back with its ranks' state and process
group; the idle release still ends it, and it stops with the server.
"""

from __future__ import annotations

import contextlib
import json
import os

import psutil
import pytest

from tests.conftest import alive, until
from tests.ui.lab import Notebook, rest, run_lab

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _tree() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _listens(pid: int, url: str) -> bool:
    """Whether process ``pid`` has a socket bound to ``url`` (``ipc://PATH`` or ``tcp://HOST:PORT``)."""
    kind, _, where = url.partition("://")
    if kind == "ipc":
        return any(c.laddr == where for c in psutil.Process(pid).net_connections(kind="unix"))
    port = int(where.rsplit(":", 1)[1])
    return any(c.laddr and c.laddr.port == port for c in psutil.Process(pid).net_connections(kind="tcp"))


def pool_processes(nb: Notebook) -> list[int]:
    """Every process of the kernel's pool (controller, engines, zygote, lease) and the controller's."""
    pids = nb.value("import json, workbench; print('VALUE', json.dumps(workbench.current().pids()))")
    return pids + [c.pid for p in pids if psutil.pid_exists(p) for c in psutil.Process(p).children(True)]


def _cmdline(pid: int) -> list[str]:
    """A process's command line; [] for one that exited meanwhile (a zombie not reaped yet has none)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


@contextlib.contextmanager
def kept_pool(tmp_path, options: str = ""):
    """A JupyterLab server, a notebook of it, and a 2-rank pool the notebook kept: ``(lab, notebook, pids
    of the pool, pid of the server)``. Once the server stopped, no process of the pool is left (orphans
    too: they would have left this process's tree), nor any other process this test started."""
    before, pids = _tree(), []
    with run_lab(tmp_path, {}, start_s=240) as lab:
        [server] = [p for p in _tree() - before if "jupyterlab" in _cmdline(p)]
        nb = Notebook(lab, tmp_path)
        try:
            out = nb.run(f"%load_ext workbench\n%dist start -n 2 --timeout 90 --keep {options}")
            assert "kept by the Jupyter server" in out, out
            pids = pool_processes(nb)
            yield lab, nb, pids, server
        finally:
            nb.close()
    assert until(lambda: not alive(pids), timeout=30), f"left running: {alive(pids)}"
    left = [p for p in _tree() - before if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert left == []


def test_a_kept_pool_outlives_a_kernel_restart_and_stops_with_the_server(tmp_path):
    with kept_pool(tmp_path) as (lab, nb, pids, server_pid):
        kernel_pid = nb.pid()
        nb.run("import workbench\ns = workbench.current()\n"
               "s.run('import torch\\nmarker = 40 + rank\\nweights = torch.full((2,), float(rank))')")
        assert len(alive(pids)) >= 5, pids  # the zygote, the controller, 2 engines, the lease
        # the server owns the pool: none of its processes is the kernel's
        kernel_tree = {kernel_pid, *(c.pid for c in psutil.Process(kernel_pid).children(True))}
        assert not kernel_tree & set(pids)
        [card] = rest(lab, "GET", "workbench/pools")["pools"]
        assert card["kept"] is True and card["owner"] == {"kind": "server", "label": "kept by the server"}
        assert {n["role"] for n in card["notebooks"]} == {"started", "attached"}  # the server, the kernel

        nb.restart()
        assert nb.pid() != kernel_pid
        assert set(alive(pids)) == set(pids)  # not one process of the pool ended
        out = nb.run("%load_ext workbench\n%dist attach")
        assert f"attached to pool {card['name']}" in out, out
        got = nb.value(
            "import json, workbench\ns = workbench.current()\n"
            "s.run('t = weights.clone() + 1\\ndist.all_reduce(t)\\ntotal = t.tolist()')\n"
            "print('VALUE', json.dumps([s.pull('marker'), s.pull('total')]))")
        assert got == [[40, 41], [[3.0, 3.0], [3.0, 3.0]]]  # the state from before; a collective works
        state = rest(lab, "GET", f"workbench/pools/{card['id']}")["pool"]
        assert state["id"] == card["id"] and state["state"] == "running"
        assert psutil.Process(server_pid).is_running()
    # the server is gone (kept_pool: every process of the pool went with it), and the pool's state file
    assert not (tmp_path / "pool-state" / f"pool-{card['id']}.json").exists()


def test_the_idle_release_ends_a_kept_pool_that_cells_from_the_kernel_kept_busy(tmp_path):
    with kept_pool(tmp_path, "--idle-release 4") as (lab, nb, pids, _):
        # a cell of the kernel that runs longer than the idle release: the server hears it is in use
        # (had its timer fired, the ranks would have been ended under the cell)
        out = nb.run("%%distributed\nimport time\ntime.sleep(7)\nprint('slept', rank)")
        assert "slept 0" in out and "slept 1" in out and "Error" not in out, out
        # then nobody uses it: the server's idle release stops it
        assert until(lambda: not alive(pids), timeout=60), f"left running: {alive(pids)}"
        out = nb.run("%%distributed\nprint(rank)")
        assert "was stopped (by its idle release" in out, out
        assert rest(lab, "GET", "workbench/pools")["pools"] == []


def test_stop_all_from_the_notebook_has_the_server_stop_its_kept_pool(tmp_path):
    with kept_pool(tmp_path) as (lab, nb, pids, server_pid):
        [card] = rest(lab, "GET", "workbench/pools")["pools"]
        state = json.loads((tmp_path / "pool-state" / f"pool-{card['id']}.json").read_text())
        assert _listens(server_pid, state["channel"]["up"])  # the side channel lives in the server
        out = nb.run("%dist stop")
        assert "the Jupyter server keeps it" in out and set(alive(pids)) == set(pids), out
        out = nb.run("%dist attach\n%dist stop --all")
        assert f"stopped pool {card['name']} (2 ranks)" in out, out
        assert alive(pids) == []
        assert rest(lab, "GET", "workbench/pools")["pools"] == []
        note = json.loads((tmp_path / "pool-state" / f"pool-{card['id']}.stopped.json").read_text())
        assert note["by"] == "keep.ipynb"  # who stopped it, not "the JupyterLab panel"
        # the server stopped it itself: its session of the pool closed, the side channel with it
        assert not _listens(server_pid, state["channel"]["up"])


@pytest.mark.timeout(60)
def test_keep_outside_a_jupyter_server_says_why_and_starts_nothing(ipshell, monkeypatch, tmp_path):
    from IPython.core.error import UsageError

    monkeypatch.delenv("JPY_PARENT_PID", raising=False)
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path / "pool-state"))
    before, cwd = _tree(), sorted(os.listdir())
    with pytest.raises(UsageError) as err:
        ipshell.run_line_magic("dist", "start -n 2 --keep")
    message = str(err.value)
    assert message.startswith("cannot keep the pool: this kernel was not started by a Jupyter server")
    assert message.count(". ") == 0 and message.endswith("from the JupyterLab panel.")  # one sentence
    assert _tree() - before == set() and sorted(os.listdir()) == cwd
    assert not list((tmp_path / "pool-state").glob("pool-*"))
