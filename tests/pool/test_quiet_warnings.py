"""No warning that is wrong where people look first (issue 40, point 7).

The pool's controller speaks CurveZMQ, so jupyter_client's "Message signing is disabled. This is insecure"
is wrong for its sessions: it filled the top of an ssh failure card (the pool log's last lines), the output
of ``workbench demo`` and a Jupyter server's log (16 times). ``workbench demo``'s kernel said "Kernel is
running over TCP without encryption": it listens on unix sockets now, so that is not so any more. Each
test failed before: the lines were there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import PidsLimit, until

pytestmark = [pytest.mark.slow]

SIGNING = "Message signing is disabled"
TCP = "running over TCP without encryption"

# a pool, a second client of it (what the Jupyter server's probe and an attached notebook make), its stop;
# then a session of the person's own without a key, where the warning is true and still said
POOL = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from workbench import Session
    from workbench.pool.cluster import EnginePool
    s = Session(n=2).start()
    s.run("x = rank")
    other = EnginePool.attach(s.pool_id)
    other.close()
    print("LOG", s.pool.log_file, flush=True)
    s.stop()
    from jupyter_client.session import Session as Unsigned
    Unsigned(key=b"")
""")


@pytest.mark.timeout(180)
def test_a_pool_and_its_clients_say_nothing_of_signing(tmp_path):
    env = dict(os.environ, WORKBENCH_STATE_DIR=str(tmp_path / "state"))
    with PidsLimit(2000) as group:
        done = subprocess.run([sys.executable, "-c", POOL], capture_output=True, text=True, env=env,
                              timeout=150)
        assert until(lambda: group.pids() == [], timeout=15), group.pids()
    assert done.returncode == 0, done.stderr[-3000:]
    log = next(line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("LOG "))
    text = open(log).read()
    assert "[IPController]" in text and "Engine" in text, text[-2000:]  # the controller's and engines' lines
    assert SIGNING not in text, text
    # the kernel-side clients (start, attach) said nothing; the person's own unsigned session still does
    assert done.stderr.count(SIGNING) == 1, done.stderr[-3000:]


@pytest.mark.timeout(180)
def test_a_failed_ssh_start_shows_what_ssh_said_and_nothing_of_signing(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text('#!/bin/sh\necho "ssh: Could not resolve hostname nohost7 (a test)" >&2\n'
                              "exit 255\n")
    (fake / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(tmp_path / "state"))
    from workbench import Session
    from workbench.errors import PoolStartError
    from workbench.server.panel_words import problem

    with pytest.raises(PoolStartError) as failed:
        Session(n=2, launcher="ssh", hosts="nohost7", interface="lo", timeout=30).start()
    card = problem(failed.value)  # what the card shows
    assert card["tail"] == ["ssh: Could not resolve hostname nohost7 (a test)"], card
    assert SIGNING not in open(card["log"]).read()


@pytest.mark.timeout(300)
def test_workbench_demo_says_neither_warning(tmp_path):
    env = dict(os.environ, WORKBENCH_STATE_DIR=str(tmp_path / "state"))
    with PidsLimit(4000) as group:
        done = subprocess.run([sys.executable, "-m", "workbench.demo", "--out", "out"], cwd=tmp_path,
                              capture_output=True, text=True, env=env, timeout=280)
        assert until(lambda: group.pids() == [], timeout=15), group.pids()
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown[-3000:]
    assert "summary: ranks 2" in done.stdout, shown[-3000:]
    assert SIGNING not in shown and TCP not in shown, shown[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "state"]  # no socket files left here
