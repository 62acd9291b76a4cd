"""``--launcher mpi``: ``mpiexec -n N`` starts every engine at once, optionally over ``--hosts``.

ipyparallel's MPI engine-set launcher (:class:`~workbench.pool.launch.spawn.PoolMPIEngineSetLauncher`) runs
our engine entry point (:mod:`workbench.pool.processes.engine_main`, which drops the ``--mpi`` it always
passes where mpi4py is missing) with ``--host a:k,b:k`` for the hosts. One launch for the whole set: mpiexec
cannot add a process to a running world, so no engine joins a running MPI pool (restart, scale up and
replacement are refused in one sentence).

>>> from workbench.config import PoolConfig
>>> launcher = MPI(PoolConfig(launcher="mpi", hosts="a,b"))
>>> launcher.engine_set_kwargs(4, work_dir="/tmp/x", env={}, engine_args=[])["mpi_args"]
['--host', 'a:2,b:2']
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.pool.launch.base import ENGINE_MAIN, Launcher, Pool, go_on, ranks_left, spread
from workbench.pool.launch.spawn import PoolMPIEngineSetLauncher


class MPI(Launcher):
    """Engines as the processes of one ``mpiexec``."""

    name = "mpi"
    engine_set = PoolMPIEngineSetLauncher
    can_add_engines = False
    cannot_add = ("an MPI pool cannot start an engine by itself (mpiexec cannot add a process to a running "
                  "world)")

    def traits(self, n: int, *, work_dir: str, env: dict[str, str], log: str) -> dict:
        """mpiexec's output is the pool's log; our entry point starts importing torch before the engine
        registers; ``--host a:k,b:k`` spreads the engines over the hosts."""
        hosts = spread(n, list(self.config.hosts)) if self.config.hosts else {}
        mpi_args = ["--host", ",".join(f"{h}:{k}" for h, k in hosts.items())] if hosts else []
        return {**({"output_file": log} if log else {}), "engine_cmd": list(ENGINE_MAIN),
                "mpi_args": mpi_args}

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """Open MPI refuses root without these (MPICH ignores them).

        >>> from workbench.config import PoolConfig
        >>> MPI(PoolConfig(launcher="mpi")).environment({})["OMPI_ALLOW_RUN_AS_ROOT"]
        '1'
        """
        return {**env, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

    def where_to_start(self, pool: Pool | None, lost: list, ranks: list,
                       progress: Callable[[str], None]) -> dict | None:
        """Never: one sentence that says why, and what the ranks left can do.

        >>> from workbench.config import PoolConfig
        >>> from workbench.pool.rankmap import RankInfo
        >>> ranks = [RankInfo(i, i, 0, "n1", 100 + i, "cpu", i) for i in range(3)]
        >>> MPI(PoolConfig(launcher="mpi")).where_to_start(None, ranks[2:], ranks, print)
        Traceback (most recent call last):
        ...
        ValueError: an MPI pool cannot start engines for lost ranks: mpiexec started every engine as one job \
and cannot add a process to it; go on with the 2 ranks left (`%dist scale 2`), or stop and start the pool.
        """
        raise ValueError("an MPI pool cannot start engines for lost ranks: mpiexec started every engine as "
                         f"one job and cannot add a process to it; {go_on(ranks_left(lost, ranks))}")

    def engines_exited(self, dead: int, n: int) -> str:
        return "mpiexec ended while starting the engines"  # one launch for the whole set
