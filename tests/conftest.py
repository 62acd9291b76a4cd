"""Shared fixtures: a real IPython shell with the magics, a real 2-engine pool."""

from __future__ import annotations

import psutil
import pytest


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (zombies do not count: their memory is gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="session")
def ipshell():
    """The IPython shell the magics run in, with ``%load_ext workbench`` done."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()  # start_ipython() returns None once another test has started the shell
    ip.run_line_magic("load_ext", "workbench")
    return ip


def until(predicate, timeout: float = 10.0, every: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (a hard bound, never a speed check)."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


@pytest.fixture
def channel():
    """A pool's side channel without a pool: a real relay and its key, as ``EnginePool`` records them."""
    from workbench import wire
    from workbench.pool.relay import Relay

    key = wire.new_key()
    relay = Relay("127.0.0.1", key)
    yield {"up": relay.up, "out": relay.out, "key": key, "relay": relay}
    relay.close()
