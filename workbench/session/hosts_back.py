"""Bringing lost ranks back off this machine: where each launcher can start their new engines.

- ssh: on the lost rank's host when it answers over ssh, else on another host of the pool's list (the
  line that says so goes to ``progress``); see :mod:`workbench.pool.ssh_places`.
- Slurm: a new step of the lost rank's job on its node, while the job still holds it (else one sentence
  that says so, and what the ranks left can do); see :mod:`workbench.pool.slurm_steps`.
- MPI: one sentence: mpiexec cannot add a process to a running world; go on with the ranks left, or
  stop and start the pool.

>>> from workbench.pool.rankmap import RankInfo
>>> ranks = [RankInfo(i, i, 0, "n1", 100 + i, "cpu", i) for i in range(3)]
>>> group = type("G", (), {"config": type("C", (), {"launcher": "mpi"})(), "ranks": ranks})()
>>> where_to_start(group, ranks[2:], print)
Traceback (most recent call last):
...
ValueError: an MPI pool cannot start engines for lost ranks: mpiexec started every engine as one job and \
cannot add a process to it; go on with the 2 ranks left (`%dist scale 2`), or stop and start the pool.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.pool import slurm_steps
from workbench.pool.rankmap import RankInfo


def where_to_start(group, lost: list[RankInfo], progress: Callable[[str], None]) -> dict[str, int] | None:
    """``{host: engines}`` for the new engines of ``lost`` (None: a local pool, on this machine; Slurm:
    ``{(job, node): engines}``), or a ValueError in one sentence where the pool's launcher cannot start
    them."""
    launcher = group.config.launcher
    gone = {r.engine_id for r in lost}
    left = sum(1 for r in group.ranks if r.engine_id not in gone)
    if launcher == "local":
        return None
    if launcher == "ssh":
        placement, notes = group.pool.place_replacements(lost, group.ranks)
        for note in notes:
            progress(note)
        return placement
    if launcher == "slurm":
        return slurm_steps.place(lost, left)
    raise ValueError("an MPI pool cannot start engines for lost ranks: mpiexec started every engine as one "
                     f"job and cannot add a process to it; {slurm_steps.go_on(left)}")
