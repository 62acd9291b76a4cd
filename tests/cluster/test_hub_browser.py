"""A real hub, end to end (issue 37 part 3): JupyterHub with batchspawner's SlurmSpawner on the two-node
Slurm, configured by docs/jupyterhub_config.py, its proxy from npm.

Chromium logs in through the hub's login page; the hub spawns the single-user server as a Slurm job (its
batch script on n1, holding n1 and n2); in a notebook there a pool starts (`-n 2`: part of the job, its
engines a step of the job on its first node, issue 37 part 1), trains with the live dashboard in the cell, the
sidebar's card shows it, its Stacks and its docked dashboard open; `%dist stop` ends it; no step of the job
is left. The hub's "Stop My Server" ends the job, and nothing is left on any node.
Screenshots under build/ui/: hub-live-dashboard.png, hub-card-and-docked-dashboard.png.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.cluster import hub as hubs
from tests.cluster import infra
from tests.cluster.hub_browser import WHERE
from tests.conftest import until
from tests.ui.lab import needs_chromium
from tests.ui.test_dashboard_browser import SETUP, TRAIN

SHOTS = infra.REPO / "build" / "ui"
pytestmark = [pytest.mark.slow, needs_chromium]


@pytest.fixture
def hub_ok():
    reason = hubs.why_no_hub()
    if reason:
        pytest.skip(reason)


def notebook() -> dict:
    cells = ("%load_ext workbench", "%dist start -n 2", SETUP, WHERE, TRAIN, "%dist stop")
    return {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                       "source": src} for src in cells],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                        "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


@pytest.mark.timeout(600)
def test_hub_spawns_the_server_as_a_slurm_job_and_the_workbench_works_there(hub_ok, slurm_two, workdir):
    SHOTS.mkdir(parents=True, exist_ok=True)
    hub = hubs.Hub(slurm_two, workdir / "hub", {"train.ipynb": notebook()}).start()
    try:
        spec = {"hub": hub.url, "user": "root", "notebook": "train.ipynb", "shots": str(SHOTS),
                "profile": str(workdir / "chromium-profile")}
        out = workdir / "hub-browser.json"
        cmd = [sys.executable, str(infra.REPO / "tests" / "cluster" / "hub_browser.py"), json.dumps(spec),
               str(out)]
        env = {**os.environ, **slurm_two.env, "PYTHONPATH": str(infra.REPO)}
        with open(workdir / "hub-browser.log", "wb") as log:
            proc = subprocess.Popen(slurm_two.head.argv(cmd), stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, stdin=subprocess.DEVNULL)
            try:
                proc.wait(480)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
                pytest.fail(f"the browser ran past 480 s:\n{hub.log_tail()}")
        assert out.exists(), (workdir / "hub-browser.log").read_text()[-4000:]
        seen = json.loads(out.read_text())
        assert "error" not in seen, f"{seen['error']}\n--- hub log\n{hub.log_tail()}"
        print(f"hub: login to JupyterLab {seen['login_to_lab_s']:.1f} s (the server's Slurm job started and "
              f"answered); Stop My Server {seen['hub_stop_s']:.1f} s")

        # the server is a Slurm job on n1 holding both nodes; the pool's engines are a step of that job on n1
        [job_line] = seen["job_at_login"].splitlines()
        job, state, nodes, nodelist = job_line.split()
        assert (state, nodes, nodelist) == ("RUNNING", "2", "n[1-2]"), job_line
        assert [w[:3] for w in seen["where"]] == [["0", "n1", job], ["1", "n1", job]], seen["where"]
        assert all(w[3].isdigit() for w in seen["where"]), seen["where"]  # a numbered step, not the batch
        assert "2 ranks" in seen["start_cell"], seen["start_cell"]
        assert "running" in seen["card"].lower(), seen["card"]
        assert "stacks of 2 ranks" in seen["stacks"]
        assert "stopped pool" in seen["stop_cell"] and "no process of it is left" in seen["stop_cell"]
        # no step of the pool left after %dist stop
        assert [s for s in seen["steps_after_stop"].split() if s.split(".")[-1].isdigit()] == [], \
            seen["steps_after_stop"]
        print(f"hub: the pool's step left squeue {seen['steps_gone_s']:.1f} s after %dist stop")
        assert seen["page_errors"] == [], seen["page_errors"]

        # Stop My Server: the hub cancelled the job; nothing of the server or its kernel is left
        assert until(lambda: slurm_two.squeue() == [], 60), slurm_two.squeue()
        assert until(lambda: slurm_two.left(keep=hub.pids()) == [], 30), slurm_two.left(keep=hub.pids())
        code, user = hub.api("GET", "users/root")
        assert code == 200 and user["servers"] == {}, user
    finally:
        hub.stop()
    assert "Cancelling job" in hub.log_tail(20_000)

