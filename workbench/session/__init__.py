"""The kernel side of a pool: :class:`Session` (the joint) and its rooms.

- :mod:`.session`: :class:`Session`, wiring the rooms for a started or an attached pool; push, pull,
  apply; :func:`current`, the only way the magics find it.
- :mod:`.group`: the process group seen from the kernel (describe, store, join, re-form, abort).
- :mod:`.health`: dead ranks (pushed by a watcher), beacons, the fault log.
- :mod:`.cell`: one cell on its ranks (output relay, escalation ladder, background handles).
- :mod:`.results`: what a cell produced per rank.

Doors go one way: session -> cell -> group, health -> :mod:`workbench.pool`; no room imports the
session.
"""

from workbench.pool.rankmap import format_ranks
from workbench.session.cell_run import RunHandle
from workbench.session.results import CellResult, RankDied, RankResult
from workbench.session.session import Session, current, current_or_none, running_pools, use

__all__ = ["CellResult", "RankDied", "RankResult", "RunHandle", "Session", "current", "current_or_none",
           "format_ranks", "running_pools", "use"]
