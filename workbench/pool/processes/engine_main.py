"""The engine's entry point: ipyparallel's own engine, with torch loading while it registers.

``import torch`` is most of an engine's start; ipyparallel's ``startup_command`` would run it only
after registration. Here a thread starts it first, so it overlaps the engine's own imports and its
registration round trip. Also, ipyparallel's MPI launcher always adds ``--mpi``, which makes the
engine import mpi4py (to take its MPI rank as engine id); torch.distributed does not need MPI, so
without mpi4py the flag is dropped.

Run as ``python -m workbench.pool.processes.engine_main [ipengine options]`` (the launchers do).
"""

from __future__ import annotations

import importlib.util
import sys
import threading


def engine_argv(argv: list[str], have_mpi4py: bool) -> list[str]:
    """The engine's arguments: ``--mpi`` kept only where mpi4py can serve it.

    >>> engine_argv(["x", "--mpi", "--log-level=20"], have_mpi4py=False)
    ['x', '--log-level=20']
    >>> engine_argv(["x", "--mpi"], have_mpi4py=True)
    ['x', '--mpi']
    """
    return list(argv) if have_mpi4py else [a for a in argv if a != "--mpi"]


if __name__ == "__main__":
    threading.Thread(target=__import__, args=("workbench.engine.rendezvous",), daemon=True).start()
    sys.argv = engine_argv(sys.argv, importlib.util.find_spec("mpi4py") is not None)
    from ipyparallel.engine.app import main

    from workbench.pool.processes import quiet

    quiet.pool_process()  # its sessions speak CurveZMQ: no "signing is disabled"
    main()
