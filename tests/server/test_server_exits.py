"""A Jupyter server exits within 10 s of SIGTERM whatever its pools are doing (issue 40, point 2).

One server stopped 2 minutes late: a thread of the server extension sat in ipyparallel's
``Client.queue_status`` (which has no timeout) for a pool whose controller no longer answered, and the
interpreter's exit joined it. Here a real JupyterLab server (a process of its own) is sent SIGTERM while its
pool starts, runs, stops, after it stopped, after its controller was killed, and while its controller is
stopped (alive, silent: the old hang); the server must be gone within 10 s (a bound, not a speed figure) and
every process it started within 15 s more (its pool ends with it: stopped by the server, or by the lease).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import PidsLimit, until
from tests.ui.lab import rest, run_lab
from workbench.pool.records import state as pool_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXIT_S = 10.0


def _pool_states(lab) -> list:
    return [pool_state.read_state(p) for p in lab["state_dir"].glob("pool-*.json")]


def _quietly(fn, *args) -> None:
    """``fn(*args)``, its failure ignored (a request the server's exit cuts off)."""
    try:
        fn(*args)
    except OSError:
        pass


def _running(lab) -> dict:
    pools = rest(lab, "GET", "workbench/pools")["pools"]
    return pools[0] if pools and pools[0]["state"] == "running" else {}


def _controller(lab) -> int:
    [state] = [s for s in _pool_states(lab) if s is not None]
    return state.controller["pid"]


@pytest.mark.parametrize("moment", ["starting", "running", "stopping", "stopped", "controller killed",
                                    "controller silent"])
def test_sigterm_ends_the_server_within_10_s_whatever_its_pool_does(tmp_path, moment):
    with PidsLimit(600) as group, run_lab(tmp_path, {}) as lab:
        server: subprocess.Popen = lab["process"]
        rest(lab, "POST", "workbench/pools", {"n": 2})
        stopped = None
        if moment != "starting":
            assert until(lambda: bool(_running(lab)), 90), "the pool never ran"
        if moment == "stopping":
            pool_id = _running(lab)["id"]
            threading.Thread(target=_quietly, args=(rest, lab, "DELETE", f"workbench/pools/{pool_id}"),
                             daemon=True).start()
        elif moment == "stopped":
            rest(lab, "DELETE", f"workbench/pools/{_running(lab)['id']}")
        elif moment == "controller killed":
            os.kill(_controller(lab), signal.SIGKILL)
        elif moment == "controller silent":
            stopped = _controller(lab)
            os.kill(stopped, signal.SIGSTOP)
            rest(lab, "GET", "workbench/pools")  # the listing asks the silent controller
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            py_spy = str(Path(sys.executable).parent / "py-spy")
            stacks = subprocess.run([py_spy, "dump", "--pid", str(server.pid)], capture_output=True,
                                    text=True, timeout=60)
            pytest.fail(f"the server was still running {EXIT_S:g} s after SIGTERM ({moment}); its threads:\n"
                        f"{stacks.stdout[-6000:]}{stacks.stderr[-500:]}\nits log:\n"
                        + lab["log"].read_text()[-2000:])
        finally:
            if stopped is not None:
                try:
                    os.kill(stopped, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        left = until(lambda: group.pids() == [], 15)
        assert left, f"processes left after the server exited ({moment}): {group.pids()}"
