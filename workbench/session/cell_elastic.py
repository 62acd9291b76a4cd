"""The in-cell regroup of an elastic run: a lost rank is routed around while the cell keeps running.

A :class:`CellRun <workbench.session.cell_run.CellRun>` asks :class:`ElasticWatch` first when a rank dies
or stalls. While every running rank's beacon shows an elastic Trainer
(``Trainer(..., elastic=True)``), the watch does not climb the failure ladder: it picks the ranks that
are left, sends them a signed regroup plan (who they are now, and a standby store to meet at), and
the cell goes on. A rank counts as hung when no rank has made progress for the Trainer's
``hang_timeout`` and it is behind the others (fewer steps begun or collectives launched) or silent: it
is killed, then treated as lost. The kernel's rank map, the health watcher and the pool's state file
follow the new membership at once; the fault is recorded ("rank 1 died after step 412; continuing on 3
ranks": the step the ranks fill in) and counted as recovered when every rank left has completed a step in
the new group.

``%dist restart`` and ``%dist scale N`` during an elastic run (``%%distributed --async``) hand their
change to the cell's thread (:meth:`ElasticWatch.request`), which makes it at the next step boundary;
new engines first replay the notebook's setup (:class:`~workbench.session.recovery.Transcript`, in the
recovery room, which starts them).

What runs on the engines: :mod:`workbench.engine.rendezvous` (``regroup``) and
:mod:`workbench.train.elastic` (the Trainer's side).
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from workbench import remote
from workbench.pool.rankmap import RankInfo, format_ranks, ranks_text
from workbench.session.losses import loss_text
from workbench.session.meshes import WHOLE, keys_for
from workbench.session.target_size import RunEnded, SizeKeeper
from workbench.wire import Command

if TYPE_CHECKING:
    from workbench.session.rooms import Rooms

# A regroup whose members say they still wait for some of them this long is re-planned without those.
REPLAN_S = 5.0
REPLAN_QUIET_S = 2.0  # ... and that have been silent this long (a member only slow to come still beacons)
RESEND_S = 0.5  # a member still waiting in an older group than the plan's is sent it again this often
# A loss seen while no elastic run is known to go on waits at most this long for the survivors' beacons sent
# after it: the one saying their elastic run started may still be on its way (a rank lost as the run starts,
# or a kernel whose beacon thread lags under load, failed the cell as a plain fault: CI, stop 46)
STALE_VIEW_S = 1.0


class Children(list):
    """The ranks running one cell, each with its ipyparallel reply: ``(RankInfo, child)``, in order. The
    cell fills it when it starts; an elastic join adds to it, a regroup renumbers it.

    >>> from workbench.pool.rankmap import RankInfo
    >>> a, b = RankInfo(0, 0, 0, "h", 10, "cpu", 5), RankInfo(1, 1, 0, "h", 11, "cpu", 6)
    >>> running = Children([(a, "reply a"), (b, "reply b")])
    >>> running.renumber([dataclasses.replace(b, rank=0)])
    >>> [(r.rank, r.engine_id, c) for r, c in running]
    [(0, 5, 'reply a'), (0, 6, 'reply b')]
    """

    def renumber(self, ranks: list[RankInfo]) -> None:
        """The ranks under the numbers of ``ranks`` (a regroup); ranks not in it keep theirs."""
        now = {r.engine_id: r for r in ranks}
        self[:] = [(now.get(r.engine_id, r), c) for r, c in self]


class ElasticWatch:
    """Regroups the ranks of one cell's elastic run when one is lost; see the module's docstring.

    ``rooms``: the session's rooms (:class:`~workbench.session.rooms.Rooms`): the group it regroups, the
    health and beacons it reads, the door a joining engine's cell starts through; once the group holds a
    new rank map the rooms follow it (:meth:`~workbench.session.rooms.Rooms.follow_membership`), and the
    run's :class:`~workbench.session.target_size.SizeKeeper` brings it back to the size asked for
    (``ElasticConfig(replace=True)``, or a ``%dist scale`` during the run): new engines join through
    :meth:`request`. ``children``: the cell's running ranks; ``wake``: wakes the cell's wait loop (a
    request from another thread waits for its tick).
    """

    def __init__(self, rooms: Rooms, children: Children, wake: Callable[[], None],
                 report: Callable[[str], None] = lambda text: print(f"workbench: {text}", flush=True)):
        self.rooms, self.children, self.wake, self.report = rooms, children, wake, report
        self.settings: dict | None = None  # the elastic Trainer's settings, while its run goes on
        self.dropped: dict[int, str] = {}  # engine id -> how that rank was lost
        self._lost_in: dict[int, Any] = {}  # engine id -> the fault event of its loss
        self.leaving: set[int] = set()  # engine ids a planned shrink left out (their run ends; they stop)
        self.requests: collections.deque = collections.deque()  # (what, argument, Future) from other threads
        self._keeper: SizeKeeper | None = None  # keeps the run at the size asked for (replace=True, a scale)
        self.joining: set[int] = set()  # engine ids a join added that have not trained in the group yet
        self._closed = False
        self._lock = threading.Lock()
        self.faults: list = []
        self.recovering: dict | None = None  # the regroup in progress: since, generation, step
        self._progress: dict[int, tuple] = {}  # engine id -> ((steps begun, collectives), since when)
        self._loss_seen: dict[frozenset, tuple[float, float]] = {}  # lost engine ids -> (monotonic, wall)
        self._mesh: str | None = None  # the sub-mesh the run is on (see :attr:`mesh`)

    # -- what runs --------------------------------------------------------------------------------
    def beat(self, info: RankInfo) -> dict | None:
        """``info``'s latest beacon, if it came from that engine (after a renumbering the rank's number
        may still show another engine's last beacon)."""
        beat = self.rooms.beacons.latest.get(info.rank)
        return beat if beat is not None and beat.get("pid") == info.pid else None

    def members(self) -> list[RankInfo]:
        """The ranks still running the cell in the current group."""
        dead = self.rooms.health.dead
        return [r for r, c in self.children if r.engine_id not in self.dropped
                and r.engine_id not in self.leaving and not c.done() and r.rank not in dead]

    def _running(self) -> list[RankInfo]:
        """The ranks a plan counts on: those still running the cell in the current group, the dead among
        them too until a plan routes around them (a plan never leaves out a rank it has not recorded as lost:
        one that died a moment before is in it, and its death, seen again once the rooms follow the plan,
        is the next re-plan)."""
        return [r for r, c in self.children if r.engine_id not in self.dropped
                and r.engine_id not in self.leaving and not c.done()]

    def _unrouted(self) -> bool:
        """A member was found dead that no plan has routed around yet: the cell's wait loop routes around it
        (:meth:`lost`) right after this tick, so the tick makes no plan of its own before that one (a plan
        made now would leave the dead rank out without a fault record: a join, a leave, a hung rank's)."""
        dead = self.rooms.health.dead
        return any(r.engine_id not in self.dropped and r.engine_id not in self.leaving and r.rank in dead
                   for r, _ in self.children)

    def _loss_unplanned(self) -> bool:
        """A member died or ended but no regroup has planned without it yet: the keeper waits for that
        plan, which records the lost rank, so its replacement starts where the launcher puts a lost rank's
        (a Slurm pool: a new step of its job, not a new job)."""
        dead = self.rooms.health.dead
        return any(r.engine_id not in self.dropped and r.engine_id not in self.leaving
                   and (c.done() or r.rank in dead) for r, c in self.children)

    @property
    def mesh(self) -> str | None:
        """The sub-mesh this run is on, in a split pool (None: the pool is not split). A run regroups within
        its sub-mesh (:meth:`~workbench.session.group.ProcessGroup.regroup_mesh`), the pool's rank numbers
        kept; found at the first look and kept (a regroup changes the sub-mesh's ranks)."""
        if self._mesh is None and self.rooms.group.meshes:
            keys = keys_for(self.rooms.group.meshes, [r.rank for r in self._running()])
            self._mesh = next(iter(keys)) if len(keys) == 1 else WHOLE
        return self._mesh

    def _whole_mesh(self) -> bool:
        """Whether the run can be routed around a loss: the pool is not split, or the cell runs on every rank
        of one sub-mesh (not on several, nor on some of one: their group is the sub-mesh's)."""
        mesh = self.mesh
        if mesh is None:
            return True
        if mesh == WHOLE:
            return False
        group = self.rooms.group
        return {r.rank for r in self._running()} == set(group.meshes.get(mesh, ())) \
            or self.recovering is not None or bool(self.dropped)

    def active(self) -> dict | None:
        """The elastic Trainer's settings while one runs on every member (kept through a regroup, when
        some beacons are not yet those of the new group). In a split pool, only for a cell on every rank of
        one sub-mesh: it regroups within it (``docs/submeshes.md``); a cell across sub-meshes fails on a loss
        as a plain one."""
        if not self._whole_mesh():
            return None
        trainers = [(self.beat(r) or {}).get("trainer") for r in self.members()]
        if trainers and all(t and t.get("running") and t.get("elastic") for t in trainers):
            self.settings = trainers[0]["elastic"]
        elif any(t is not None and not t.get("running") for t in trainers) and self.recovering is None:
            self.settings = None  # the run ended on some rank: a loss now is a plain failure
        return self.settings

    # -- routing around ---------------------------------------------------------------------------
    def undecided(self, infos: list[RankInfo]) -> bool:
        """Whether the loss of ``infos`` waits a tick before it is routed around or fails the cell: no
        elastic run is known to go on (:meth:`active`), but a survivor's latest beacon, sent before the loss
        was seen, shows an elastic Trainer between runs; for at most ``STALE_VIEW_S``. A pool without an
        elastic Trainer never waits: its losses are named at once."""
        if self.active() is not None:
            return False
        key = frozenset(r.engine_id for r in infos)
        seen = self._loss_seen.setdefault(key, (time.monotonic(), time.time()))
        if time.monotonic() - seen[0] > STALE_VIEW_S:
            return False
        for beat in filter(None, map(self.beat, self.members())):
            trainer = beat.get("trainer") or {}
            if "elastic" in trainer and not trainer.get("running") and beat.get("t", 0.0) < seen[1]:
                return True
        return False

    def tick(self) -> None:
        """From the cell's wait loop: notice a regroup that completed, or a rank that hangs; carry out
        the changes asked for from other threads (``%dist restart``, ``%dist scale``)."""
        if self.recovering is None and self.settings is None and not self.requests \
                and not self.rooms.beacons.trainers:
            return  # no Trainer runs anywhere: nothing to watch (O(1), not a look at every rank's beacon)
        unrouted = self._unrouted()  # routed around first, by the wait loop's next look (CellRun._detect)
        if self.recovering is not None:
            self._check_recovered(replan=not unrouted)
        elif self.active() is not None and not unrouted:
            self._check_hang()
        if self.settings is not None and not self._loss_unplanned():
            self.keeper().consider(len(self.members()))
        if self.recovering is None and self.settings is not None and not unrouted:
            while self.requests and self.recovering is None:
                what, argument, done = self.requests.popleft()
                try:
                    done.set_result(self._join(argument) if what == "join" else self._leave(argument))
                except Exception as exc:
                    done.set_exception(exc)
        while self.requests and self.settings is None:  # the run ended meanwhile
            self.requests.popleft()[2].set_exception(RunEnded("the elastic run ended"))

    def request(self, what: str, argument) -> Future:
        """Ask the cell's thread to let ``argument`` join ("join", new ranks set up) or to keep only the
        first ``argument`` ranks ("leave") at the next step boundary; the Future holds the new ranks."""
        done: Future = Future()
        with self._lock:
            if self._closed:
                done.set_exception(RunEnded("the elastic run ended"))
                return done
            self.requests.append((what, argument, done))
        self.wake()
        return done

    def close(self) -> None:
        """The cell ended: what is still asked for cannot happen any more (its Futures say so), new engines on
        their way stop. A regroup that did not complete leaves the group to be re-formed on the survivors by
        the next cell."""
        if self.recovering is not None:  # a sub-mesh's run: that sub-mesh's group only
            self.rooms.group.mark_broken([r.rank for r, _ in self.children] if self.mesh else None)
        with self._lock:
            self._closed = True
            while self.requests:
                self.requests.popleft()[2].set_exception(RunEnded("the elastic run ended"))
        if self._keeper is not None:
            self._keeper.close()

    def keeper(self) -> SizeKeeper:
        """The run's keeper (made at the first look: its target is the run's size where the Trainer asked for
        replacements, else none until a scale or restart asks for one)."""
        if self._keeper is None:  # a sub-mesh's run: not grown back during it (not built: docs/submeshes.md)
            auto = bool((self.settings or {}).get("replace")) and not self.mesh
            target = len(self.members()) + len(self.dropped) - len(self.leaving) if auto else None
            self._keeper = SizeKeeper(self.rooms, self, target, auto, self.report)
        return self._keeper

    def lost(self, infos: list[RankInfo], how: str, kind: str = "died",
             detect_s: float | None = None, without: list[RankInfo] = ()) -> bool:
        """Route the run around ``infos`` (dead or hung); False when it cannot (no elastic run, or too
        few ranks would be left): the cell then fails as it would without elasticity. ``without``: lost
        too, routed around by the call that follows (their own fault record)."""
        settings = self.active()
        if settings is None:
            return False
        gone = {r.engine_id for r in [*infos, *without]}
        stay = [r for r in self._running() if r.engine_id not in gone]
        if len(stay) < settings.get("min_ranks", 1):
            return False
        joining = [r for r in infos if r.engine_id in self.joining]
        if joining and len(joining) < len(infos):  # members and joiners: one fault record each, one regroup
            others = [r for r in infos if r.engine_id not in self.joining]
            return self.lost(others, how, kind, detect_s, without=joining) \
                and self.lost(joining, how, kind, detect_s)
        step = self._step(stay)
        group, health, beacons = self.rooms.group, self.rooms.health, self.rooms.beacons
        before = self.recovering if self.recovering is not None and self.recovering["fault"] else None
        # a loss while the regroup after another one forms: the ranks are named as the group that last
        # formed numbered them (the user's numbers), not as the plan that never formed did; an engine that
        # was joining is named by the number the join gave it, and said to be joining
        formed = before["formed"] if before else {r.engine_id: r.rank for r in group.ranks}
        named = [dataclasses.replace(r, rank=formed.get(r.engine_id, r.rank)) for r in infos]
        if joining:
            how = f"{how} while joining"
        # the ranks fill in {step}, the last step they completed together (the kernel's beacons lag);
        # the fault record gets it once they have regrouped (_check_recovered)
        text = loss_text(named, group.ranks, how, step="{step}", left=len(stay),
                         fsdp=bool(settings.get("fsdp")))
        if detect_s is None:  # how long it was silent before we knew
            detect_s = round(max(min(beacons.silent_for(r.rank), 3600.0) for r in infos), 3)
        event = health.record(kind, named[0], text.replace(" after step {step}", ""), detect_s, 0.0)
        lost_ranks = sorted({*(before["lost"] if before else []), *(r.rank for r in named)})
        plan = group.regroup(stay, lost=infos, abort=True, text=text, lost_ranks=lost_ranks,
                             beats=beacons.latest, mesh=self.mesh)
        for r in infos:
            self.dropped[r.engine_id] = how
            self._lost_in[r.engine_id] = event
            self.joining.discard(r.engine_id)
        self._renumber()
        self.rooms.follow_membership()
        self.faults.append(event)
        earlier = [*before["events"], (before["fault"], before["text"])] if before else []  # one regroup
        self.recovering = {"since": time.monotonic(), "generation": plan["generation"], "step": step,
                           "fault": event, "text": text, "events": earlier, "left": len(stay),
                           "formed": formed, "lost": lost_ranks, "plan": plan,
                           "sent": time.monotonic()}
        # "continuing" once it has (_check_recovered)
        self.report(text.replace(" after step {step}", "").replace("; continuing on", "; regrouping on"))
        self.keeper().consider(len(self.members()))  # a replacement on its way at once (replace=True)
        return True

    def how_lost(self, engine_id: int) -> str | None:
        """How and when a lost rank went, for its tab: ``"died after step 100 (12:03:04)"`` (the step once
        the others regrouped; the rank numbers are the fault record's)."""
        event = self._lost_in.get(engine_id)
        if event is None:
            return None
        what = event.first_failure.split("; ")[0]
        return f"{what} ({time.strftime('%H:%M:%S', time.localtime(event.time))})"

    def _step(self, ranks: list[RankInfo]) -> int:
        return max([((self.beat(r) or {}).get("trainer") or {}).get("step", 0) for r in ranks] or [0])

    def _join(self, infos: list[RankInfo]) -> list[RankInfo]:
        """New engines (set up already) join at the members' next step boundary and run the rest; refused
        where they would take the run above the size asked for (a scale down came meanwhile)."""
        stay, group = self._running(), self.rooms.group
        target = self._keeper.target if self._keeper is not None else None
        if target is not None and len(stay) + len(infos) > target:
            raise RuntimeError(f"not needed any more: the run has {len(stay)} of the {target} ranks "
                               "asked for")
        step, world = self._step(stay), len(stay) + len(infos)
        numbers = format_ranks(range(len(stay), world))
        # the ranks fill in the step they changed at ({step}); the kernel only knows it is the next one
        text = f"rank {numbers} joined after step {{step}}; continuing on {world} ranks"
        self.joining |= {r.engine_id for r in infos}  # before the rank map lists them: never "busy" there
        plan = group.regroup(stay, join=infos, abort=False, text=text)
        joined = group.ranks[len(stay):]
        for info in joined:  # each runs the rest of the run in a cell the running one waits for
            ar = self.rooms.door.start_in_cell(remote.join_running, [info], plan)
            ar.add_done_callback(lambda _: self.wake())
            child = ar._children[0]
            child.iopub_callbacks.append(lambda _: self.wake())
            self.children.append((info, child))
        self._after_change(plan, step, text)
        return joined

    def _leave(self, n: int) -> list[RankInfo]:
        """Keep the first ``n`` members from the next step boundary on; the others' runs end there."""
        members = self._running()
        stay, leave = members[:n], members[n:]
        if not leave:  # a loss meanwhile took the run down to n already
            return []
        step = self._step(members)
        text = (f"rank {format_ranks(r.rank for r in leave)} left after step {{step}}; continuing on {n} "
                f"rank{'s' if n != 1 else ''}")
        plan = self.rooms.group.regroup(stay, leave=leave, abort=False, text=text)
        self.leaving |= {r.engine_id for r in leave}
        self._after_change(plan, step, text)
        return leave

    def _after_change(self, plan: dict, step: int, text: str) -> None:
        self._renumber()
        self.rooms.follow_membership()
        self.recovering = {"since": time.monotonic(), "generation": plan["generation"], "step": step,
                           "fault": False, "plan": plan, "sent": time.monotonic()}
        self.report(text.replace("joined after step {step}", "joins at the next step boundary")
                    .replace("left after step {step}", "leaves at the next step boundary"))

    def _renumber(self) -> None:
        """The cell's ranks under their new numbers (lost ones keep their old number)."""
        self.children.renumber(self.rooms.group.ranks)

    def _check_recovered(self, replan: bool = True) -> None:
        """The regroup is done once every member beacons from the new group past the lost step; else members
        that do not come are re-planned without (not while a death waits to be routed around: ``replan``)."""
        g, step = self.recovering["generation"], self.recovering["step"]
        beats = {r.rank: self.beat(r) for r in self.members()}
        fault = self.recovering["fault"]
        if beats and all(b is not None and b.get("generation") == g
                         and (b.get("trainer") or {}).get("step", 0) > step
                         and (not fault or (b.get("trainer") or {}).get("regrouped_generation") == g)
                         for b in beats.values()):
            seconds = time.monotonic() - self.recovering["since"]
            self.rooms.group.heard({rank: b.get("endpoints") or [] for rank, b in beats.items()})
            if fault:
                at = next(iter(beats.values()))["trainer"]["regrouped"]
                fault.first_failure = self.recovering["text"].replace("{step}", str(at))
                left = self.recovering["left"]
                for event, text in self.recovering["events"]:  # losses before it, in the same regroup
                    head = text.replace("{step}", str(at)).split("; continuing on")[0]
                    event.first_failure = f"{head}; continuing on {ranks_text(left)}"
                    event.recover_s = round(seconds, 3)
                self.rooms.health.recovered(seconds)
                self.report(f"continuing on {ranks_text(self.recovering['left'])} after step {at}, "
                            f"regrouped in {seconds:.1f} s")
            self.recovering = None
            self.joining.clear()  # every member trained in the new group
            return
        self._resend()
        # a member (a joining one too: it beacons from the moment it takes its plan) that the others have
        # waited for REPLAN_S while it was silent is stopped or hung
        stuck = unanswered(self.members(), list(self.rooms.beacons.latest.values()), g, REPLAN_S) \
            if replan else []
        if stuck:  # members that do not come to the regroup: killed (fenced too), re-planned without them
            self.rooms.group.signal(stuck, signal.SIGKILL, breaks_group=False)
            self.lost(stuck, f"did not answer the regroup for {REPLAN_S:g} s (killed)", kind="hang",
                      detect_s=REPLAN_S)

    def _resend(self) -> None:
        """The plan again, to members that wait in an older group (a joining engine whose agent started after
        the plan was sent: it would wait there for the others, who wait for it in the new one)."""
        g, now = self.recovering["generation"], time.monotonic()
        if now - self.recovering["sent"] < RESEND_S:
            return
        # by pid: a joining engine beacons under the number its join plan gave it, not the newer plan's
        by_pid = {b.get("pid"): b for b in self.rooms.beacons.latest.values() if b}
        behind = [r for r in self.members() if not _in_generation(by_pid.get(r.pid), g)]
        if behind:
            self.recovering["sent"] = now
            self.rooms.group.command(Command.REGROUP, behind, plan=self.recovering["plan"], abort=False,
                                     peers=[])

    def _check_hang(self) -> None:
        """When no rank has made progress for ``hang_timeout`` s, the ranks behind the others (fewer
        steps begun, fewer collectives launched) or silent are hung: killed and routed around. Ranks
        all at the same point (a deadlock) are left to the cell's own timeout."""
        hang_s = float(self.settings.get("hang_timeout", 60.0))
        now, members = time.monotonic(), self.members()
        beacons = self.rooms.beacons
        progress = {}
        for r in members:
            beat = self.beat(r) or {}
            trainer = beat.get("trainer") or {}
            mark = (trainer.get("begun", 0), beat.get("launched", 0) - trainer.get("base", 0))
            last = self._progress.get(r.engine_id)
            if last is None or last[0] != mark:
                self._progress[r.engine_id] = (mark, now)
            progress[r.engine_id] = mark
        if not members or any(now - self._progress[r.engine_id][1] < hang_s for r in members
                              if beacons.silent_for(r.rank) < hang_s):
            return  # someone moved lately
        ahead = max(progress.values())
        stalled = [r for r in members if beacons.silent_for(r.rank) > hang_s or progress[r.engine_id] < ahead]
        if not stalled or len(members) - len(stalled) < self.settings.get("min_ranks", 1):
            return
        self.rooms.group.signal(stalled, signal.SIGKILL, breaks_group=False)
        self.lost(stalled, f"hung for {hang_s:g} s (killed)", kind="hang", detect_s=hang_s)


