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
