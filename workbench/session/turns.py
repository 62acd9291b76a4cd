"""Turns on the pool within one notebook: a cell holds the sub-meshes it runs on, so cells on disjoint
sub-meshes run at the same time (issue 43, ``docs/submeshes.md``), and a cell on busy ranks waits, saying once
behind what.

A turn holds a set of keys: the names of the sub-meshes of a split pool, or
:data:`~workbench.session.meshes.WHOLE` (the pool not split, or a turn over every rank: a split, a join, a
restart, a scale). Two turns wait for each other when their keys meet; ``WHOLE`` meets every key. The
notebooks attached to the same pool are kept apart by the pool's cell lock (:mod:`.shared`), not here.

:class:`Turns` also has the face of the ``threading.Lock`` the session had before (``locked``, ``acquire``,
``release``, ``with``), for the whole pool: the health watcher, the idle release and the walltime end ask it.

>>> turns = Turns()
>>> with turns.held({"a"}, "a cell"):
...     turns.try_hold({"b"}, "a cell") is not None, turns.try_hold({"a"}, "a cell")
(True, None)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from workbench.session.meshes import WHOLE


@dataclass(frozen=True)
class Turn:
    """One turn held: its keys, what it is for ("a cell", "a restart") and since when (epoch seconds)."""

    keys: frozenset[str]
    what: str
    since: float = field(default_factory=time.time)


def meet(a: Collection[str], b: Collection[str]) -> bool:
    """Whether turns on keys ``a`` and ``b`` wait for each other.

    >>> meet({"a"}, {"b"}), meet({"a"}, {"a", "b"}), meet({WHOLE}, {"b"})
    (False, True, True)
    """
    return WHOLE in a or WHOLE in b or bool(set(a) & set(b))


def behind(turns: list[Turn], ranks_of: Callable[[str], str] = lambda key: "") -> str:
    """The one sentence a waiting turn says: behind what it waits (``ranks_of``: a sub-mesh's ranks as text).

    >>> behind([Turn(frozenset({"a"}), "a cell", 0.0)], lambda key: "0-1")  # doctest: +ELLIPSIS
    'sub-mesh a (ranks 0-1) is busy: running a cell since ...; waiting ... (Ctrl-C stops waiting)'
    >>> behind([Turn(frozenset({WHOLE}), "a restart", 0.0)])  # doctest: +ELLIPSIS
    'the pool is busy: running a restart since ...; waiting ... (Ctrl-C stops waiting)'
    """
    parts = []
    for turn in turns:
        names = sorted(turn.keys - {WHOLE})
        since = time.strftime("%H:%M:%S", time.localtime(turn.since))
        if WHOLE in turn.keys or not names:
            parts.append(f"the pool is busy: running {turn.what} since {since}")
            continue
        where = ", ".join(f"{name} (ranks {ranks_of(name)})" if ranks_of(name) else name for name in names)
        parts.append(f"sub-mesh{'es' if len(names) > 1 else ''} {where} "
                     f"{'are' if len(names) > 1 else 'is'} busy: running {turn.what} since {since}")
    return "; ".join(parts) + "; waiting ... (Ctrl-C stops waiting)"


class Turns:
    """The turns held on one pool by this process (its cells, in the foreground and ``--async``)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._held: list[Turn] = []
        self._whole: dict[int, list[Turn]] = {}  # thread id -> the whole-pool turns its acquire() took

    def try_hold(self, keys: Collection[str] | Callable[[], Collection[str]], what: str) -> Turn | None:
        """Take a turn on ``keys`` if none held meets them (``keys`` may be a callable, read under the lock:
        a split in progress changes what a cell's ranks hold); None if one does."""
        with self._cond:
            return self._take(keys, what)

    def _take(self, keys, what: str) -> Turn | None:
        found = frozenset(keys() if callable(keys) else keys)
        if any(meet(found, t.keys) for t in self._held):
            return None
        turn = Turn(found, what)
        self._held.append(turn)
        return turn

    def hold(self, keys, what: str, waiting: Callable[[list[Turn]], None] = lambda turns: None,
             timeout: float | None = None) -> Turn | None:
        """Take a turn on ``keys``, waiting while others meet them (``waiting(those)`` once, as it begins to
        wait); None once ``timeout`` passed. Ctrl-C while waiting takes nothing."""
        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        with self._cond:
            while True:
                turn = self._take(keys, what)
                if turn is not None:
                    return turn
                if not told:
                    found = frozenset(keys() if callable(keys) else keys)
                    waiting([t for t in self._held if meet(found, t.keys)])
                    told = True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def give(self, turn: Turn) -> None:
        """End ``turn``: the turns waiting for it go."""
        with self._cond:
            self._held.remove(turn)
            self._cond.notify_all()

    @contextlib.contextmanager
    def held(self, keys, what: str, waiting: Callable[[list[Turn]], None] = lambda turns: None):
        """A turn on ``keys`` for the block (see :meth:`hold`)."""
        turn = self.hold(keys, what, waiting)
        try:
            yield turn
        finally:
            self.give(turn)

    def now(self, keys: Collection[str] | None = None) -> list[Turn]:
        """The turns held now (``keys``: those that meet them: what a turn on ``keys`` would wait for)."""
        with self._cond:
            return [t for t in self._held if keys is None or meet(keys, t.keys)]

    # -- the face of a threading.Lock, for the whole pool --------------------------------------------
    def locked(self) -> bool:
        """Whether any turn is held (a cell, a restart ... runs)."""
        with self._cond:
            return bool(self._held)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take a turn on the whole pool (as ``Lock.acquire``); :meth:`release` in the same thread ends it."""
        if blocking:
            turn = self.hold({WHOLE}, "a turn", timeout=None if timeout < 0 else timeout)
        else:
            turn = self.try_hold({WHOLE}, "a turn")
        if turn is None:
            return False
        with self._cond:
            self._whole.setdefault(threading.get_ident(), []).append(turn)
        return True

    def release(self) -> None:
        with self._cond:
            mine = self._whole[threading.get_ident()]
            turn = mine.pop()
            if not mine:
                del self._whole[threading.get_ident()]
        self.give(turn)

    def __enter__(self) -> Turns:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