def _in_generation(beat: dict | None, generation: int) -> bool:
    """Whether a beacon shows its engine in group ``generation`` or waiting for it (no beacon: not known to).

    >>> _in_generation({"generation": 3, "regroup": {"generation": 4}}, 4), _in_generation(None, 4)
    (True, False)
    >>> _in_generation({"generation": 3, "regroup": {"generation": 3}}, 4)
    False
    """
    if not beat:
        return False
    return beat.get("generation", -1) >= generation or \
        ((beat.get("regroup") or {}).get("generation", -1) >= generation)


def unanswered(members: list[RankInfo], beats, generation: int, after: float,
               quiet: float = REPLAN_QUIET_S) -> list[RankInfo]:
    """The members of regroup ``generation`` the others have waited for longer than ``after`` s and that
    have been silent for ``quiet`` s meanwhile (stopped, or hung holding the interpreter: a member that
    is only slow to come still beacons, and is waited for). ``beats``: the latest beacon of every
    engine; a waiting member's says ``regroup``: ``missing`` (new rank numbers) and ``since`` (the wall
    clock, as the beacon's ``t``). Members that wait themselves are never among them.

    >>> from workbench.pool.rankmap import RankInfo
    >>> ms = [RankInfo(i, i, 0, "n1", 100 + i, "cpu", i) for i in range(3)]
    >>> wait = {"generation": 4, "missing": [2], "since": 10.0}
    >>> [r.rank for r in unanswered(ms, [{"pid": 100, "regroup": wait, "t": 16.0}], 4, 5.0)]
    [2]
    >>> unanswered(ms, [{"pid": 100, "regroup": wait, "t": 12.0}], 4, 5.0)
    []
    >>> unanswered(ms, [{"pid": 100, "regroup": wait, "t": 16.0}, {"pid": 102, "t": 15.9}], 4, 5.0)
    []
    """
    pids = {r.pid for r in members}
    missing: set[int] = set()
    waiting: set[int] = set()
    heard = {beat.get("pid"): beat.get("t", 0) for beat in beats}
    now = 0.0
    for beat in beats:
        wait = (beat or {}).get("regroup") or {}
        if beat.get("pid") not in pids or wait.get("generation") != generation:
            continue
        waiting.add(beat["pid"])
        now = max(now, beat.get("t", 0))
        if beat.get("t", 0) - wait.get("since", 0) > after:
            missing |= set(wait.get("missing") or [])
    return [r for r in members if r.rank in missing and r.pid not in waiting
            and now - heard.get(r.pid, float("-inf")) > quiet]
