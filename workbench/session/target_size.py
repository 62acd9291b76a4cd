"""Keeps an elastic run at the size asked for: one desired size, aimed at, never a count of replacements.

An elastic run's :class:`~workbench.session.cell_elastic.ElasticWatch` has one :class:`SizeKeeper` while
the run goes on. Its :attr:`SizeKeeper.target` is the world size asked for: the run's size when it began,
where the Trainer asked for replacements (``ElasticConfig(replace=True)``), else nothing until
``%dist scale N`` or ``%dist restart`` asks for a size during the run. On every tick of the cell's wait
loop the watch tells the keeper how many members the run has (:meth:`SizeKeeper.consider`); while they
are fewer than the target, one batch of new engines is on its way at a time (:class:`Batch`, on a thread
of its own): started through the pool's launcher, set up by replaying the notebook's setup, then handed
to the run, which lets them join at its next step boundary. A loss meanwhile only makes the next batch
larger: the run is never above its target, and never waits for one replacement per loss.

A new engine that dies before it joined (killed while it starts, or while it replays the setup) is one
fault record and is started again at once, up to :data:`TRIES` times in a row; then the keeper stops and
says so in one sentence (``%dist restart`` or ``%dist scale`` try again). A setup that fails on a living
engine (the notebook's cells raise there) is not retried; a launcher without room says why once and the
keeper waits until the members change.

The decisions run on the cell's thread (:meth:`SizeKeeper.consider`); only a batch's start, setup and
hand-over run on its own thread, and the notebook's thread only asks (:meth:`SizeKeeper.aim`) and waits
(:meth:`SizeKeeper.wait`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from workbench.errors import WorkbenchError
from workbench.pool.rankmap import RankInfo

if TYPE_CHECKING:
    from workbench.session.cell_elastic import ElasticWatch
    from workbench.session.rooms import Rooms

TRIES = 4  # new engines in a row that die before they join: then the keeper stops and says so
CLOSE_WAIT_S = 5.0  # the run ended: how long its end waits for a batch to stop its engines
JOIN_WAIT_S = 120.0  # a batch handed to the run waits this long for the next step boundary


class RunEnded(WorkbenchError):
    """The elastic run ended before the size asked for was reached (a scale or restart then acts between
    cells)."""


class Batch:
    """New engines on their way into the run: started, set up, handed over (see the module's docstring)."""

    def __init__(self, keeper: SizeKeeper, n: int):
        self.keeper, self.n = keeper, n
        self.ids: list[int] = []  # registered engine ids
        self.infos: list[RankInfo] = []  # once described
        self.cancelled = False
        self.handed = False  # the run took them (they are members now)
        self.thread = threading.Thread(target=self._run, name="workbench-keeper", daemon=True)

    def _run(self) -> None:
        keeper = self.keeper
        try:
            joined = self._bring()
        except BaseException as exc:  # noqa: BLE001 (every failure is judged: retried, or said)
            self._stop_engines()
            keeper.failed(self, exc)
        else:
            keeper.joined(self, joined)

    def _bring(self) -> list[RankInfo]:
        from workbench.session import recovery

        rooms, watch = self.keeper.rooms, self.keeper.watch
        group = rooms.group
        pool = group.pool
        like = list(group.lost[:self.n])  # the lost ranks' hosts and devices, then where a scale puts them
        hosts = pool.launcher.where_to_start(pool, like, group.ranks, self.keeper.say) if like else None
        self.ids = pool.start_more(self.n, set(pool.client.ids), alive=len(group.ranks), hosts=hosts,
                                   cancelled=lambda: self.cancelled)
        self._check()
        self.infos = recovery.new_ranks(group, self.ids, like=like, moved=bool(hosts))
        self._check()
        recovery.set_up(rooms, self.infos, self.keeper.say, running=True)
        self._check()
        future = watch.request("join", self.infos)
        self.handed = True
        return future.result(JOIN_WAIT_S)

    def _check(self) -> None:
        if self.cancelled:
            raise RunEnded("not needed any more")

    def _stop_engines(self) -> None:
        """The engines of a batch that did not join end: none is left outside the run."""
        rooms = self.keeper.rooms
        members = {r.engine_id for r in rooms.group.ranks}
        infos = [r for r in self.infos if r.engine_id not in members]
        ids = [i for i in self.ids if i not in members]
        known = {r.engine_id for r in infos}
        try:
            if infos:  # by pid here, through the launcher elsewhere
                rooms.group.signal(infos, signal.SIGKILL, breaks_group=False)
            rest = [i for i in ids if i not in known or not rooms.local]
            if rest:  # not described yet (or elsewhere): asked to shut down, whenever they can
                rooms.group.pool.stop_engines(rest, block=False)
        except Exception:  # noqa: BLE001 (gone already)
            pass


class SizeKeeper:
    """Keeps ``watch``'s run at :attr:`target` ranks (see the module's docstring). ``auto``: the Trainer
    asked for replacements (``replace=True``): the target stays; else a target asked by ``%dist scale`` or
    ``%dist restart`` is dropped once reached."""

    def __init__(self, rooms: Rooms, watch: ElasticWatch, target: int | None, auto: bool,
                 report: Callable[[str], None]):
        self.rooms, self.watch, self.target, self.auto, self.report = rooms, watch, target, auto, report
        self.batch: Batch | None = None
        self.failures = 0  # new engines in a row that died before they joined
        self.last_failure = ""
        self.gave_up: str | None = None  # the sentence said when the keeper stopped trying
        self.blocked: tuple[int, str] | None = None  # (members then, why): the launcher had no room
        self.closed = False
        self.members = 0  # as the last tick counted them
        self.counted = False  # a tick counted them since the last aim: :meth:`wait` trusts no older count
        self._changed = threading.Condition()

    def say(self, text: str) -> None:
        """A batch's progress: said where it tells something (an ssh pool: which host), not locally."""
        if not self.rooms.local:
            self.report(text)

    # -- from the cell's thread -----------------------------------------------------------------------
    def consider(self, members: int) -> None:
        """The run has ``members`` members now: start a batch for what is missing, or cancel one no longer
        needed. Called on every tick of the cell's wait loop."""
        with self._changed:
            self.members, self.counted = members, True
            self._changed.notify_all()
        target, batch = self.target, self.batch
        if self.closed or target is None:
            return
        if batch is not None:
            if not batch.handed and members + batch.n > target:
                batch.cancelled = True  # a scale down asked for fewer meanwhile
            return
        if members >= target:
            if not self.auto and members == target:
                self._reached()
            return
        if self.gave_up is not None:
            return
        if self.blocked is not None and self.blocked[0] == members:
            return  # no room, and nothing changed since
        self.blocked = None
        launcher = self.rooms.pool.launcher
        if not launcher.can_add_engines:  # said once; the run goes on with the ranks it has
            self.blocked = (members, launcher.cannot_add)
            self.report(f"{launcher.cannot_add}: the run goes on with the ranks it has")
            return
        self.batch = Batch(self, target - members)
        self.batch.thread.start()

    def joined(self, batch: Batch, joined: list[RankInfo]) -> None:
        """A batch joined the run (on its own thread)."""
        group = self.rooms.group
        group.forget_lost(group.lost[:len(joined)])  # as many lost ranks are back
        with self._changed:
            self.failures, self.last_failure, self.batch = 0, "", None
            self._changed.notify_all()
        self.watch.wake()

    def failed(self, batch: Batch, exc: BaseException) -> None:
        """A batch did not join (on its own thread): cancelled, no room, the setup failed, or an engine
        died before it joined (retried at once, :data:`TRIES` times in a row)."""
        reason = _reason(exc)
        with self._changed:
            self.batch = None
            if batch.cancelled or self.closed or isinstance(exc, RunEnded):
                pass
            elif isinstance(exc, ValueError):  # the launcher has no room, or cannot place them: said once
                self.blocked = (self.members, reason)
                self.report(f"no new engine was started: {reason}; the run goes on with {self.members} "
                            f"rank{'s' if self.members != 1 else ''}")
            elif self._engines_alive(batch):  # the setup itself failed: retrying repeats it
                self._give_up(f"the new engine{'s' if batch.n != 1 else ''} could not join the run: {reason}")
            else:
                self.failures += 1
                self.last_failure = reason
                self.rooms.health.note("died", None, f"a new engine for the run died before it joined "
                                                     f"({reason}); another is starting"
                                       if self.failures < TRIES else
                                       f"a new engine for the run died before it joined ({reason})")
                if self.failures >= TRIES:
                    self._give_up(f"{TRIES} new engines in a row died before they joined the run (the last: "
                                  f"{reason})")
            self._changed.notify_all()
        self.watch.wake()

    def _give_up(self, why: str) -> None:
        self.gave_up = (f"{why}; the run goes on with {self.members} rank{'s' if self.members != 1 else ''} "
                        f"of the {self.target} asked for, and `%dist restart` tries again")
        self.report(self.gave_up)

    def _engines_alive(self, batch: Batch) -> bool:
        """Whether every engine of a failed batch still runs (only known here for a local pool, by pid)."""
        if not batch.infos or not self.rooms.local:
            return False
        import psutil

        def alive(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False

        return all(alive(r.pid) for r in batch.infos)

    def _reached(self) -> None:
        with self._changed:
            self.target = None  # asked once (a scale or restart of a run without replace=True): reached
            self._changed.notify_all()

    # -- from other threads ---------------------------------------------------------------------------
    def aim(self, n: int) -> None:
        """Aim at ``n`` ranks from now on (``%dist scale N``, ``%dist restart``); the bound on failures
        starts again."""
        with self._changed:
            self.target, self.counted = n, False
            self.failures, self.gave_up, self.blocked = 0, None, None
            self._changed.notify_all()
        self.watch.wake()

    def wait(self, n: int, timeout: float) -> None:
        """Until the run has ``n`` members and no batch is on its way; raises :class:`RunEnded` if the run
        ends first, or one sentence when the keeper stops trying or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if self.closed:
                    raise RunEnded("the elastic run ended")
                settled = self.batch is None and self.watch.recovering is None
                if self.counted and self.members == n and settled:
                    return
                if self.gave_up is not None:
                    raise WorkbenchError(self.gave_up)
                if self.blocked is not None:
                    raise WorkbenchError(f"no new engine was started: {self.blocked[1]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkbenchError(
                        f"the run did not reach {n} ranks within {timeout:g} s (it has {self.members}"
                        + (f"; the last new engine died before it joined: {self.last_failure}"
                           if self.last_failure else "") + ")")
                self._changed.wait(min(left, 0.1))

    def close(self) -> None:
        """The run ended: no batch any more; one on its way stops its engines (waited for a few seconds)."""
        with self._changed:
            self.closed = True
            batch = self.batch
            self._changed.notify_all()
        if batch is not None:
            batch.cancelled = True
            batch._stop_engines()
            batch.thread.join(CLOSE_WAIT_S)


def _reason(exc: BaseException) -> str:
    """One line for what ended a batch (an engine's error, or ours)."""
    first = (getattr(exc, "elist", None) or [None])[0]
    if first is not None:
        return f"{first[0]}: {first[1]}"
    ename = getattr(exc, "ename", None)
    text = f"{ename}: {getattr(exc, 'evalue', exc)}" if ename else (str(exc) or type(exc).__name__)
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["SizeKeeper", "RunEnded", "TRIES"]
