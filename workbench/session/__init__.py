"""The kernel side of a pool: :class:`Session` (the joint), its composition root and its rooms, one job each.

- :mod:`.session`: :class:`Session`: the registry (:func:`current`, :func:`use`, the only way the magics
  find it), the pool's life (start, attach, stop, detach, idle release) and the public verbs, each
  forwarded to the rooms.
- :mod:`.rooms`: :class:`~.rooms.Rooms`, the composition root: builds the rooms once for a started or an
  attached pool (the door, group, beacons, health, sharing, recovery, stacks, metrics, the transcript,
  folders), is handed whole to the cell and to recovery, and does what spans rooms (forming the group and
  keeping the others in step, the pool's turn, the checks before a cell, status, closing).
- :mod:`.rank_view`: :class:`~.rank_view.RankView`, a set of ranks that pushes, pulls, applies, scatters and
  gathers (ipyparallel's ``DirectView`` for ranks) through the door's user verbs; ``Session.push/pull/apply``
  forward to it.
- :mod:`.recovery`: restart, scale and bringing a lost rank back, between cells and during an elastic
  run (the notebook's setup replayed on new engines).
- :mod:`.group`: the process group seen from the kernel (describe, store, join, re-form, abort); the one
  writer of its fields and of the pool's engine count.
- :mod:`.health`: dead ranks (pushed by a watcher), beacons, the fault log.
- :mod:`.cell_run`: one cell on its ranks (output relay, escalation ladder, background handles).
- :mod:`.bounded`: a cell's output as the kernel keeps it: each rank's first and last lines, the whole of
  it in a log once it outgrew that (the output relay feeds it).
- :mod:`.cell_elastic`: the in-cell regroup of an elastic run (a lost rank routed around, joins and
  leaves at a step boundary) and the running cell's ranks it shares with the cell.
- :mod:`.shared`: the pool as other notebooks share it (the cell lock, what they changed).
- :mod:`.folders`: where each rank works (the notebook's folder, followed before each cell).
- :mod:`.results`: what a cell produced per rank.
- :mod:`.script`: a torchrun script run on the ranks (``%dist run``): the syntax checks of scripts and
  cells before anything is sent.
- :mod:`.hints`: the one added line under the torch errors a pool user meets (init twice, not initialized).
- :mod:`.stack_report`: every rank's stacks now (``%dist stacks``), asked of the ranks' agents over the
  side channel and grouped, the odd ranks first.
- :mod:`.postmortem_report`: a failed rank's frames and locals (``%dist debug``), through the door.

Doors go one way: session -> rooms -> recovery, view, cell_run -> cell_elastic -> group, health ->
:mod:`workbench.pool`; every room reaches the engines only through the door
(:class:`workbench.remote.door.Door`, sending the endpoints of :mod:`workbench.remote`); no room imports
the session.
"""

from workbench.pool.rankmap import format_ranks, ranks_text
from workbench.session.cell_run import RunHandle
from workbench.session.rank_view import RankView
from workbench.session.results import CellResult, RankDied, RankResult
from workbench.session.session import Session, current, current_or_none, running_pools, use

__all__ = ["CellResult", "RankDied", "RankResult", "RankView", "RunHandle", "Session", "current",
           "current_or_none", "format_ranks", "ranks_text", "running_pools", "use"]
