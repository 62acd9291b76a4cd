"""``workbench pools`` and ``workbench stop`` from a terminal: a pool started in one process (a
notebook's kernel stands in: it names its notebook the way Jupyter does), listed and stopped by the CLI
from other processes. Nothing of the pool is left, nothing lands in the folder the CLI ran in.

The state folder is this test's own (``WORKBENCH_STATE_DIR``): the CLI never sees, nor stops, the
pools of anyone else on the machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PidsLimit, alive, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]

# Starts a pool, says which, then waits for a line on stdin and prints what the notebook would be told.
OWNER = """
import json, sys
from workbench import Session
from workbench.pool.records import sharing
s = Session(n=2, timeout=90).start()
print("POOL", json.dumps({"id": s.pool_id, "name": s.name, "pids": s.pids()}), flush=True)
sys.stdin.readline()
print("TOLD", sharing.describe_stop(s.pool_id, s.name), flush=True)
"""


def _env(state_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JPY_SESSION_NAME"}
    env.update(WORKBENCH_STATE_DIR=str(state_dir), PYTHONPATH=str(ROOT), WORKBENCH_PREWARM="0")
    return env


def cli(*args: str, env: dict, cwd: Path, stdin=subprocess.DEVNULL, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], env=env, cwd=cwd, stdin=stdin,
                          capture_output=True, text=True, timeout=timeout)


def cli_on_a_tty(args: list[str], answer: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI with a terminal as its stdin (a pty), the person's ``answer`` typed ahead."""
    main, tty = os.openpty()
    try:
        os.write(main, answer.encode())
        return cli(*args, env=env, cwd=cwd, stdin=tty)
    finally:
        os.close(tty)
        os.close(main)


def start_owner(env: dict, cwd: Path) -> tuple[subprocess.Popen, dict]:
    """A process that starts a 2-rank pool as the notebook ``train.ipynb``."""
    proc = subprocess.Popen([sys.executable, "-c", OWNER], env={**env, "JPY_SESSION_NAME": "train.ipynb"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=cwd)
    line = proc.stdout.readline()
    if not line.startswith("POOL "):
        proc.kill()
        proc.wait(timeout=30)
        pytest.fail(f"the pool did not start: {line!r}")
    return proc, json.loads(line.split(" ", 1)[1])


def test_cli_lists_and_stops_a_pool_another_process_started(tmp_path):
    here = tmp_path / "here"  # where the CLI runs: it stays empty
    here.mkdir()
    env = _env(tmp_path / "state")
    with PidsLimit(4000) as group:  # every process this test starts, orphans included
        assert group.pids() == []
        proc, pool = start_owner(env, tmp_path)
        try:
            _list_refuse_stop(proc, pool, env, here)
            # the notebook that started it hears who stopped it
            proc.stdin.write("\n")
            proc.stdin.flush()
            told = proc.stdout.readline()
            assert "was stopped (by `workbench stop` in a terminal" in told, told
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert until(lambda: group.pids() == [], timeout=15), f"left running: {group.pids()}"
    assert list(here.iterdir()) == [], "the CLI left files in the folder it ran in"


def _list_refuse_stop(proc: subprocess.Popen, pool: dict, env: dict, here: Path) -> None:
    assert len(alive(pool["pids"])) == len(pool["pids"]) >= 4  # zygote, controller, 2 engines, lease
    listed = cli("pools", env=env, cwd=here)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == ["name", "id", "launcher", "ranks", "where", "state", "slurm", "owner",
                              "notebooks", "age", "log"]
    # "slurm": the Slurm job it runs in and its time left (issue 37), "-" for a local pool
    assert row.split()[:7] == [pool["name"], pool["id"], "local", "2/2", socket.gethostname(), "running",
                               "-"], row
    assert f"train.ipynb (pid {proc.pid})" in row and f"pool-{pool['id']}.log" in row
    as_json = json.loads(cli("pools", "--json", env=env, cwd=here).stdout)
    assert [p["id"] for p in as_json] == [pool["id"]]
    assert as_json[0]["drivers"] == [{"notebook": "train.ipynb", "role": "started", "pid": proc.pid}]

    # the sidebar's "Stacks", from a terminal (issue 37 part 6: every sidebar action has a CLI or magic twin)
    found = cli("stacks", pool["name"], env=env, cwd=here)
    assert found.returncode == 0, found.stderr
    assert "stacks of 2 ranks in 1 group" in found.stdout, found.stdout

    # no terminal to ask and no --yes: nothing is stopped, and it says who is attached
    refused = cli("stop", pool["name"], env=env, cwd=here)
    assert refused.returncode == 1
    assert f"train.ipynb (started it, pid {proc.pid}) is attached" in refused.stderr
    assert "add --yes" in refused.stderr and alive(pool["pids"]) == pool["pids"]
    # on a terminal it asks, saying who is attached; "n" keeps the pool
    asked = cli_on_a_tty(["stop", pool["name"]], "n\n", env=env, cwd=here)
    assert asked.returncode == 0, asked.stderr
    assert f"stop pool {pool['name']} ({pool['id']}, local, 2/2 ranks)? train.ipynb (started it, pid " \
           f"{proc.pid}) is attached. [y/N] kept pool {pool['name']}" in asked.stdout, asked.stdout
    assert alive(pool["pids"]) == pool["pids"]
    unknown = cli("stop", "pool-no-such", env=env, cwd=here)
    assert unknown.returncode == 1 and f"running pools: {pool['name']} ({pool['id']})" in unknown.stderr

    stopped = cli("stop", pool["id"][:4], "--yes", env=env, cwd=here)
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped pool {pool['name']} ({pool['id']}, local, 2/2 ranks)" in stopped.stdout
    assert "ended from its state file" not in stopped.stdout  # the panel's way: attached, then stopped
    assert until(lambda: alive(pool["pids"]) == [], timeout=15), alive(pool["pids"])
    assert "no pool of this user runs" in cli("pools", env=env, cwd=here).stdout
