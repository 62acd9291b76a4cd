"""After kernel shutdown, restart and SIGKILL, no process of the pool is left."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from jupyter_client.manager import start_new_kernel

from tests.conftest import alive

pytestmark = pytest.mark.timeout(120)

START = """
%load_ext workbench
%dist start -n 2 --timeout 60
import json, workbench
print("PIDS", json.dumps(workbench.current().pids()))
"""


def start_pool_in_kernel():
    km, kc = start_new_kernel(kernel_name="python3")
    out = []
    reply = kc.execute_interactive(START, timeout=90,
                                   output_hook=lambda m: out.append(m["content"].get("text", "")))
    text = "".join(out)
    assert reply["content"]["status"] == "ok", text
    pids = json.loads(text.split("PIDS", 1)[1].splitlines()[0])
    assert len(alive(pids)) == 4  # controller, 2 engines, lease
    return km, kc, pids


def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def test_kernel_shutdown_ends_the_pool():
    km, kc, pids = start_pool_in_kernel()
    kc.stop_channels()
    km.shutdown_kernel(now=False)
    assert wait_gone(pids, 15) == []


def test_kernel_restart_ends_the_pool():
    km, kc, pids = start_pool_in_kernel()
    try:
        km.restart_kernel(now=False)
        assert wait_gone(pids, 15) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_kernel_sigkill_ends_the_pool_through_the_lease():
    km, kc, pids = start_pool_in_kernel()
    kernel_pid = km.provisioner.process.pid
    kc.stop_channels()
    os.kill(kernel_pid, signal.SIGKILL)
    try:
        assert wait_gone(pids, 30) == []
    finally:
        km.shutdown_kernel(now=True)
        for pid in alive(pids):  # only if the assertion above failed: never leave them running
            os.kill(pid, signal.SIGKILL)
