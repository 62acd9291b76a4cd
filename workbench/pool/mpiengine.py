"""``ipengine`` for ``mpiexec`` where mpi4py is not installed.

ipyparallel's MPI engine launcher always adds ``--mpi``, which makes the engine import mpi4py (to take its
MPI rank as engine id). torch.distributed does not need MPI, so without mpi4py this entry point drops the
flag and starts ipyparallel's own engine; with mpi4py it changes nothing.

Run as ``mpiexec -n 2 python -m workbench.pool.mpiengine --mpi ...`` (the launcher does).
"""

from __future__ import annotations

import importlib.util
import sys


def engine_argv(argv: list[str], have_mpi4py: bool) -> list[str]:
    """The engine's arguments: ``--mpi`` kept only where mpi4py can serve it.

    >>> engine_argv(["x", "--mpi", "--log-level=20"], have_mpi4py=False)
    ['x', '--log-level=20']
    >>> engine_argv(["x", "--mpi"], have_mpi4py=True)
    ['x', '--mpi']
    """
    return list(argv) if have_mpi4py else [a for a in argv if a != "--mpi"]


if __name__ == "__main__":
    sys.argv = engine_argv(sys.argv, importlib.util.find_spec("mpi4py") is not None)
    from ipyparallel.engine.app import main

    main()
