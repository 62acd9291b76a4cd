"""Processes that need only a piece of the package import only that piece (issue 14: the start's cost)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)
HEAVY = ("ipyparallel", "IPython", "torch", "zmq")


def imported_by(module: str) -> list[str]:
    code = f"import sys, {module}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_the_lease_imports_neither_ipyparallel_nor_torch():
    assert imported_by("workbench.pool.lease") == []


KERNEL_SIDE = ["workbench.remote", "workbench.remote.door", "workbench.session.rooms", "workbench.magics",
               "workbench.session.recovery", "workbench.session.cell_elastic",
               "workbench.widgets.live_dashboard", "workbench.widgets.cell_monitor", "workbench.preflight"]


@pytest.mark.parametrize("module", KERNEL_SIDE)
def test_what_the_kernel_imports_and_sends_the_engines_imports_no_torch(module):
    assert "torch" not in imported_by(module)
