"""Where each rank works: the notebook's folder, followed before every cell.

The ranks work in the notebook's folder (also after ``%cd``) where their host has it (a local pool's
always does; another host through a shared file system): moved before a cell when it changed, through
the door (:func:`workbench.remote.follow_folder`). Where each rank then works is kept for the errors that
name it (a script or a data file "not found": :func:`workbench.session.hints.where_ranks_look`).

>>> folders = Folders(door, timeout=30)           # doctest: +SKIP
>>> folders.follow(ranks)                         # doctest: +SKIP
>>> folders.of(ranks)                             # doctest: +SKIP
{0: ('vm', '/home/me/project'), 1: ('vm', '/home/me/project')}
"""

from __future__ import annotations

import logging
import os

from workbench import remote
from workbench.pool.rankmap import RankInfo

log = logging.getLogger(__name__)


class Folders:
    """The folder each engine was last asked to follow, and where it works (``door``: the pool's
    :class:`~workbench.remote.door.Door`; ``timeout``: how long a busy rank may hold the move)."""

    def __init__(self, door, timeout: float):
        self.door, self.timeout = door, timeout
        self._asked: dict[int, str] = {}  # engine id -> the notebook's folder it was last asked to follow
        self._found: dict[int, tuple[str, str]] = {}  # engine id -> (its host, the folder it works in)

    def follow(self, targets: list[RankInfo]) -> None:
        """Move the ranks of ``targets`` whose folder is not the notebook's now (bounded: a rank still busy
        must not hold the cell here, past its own timeout and ladder; then they stay where they are)."""
        here = os.getcwd()
        stale = [r for r in targets if self._asked.get(r.engine_id) != here]
        if not stale:
            return
        try:
            found = self.door.call_within(self.timeout, remote.follow_folder, stale, here)
        except Exception as exc:
            log.warning("the ranks' folder was not moved to %s: %s", here, exc)
            return
        self._asked.update((r.engine_id, here) for r in stale)
        self._found.update((r.engine_id, (at["host"], at["folder"]))
                           for r, at in zip(stale, found, strict=True))

    def of(self, targets: list[RankInfo]) -> dict[int, tuple[str, str]]:
        """rank -> (host, the folder it works in as it last followed the notebook's), for the ranks of
        ``targets`` whose folder is known."""
        return {r.rank: self._found[r.engine_id] for r in targets if r.engine_id in self._found}
