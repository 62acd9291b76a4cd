"""A start whose engines are held up while they register (issue 25): it must still start.

On a loaded machine an engine can miss the controller's first heartbeats right after it registered
(ipyparallel counts an engine only once its heart answered a ping in time, and forgets a registration
whose heart it has not seen within its registration timeout). Here every engine is stopped with
SIGSTOP for a while as soon as it exists, then continued: the start goes on and every rank answers.
Process-tree diff: nothing of the pool is left afterwards.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from tests.conftest import alive, until
from workbench import Session
from workbench.pool.processes.zygote import NAMES

pytestmark = pytest.mark.timeout(240)

HOLD_S = 3.0  # 30 heartbeat rounds of the controller (100 ms), engines unable to answer any


def _engines() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name() == NAMES["engine"]:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _hold_engines(n: int, done: threading.Event, held: list[int]) -> None:
    """SIGSTOP each engine the moment it appears (all of them within HOLD_S), SIGCONT after HOLD_S."""
    stopped: dict[int, float] = {}
    deadline = time.monotonic() + 120
    while not done.is_set() and time.monotonic() < deadline:
        for p in _engines():
            if p.pid not in stopped and len(stopped) < n:
                os.kill(p.pid, signal.SIGSTOP)
                stopped[p.pid] = time.monotonic()
                held.append(p.pid)
        for pid, since in list(stopped.items()):
            if since and time.monotonic() - since > HOLD_S:
                os.kill(pid, signal.SIGCONT)
                stopped[pid] = 0.0
        if len(stopped) == n and not any(stopped.values()):
            return
        time.sleep(0.005)
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_start_survives_engines_that_miss_heartbeats_while_registering():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    n = 4
    done, held = threading.Event(), []
    holder = threading.Thread(target=_hold_engines, args=(n, done, held), daemon=True)
    holder.start()
    s = Session(n=n, timeout=90)
    try:
        s.start()
        done.set()
        holder.join(10)
        assert len(held) == n, f"only {len(held)} of {n} engines were held up"
        s.run("x = rank")
        assert s.pull("x") == list(range(n))
        pids = s.pids()
    finally:
        done.set()
        s.stop()
    assert until(lambda: alive(pids) == [], 10), f"processes of the pool survived stop: {alive(pids)}"
    left = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert alive(left) == [], f"processes left after the test: {left}"
