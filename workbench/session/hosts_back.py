"""Bringing lost ranks back off this machine: where each launcher can start their new engines.

- ssh: on the lost rank's host when it answers over ssh, else on another host of the pool's list (the
  line that says so goes to ``progress``); see :mod:`workbench.pool.ssh_places`.
- Slurm and MPI: one sentence that says why not, and what the ranks left can do.

>>> group = type("G", (), {"config": type("C", (), {"launcher": "mpi"})(), "ranks": [1, 2]})()
>>> where_to_start(group, [3], print)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: an MPI pool cannot start engines for lost ranks: mpiexec started every engine as one job ...
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.pool.rankmap import RankInfo


def where_to_start(group, lost: list[RankInfo], progress: Callable[[str], None]) -> dict[str, int] | None:
    """``{host: engines}`` for the new engines of ``lost`` (None: a local pool, on this machine), or a
    ValueError in one sentence where the pool's launcher cannot start them."""
    launcher, left = group.config.launcher, len(group.ranks)
    if launcher == "local":
        return None
    if launcher == "ssh":
        placement, notes = group.pool.place_replacements(lost, group.ranks)
        for note in notes:
            progress(note)
        return placement
    if launcher == "mpi":
        raise ValueError("an MPI pool cannot start engines for lost ranks: mpiexec started every engine as "
                         f"one job and cannot add to it. Go on with the {left} ranks left, or stop and start "
                         "the pool.")
    raise ValueError(f"a {launcher} pool cannot start engines for lost ranks yet (a new step inside the "
                     f"allocation is not done): go on with the {left} ranks left, or stop and start the "
                     "pool.")
