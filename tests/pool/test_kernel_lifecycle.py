"""After kernel shutdown, restart and SIGKILL, no process of the pool (or of its spare) is left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

from tests.conftest import alive, until

pytestmark = pytest.mark.timeout(120)

START = """
%load_ext workbench
%dist start -n 2 --timeout 60
import json, sys, workbench
print("PIDS", json.dumps(workbench.current().pids()))
print("TORCH", "torch" in sys.modules)
print("POOL", workbench.current().pool_id)
workbench.current().run("x = 1")  # a cell on the ranks: the pool's cell lock exists now
"""


def start_pool_in_kernel():
    km, kc = start_new_kernel(kernel_name="python3")
    out = []
    reply = kc.execute_interactive(START, timeout=90,
                                   output_hook=lambda m: out.append(m["content"].get("text", "")))
    text = "".join(out)
    assert reply["content"]["status"] == "ok", text
    pids = json.loads(text.split("PIDS", 1)[1].splitlines()[0])
    assert len(alive(pids)) == 5  # the zygote, the controller and 2 engines forked from it, the lease
    pids += [c.pid for p in pids for c in psutil.Process(p).children(recursive=True)]  # the controller's
    return km, kc, pids, text


def zygotes_of(pid: int) -> list[psutil.Process]:
    """The kernel's zygotes; a child that ends while they are listed (the last pool's) is none of them."""
    out = []
    for child in psutil.Process(pid).children():
        try:
            if child.name() == "wb-zygote":
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def children_seen(pid: int) -> str:
    """The kernel's children as ps shows them: what a failed wait for a spare prints."""
    rows = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            rows.append(f"{child.pid} {child.name()} {child.status()} {' '.join(child.cmdline())[:80]} "
                        f"started {time.time() - child.create_time():.1f} s ago")
    return "; ".join(rows) or "none"


ASK_SPARE = """
from workbench.pool.processes import spare
from workbench.pool.records import state
z = spare.waiting()
print("none waiting" if z is None else
      f"pid {z.pid}, exit code {z.proc.poll()}, log: {state.log_path(z.pool_id).read_text()[-2000:]!r}")
"""


def one_spare(kc, kernel: int) -> psutil.Process:
    """The kernel's one zygote, once its interpreter runs and names it (else why not, in the failure)."""
    if not until(lambda: len(zygotes_of(kernel)) == 1, timeout=60):
        out = []
        kc.execute_interactive(ASK_SPARE, timeout=30,
                               output_hook=lambda m: out.append(m["content"].get("text", "")))
        pytest.fail(f"no single spare after 60 s; the kernel's children: {children_seen(kernel)}; "
                    f"the kernel's spare: {''.join(out).strip()}")
    [zygote] = zygotes_of(kernel)
    return zygote


def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def test_kernel_shutdown_ends_the_pool():
    km, kc, pids, _ = start_pool_in_kernel()
    kc.stop_channels()
    km.shutdown_kernel(now=False)
    assert wait_gone(pids, 15) == []


def test_kernel_restart_ends_the_pool():
    km, kc, pids, _ = start_pool_in_kernel()
    try:
        km.restart_kernel(now=False)
        assert wait_gone(pids, 15) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_kernel_sigkill_ends_the_pool_through_the_lease():
    from workbench.pool.records import sharing, state

    km, kc, pids, text = start_pool_in_kernel()
    assert "TORCH False" in text, "the kernel imported torch to start a pool"
    pool_id = text.split("POOL ", 1)[1].split()[0]
    left = [state.state_dir() / f"pool-{pool_id}.{what}" for what in ("json", "clients", "lock")]
    assert all(p.exists() for p in left), left  # its state, the kernel's record as its driver, its cell lock
    kernel_pid = km.provisioner.process.pid
    kc.stop_channels()
    os.kill(kernel_pid, signal.SIGKILL)
    try:
        assert wait_gone(pids, 30) == []
        # nothing of the pool is left in the runtime folder, and a notebook still attached hears why
        assert until(lambda: not any(p.exists() for p in left), timeout=10), [p for p in left if p.exists()]
        assert sharing.stopped(pool_id)["by"] == "its owner's exit"
    finally:
        km.shutdown_kernel(now=True)
        for pid in alive(pids):  # only if the assertion above failed: never leave them running
            os.kill(pid, signal.SIGKILL)


def test_a_pool_takes_the_spare_started_at_load_ext_and_sigkill_ends_a_spare():
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        assert kc.execute_interactive("%load_ext workbench", timeout=60)["content"]["status"] == "ok"
        kernel = km.provisioner.process.pid
        spare = one_spare(kc, kernel)
        out = []
        reply = kc.execute_interactive(
            "%dist start -n 2 --timeout 60\nimport workbench\n"
            "print('ZYGOTE', workbench.current().pool.zygote.pid)",
            timeout=90, output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", "".join(out)
        assert f"ZYGOTE {spare.pid}" in "".join(out)  # the pool's processes are forks of the spare
        reply = kc.execute_interactive("%dist stop\n%reload_ext workbench", timeout=60)
        assert reply["content"]["status"] == "ok"
        assert not spare.is_running() or spare.status() == psutil.STATUS_ZOMBIE
        # a new spare, waiting for the next pool
        second = one_spare(kc, kernel)
        kc.stop_channels()
        os.kill(kernel, signal.SIGKILL)
        assert wait_gone([second.pid], 15) == [], "an unclaimed spare outlived its kernel"
    finally:
        km.shutdown_kernel(now=True)
