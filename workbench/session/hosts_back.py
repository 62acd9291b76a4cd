"""Bringing lost ranks back off this machine: the pool's launcher says where their new engines start.

Each launcher object has the answer (:meth:`workbench.pool.launch.base.Launcher.where_to_start`): ssh on the
lost rank's host when it answers, else on another host of the list; Slurm a new step of the rank's job on
its node while the job holds it; MPI one sentence saying it cannot; local anywhere on this machine.
:mod:`workbench.session.recovery` asks here; once it asks ``group.pool.launcher`` itself, this room goes.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.pool.rankmap import RankInfo


def where_to_start(group, lost: list[RankInfo], progress: Callable[[str], None]) -> dict | None:
    """``{host: engines}`` for the new engines of ``lost`` (None: a local pool, on this machine; Slurm:
    ``{(job, node): engines}``), or a ValueError in one sentence where the pool's launcher cannot start
    them."""
    return group.pool.launcher.where_to_start(group.pool, lost, group.ranks, progress)
