"""The pool as other notebooks see it and change it: the same picture for every session.

The pool's state file is the one truth about its ranks, its process group (generation, whether a
fault aborted it) and whether it still runs. Every session (the one that started the pool and the
attached ones) takes a cell's turn through the pool's cell lock, catches up with what another
notebook changed (a restart, a scale, a re-formed or aborted group) before it acts, and writes what
it changed itself. A pool stopped elsewhere turns the next call into one line saying by whom.

What the session's other rooms do with a change caught up with (watch the new ranks, tell the metrics)
is the composition root's (:meth:`workbench.session.rooms.Rooms.turn`).

>>> shared = Shared(pool, group, role="attached")     # doctest: +SKIP
>>> with shared.held(notify=print):                   # doctest: +SKIP
...     ranks = shared.catch_up()
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

from workbench.errors import PoolGone
from workbench.pool.cluster import EnginePool
from workbench.pool.rankmap import RankInfo
from workbench.pool.records import sharing
from workbench.pool.records import state as pool_state
from workbench.session.group import ProcessGroup
from workbench.session.meshes import WHOLE


class Shared:
    """One session's view of a pool that other notebooks may drive too."""

    def __init__(self, pool: EnginePool, group: ProcessGroup, *, role: str):
        self.pool, self.group = pool, group
        self.lock = sharing.CellLock(pool.pool_id)
        self._seen: int | None = None
        self._writing = threading.Lock()  # cells on sub-meshes end at once: one write of the state at a time
        sharing.register(pool.pool_id, role)

    @contextlib.contextmanager
    def held(self, notify: Callable[[str], None] = print, what: str = "a cell", keys=frozenset({WHOLE})):
        """Hold the pool's cell lock for the block (``notify`` hears that another notebook holds it); a
        group that a fault aborted meanwhile is published as such at the end (whoever comes next
        re-forms it). ``keys``: the sub-meshes the block runs on (:mod:`.turns`): their own locks, with the
        pool's lock held shared; ``WHOLE`` (the default) holds the pool's lock alone. A notebook that has not
        yet seen a split holds the pool's lock whole, so it waits for every sub-mesh's cell."""
        def waiting(who: str) -> None:
            notify(f"pool busy: running {what} from {who}, waiting ... (Ctrl-C stops waiting)")

        whole = WHOLE in keys
        with contextlib.ExitStack() as locks:
            locks.enter_context(self.lock.held(waiting=waiting, what=what, shared=not whole))
            for key in [] if whole else sorted(keys):  # one order for every notebook: no deadlock
                locks.enter_context(sharing.CellLock(self.pool.pool_id, key).held(waiting=waiting, what=what))
            try:
                yield
            finally:  # a cell that failed is the one that broke a group: said also when the block raised
                if not self.group.ok:  # the whole pool's group, or a sub-mesh's (each marked in its record)
                    self.publish(group_ok=WHOLE not in self.group.broken, meshes=self.group.published())

    def catch_up(self) -> list[RankInfo] | None:
        """Take in what another notebook changed; the new ranks when they changed (the caller watches them),
        else None; :class:`PoolGone` if the pool was stopped."""
        mtime = self._mtime()
        if mtime is None:
            raise PoolGone(sharing.describe_stop(self.pool.pool_id, self.pool.name))
        if mtime == self._seen:
            return None
        state = pool_state.read_state(self.pool.state_file) or pool_state.PoolState()
        self._seen = mtime
        ranks = [RankInfo(**r) for r in state.ranks]
        if not ranks:
            return None
        changed = ranks != self.group.ranks or state.generation != self.group.generation \
            or _formed(state.meshes) != _formed(self.group.published())
        ok = state.group_ok and (changed or WHOLE not in self.group.broken)
        if not ok:
            self.group.mark_broken()
        elif not changed:  # another notebook's cell broke a sub-mesh's group this one still thinks formed
            self.group.broken |= {name for name, m in state.meshes.items()
                                  if not m.get("ok", True) and name in self.group.meshes}
        if changed:
            self.group.follow(ranks, backend=state.backend, generation=state.generation,
                              endpoints=state.endpoints, ok=ok, meshes=state.meshes)
            return ranks
        return None

    def publish(self, **what) -> None:
        """Write what this session changed (ranks, backend, generation, group_ok) for the others. Sub-meshes
        are merged with what the file says (:func:`merged_meshes`): another notebook's cell on another
        sub-mesh may have broken or re-formed its group since this one last looked."""
        with self._writing, sharing.StateWrite(self.pool.pool_id):
            if "meshes" in what:
                path = self.pool.state_file or pool_state.state_path(self.pool.pool_id)
                state = pool_state.read_state(path) if self._mtime() is not None else None
                what["meshes"] = merged_meshes(state.meshes if state else {}, what["meshes"])
            self.pool.update_state(**what)
            self._seen = self._mtime()

    def gone(self) -> bool:
        return self._mtime() is None

    def close(self) -> None:
        sharing.unregister(self.pool.pool_id)

    def _mtime(self) -> int | None:
        path = self.pool.state_file or pool_state.state_path(self.pool.pool_id)
        try:
            return os.stat(path).st_mtime_ns
        except FileNotFoundError:
            return None


def merged_meshes(on_file: dict, mine: dict) -> dict:
    """The sub-meshes to write: ``mine``, but where both name the same sub-meshes on the same ranks, each
    sub-mesh's newer formation wins (its generation), and at the same generation a break either saw stays
    (only a re-form, a new generation, mends it). Another split or join (other names or ranks) is
    ``mine`` whole: it was made holding the whole pool.

    >>> a = {"ranks": [0, 1], "generation": 3, "ok": True}
    >>> b_broken = {"ranks": [2, 3], "generation": 3, "ok": False}
    >>> mine = {"a": {**a, "ok": False}, "b": {**b_broken, "ok": True}}  # a broke here; b's break not seen
    >>> merged = merged_meshes({"a": a, "b": b_broken}, mine)
    >>> {name: m["ok"] for name, m in merged.items()}
    {'a': False, 'b': False}
    >>> merged_meshes({"a": a, "b": {**b_broken, "generation": 4, "ok": True}}, {"a": a, "b": b_broken})["b"]
    {'ranks': [2, 3], 'generation': 4, 'ok': True}
    >>> merged_meshes({"a": a}, {"m0": {"ranks": [0, 1, 2, 3], "generation": 5, "ok": True}})
    {'m0': {'ranks': [0, 1, 2, 3], 'generation': 5, 'ok': True}}
    """
    if {n: list(m["ranks"]) for n, m in on_file.items()} != {n: list(m["ranks"]) for n, m in mine.items()}:
        return mine
    merged = {}
    for name, m in mine.items():
        theirs = on_file[name]
        if int(theirs["generation"]) != int(m["generation"]):
            merged[name] = dict(max(theirs, m, key=lambda x: int(x["generation"])))
        else:
            merged[name] = {**m, "ok": bool(m.get("ok", True) and theirs.get("ok", True))}
    return merged


def _formed(meshes: dict) -> dict:
    """The sub-meshes as formed (ranks, generation), whether or not a fault aborted one since.

    >>> _formed({"a": {"ranks": [0, 1], "generation": 3, "ok": False}})
    {'a': ([0, 1], 3)}
    """
    return {name: (list(m["ranks"]), int(m["generation"])) for name, m in meshes.items()}
