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
    assert imported_by("workbench.pool.processes.lease") == []


KERNEL_SIDE = ["workbench.remote", "workbench.remote.door", "workbench.session.rooms", "workbench.magics",
               "workbench.session.recovery", "workbench.session.cell_elastic",
               "workbench.widgets.live_dashboard", "workbench.widgets.cell_monitor", "workbench.preflight"]


@pytest.mark.parametrize("module", KERNEL_SIDE)
def test_what_the_kernel_imports_and_sends_the_engines_imports_no_torch(module):
    assert "torch" not in imported_by(module)


def test_workbench_pools_imports_no_notebook_machinery():
    """``workbench pools`` answers within a second (issue 40, point 10): it took 9-11 s under load because
    every subcommand imported nbformat (its schema validation alone took 4 s to import here)."""
    code = ("import sys\nfrom workbench import cli\ncli.build_parser()\n"
            "print(' '.join(m for m in ('nbformat', 'nbclient', 'jsonschema', 'torch', 'ipyparallel')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [], done.stdout


def test_workbench_pools_rows_import_no_launcher():
    """A row of ``workbench pools`` (and the server's pool list) says the Slurm job a pool runs in from its
    state file alone: reading it imports no launcher, so neither ipyparallel nor its zmq (0.2-0.3 s here)."""
    assert imported_by("workbench.pool.overview") == []

