"""The composition root: the rooms of one pool, built once, the same way for a pool started here or attached.

:class:`Rooms` builds and owns what a session drives a pool with: the door
(:class:`~workbench.remote.door.Door`, the one transport to the engines), the process group (:mod:`.group`),
the beacons (the pool's :class:`~workbench.pool.watch.beacons.BeaconReceiver`), health (:mod:`.health`: dead
ranks, the fault log), the pool as other notebooks share it (:mod:`.shared`), recovery (:mod:`.recovery`), the
stacks gatherer (:mod:`.stack_report`), the metrics collector (:mod:`workbench.metrics.collector`), the
transcript of the notebook's setup and where the ranks work (:mod:`.folders`). It is handed whole to the cell
(:class:`~.cell_run.CellRun`) and to recovery, which reach the rooms through it instead of through callbacks.
Its own jobs are what spans rooms: forming the group and keeping the other rooms in step with it, the pool's
turn, the checks before a cell, the pool's state in one line or a table, and closing.

:class:`~workbench.session.Session` makes one once its pool runs and forwards its verbs to it.

>>> rooms = Rooms(pool, config, role="started", notify=print)      # doctest: +SKIP
>>> rooms.group.seat(build_rank_map(rooms.group.describe(pool.client.ids)))   # doctest: +SKIP
>>> rooms.form()                                                   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from workbench import remote
from workbench.config import PoolConfig
from workbench.errors import PoolGone, RankDiedError
from workbench.pool.cluster import EnginePool
from workbench.pool.rankmap import RankInfo, format_ranks, parse_ranks, ranks_named
from workbench.pool.records import sharing
from workbench.pool.watch.beacons import BeaconReceiver
from workbench.pool.watch.queues import rank_states
from workbench.remote.door import Door
from workbench.session.cell_run import CellRun
from workbench.session.folders import Folders
from workbench.session.group import ProcessGroup
from workbench.session.health import Health
from workbench.session.losses import fenced_rows
from workbench.session.meshes import WHOLE, keys_for, mesh_of, resolve_on
from workbench.session.recovery import Recovery, Transcript
from workbench.session.results import CellResult
from workbench.session.shared import Shared
from workbench.session.stack_report import StackGatherer
from workbench.session.turns import Turn, Turns, behind

log = logging.getLogger(__name__)


class Rooms:
    """The rooms of ``pool`` (started here: ``role="started"``, or ``"attached"``), built once.

    ``notify`` says what a person should know between the lines of a cell (another notebook holds the
    pool, a cell runs on the living ranks only).
    """

    def __init__(self, pool: EnginePool, config: PoolConfig, *, role: str, notify: Callable[[str], None]):
        from workbench.metrics.collector import Collector

        if not pool.channel:
            raise AssertionError("a running pool has its side channel (its state file records it)")
        self.pool, self.config, self.notify = pool, config, notify
        self.busy = Turns()  # held while a cell (on its sub-meshes), a restart, a scale of this session runs
        self.door = Door(pool)
        self.group = ProcessGroup(pool, config, self.door)
        # subscribed before the ranks join, so their first records wait for us
        self.beacons = BeaconReceiver(pool.channel, on_fenced=self.group.fence)  # a lost engine heard: told
        self.stacks = StackGatherer(pool.channel)  # subscribed now: the first `%dist stacks` is answered
        self.metrics = Collector(pool.channel)
        self.shared = Shared(pool, self.group, role=role)
        self.health = Health(pool_id=pool.pool_id, beacons=self.beacons,
                             pool_running=lambda: not self.shared.gone(),
                             endpoints=lambda: self.group.endpoints, lost_hosts=pool.lost_hosts,
                             quiet=self._quiet_on)
        self.transcript = Transcript()  # what ran on every rank: a new engine's setup
        self.folders = Folders(self.door, config.timeout)
        self.recovery = Recovery(self)
        self.cells: list[CellRun] = []  # the cells running now (on disjoint sub-meshes in a split pool)
        self.submitted: list[CellRun] = []  # cells submitted in the background, from submit to their end
        self.closed = False

    @property
    def local(self) -> bool:
        """Every engine runs on this machine (the pool's launcher says)."""
        return self.pool.launcher.on_this_machine

    # -- the group, and the rooms kept in step with it ----------------------------------------------
    def form(self, reform: bool = False, only=None, meshes: dict[str, list[int]] | None = None) -> None:
        """(Re-)form the group on every rank (``only``: the groups of those sub-meshes; ``meshes``: split into
        these, ``{}``: join), then watch the ranks and (re)connect their metrics."""
        ranks = self.group.ranks if only is None else \
            [r for name in sorted(only) for r in self.group.mesh_ranks(name)]  # the others may run a cell
        if meshes is not None:
            self.group.split(meshes)
            ranks = self.group.ranks
        elif reform:
            self.group.reform(ranks, only)
        else:
            self.group.form()
        self.follow_membership()
        try:  # every formed rank's publisher (re)connects: metrics never stop a pool
            self.door.call(remote.connect_metrics, ranks, self.pool.channel)
        except Exception:
            log.warning("live metrics are off: the ranks' publishers did not start", exc_info=True)

    def reform(self, since: float | None = None, only=None) -> None:
        """Re-form the group after a fault (``only``: those sub-meshes' groups); the fault counts as recovered
        from (``since``: when it began)."""
        t0 = time.perf_counter() if since is None else since
        self.form(reform=True, only=only)
        self.health.recovered(time.perf_counter() - t0)

    def follow_membership(self) -> None:
        """Watch the ranks of the group now formed and publish them (also after an elastic regroup)."""
        ranks = self.group.ranks
        self.health.watch(ranks, local=self.local, announced=self.group.left_out)  # their loss was said
        self.beacons.fence([r.host, r.pid] for r in self.group.fenced)  # refused, told to stop when heard
        self.shared.publish(ranks=[r.__dict__ for r in ranks], backend=self.group.backend,
                            backend_requested=self.config.backend, generation=self.group.generation,
                            endpoints=self.group.endpoints, group_ok=True, meshes=self.group.published())
        self.metrics.set_ranks(ranks)
        self.metrics.set_meshes(self.group.meshes)

    def catch_up(self) -> None:
        """Take in what another notebook changed (:class:`PoolGone` if it stopped the pool)."""
        ranks = self.shared.catch_up()
        if ranks is not None:
            self.health.watch(ranks, local=self.local, announced=self.group.left_out)
            self.metrics.set_ranks(ranks)
            self.metrics.set_meshes(self.group.meshes)

    # -- turns and checks ----------------------------------------------------------------------------
    def check(self) -> None:
        """A pool stopped elsewhere (another notebook, the panel, its lease), or whose controller exited,
        ends this session in one line (its rooms closed: :meth:`close`)."""
        if self.shared.gone():
            self.close(end_pool=not self.pool.attached, note=False)  # whoever stopped it said so already
            self.shared.catch_up()  # raises PoolGone with who stopped it and when
        pid = self.pool.controller_exited()
        if pid is not None:  # every request to the ranks would wait for ever: end what is left, say so
            owner = not self.pool.attached
            self.close(end_pool=owner)
            raise PoolGone(f"the pool's controller (pid {pid}) exited, so no rank can be reached: "
                           + ("the pool was stopped (its engines ended); `%dist start` starts a new one."
                              if owner else "its owner stops it at its next command, or `workbench stop` "
                              "from a terminal; `%dist start` starts a new one."))

    @contextlib.contextmanager
    def turn(self, what: str, ranks: list[int] | None = None):
        """This session's turn on ``ranks`` (pool ranks; None: the whole pool): no other cell of this process
        or another notebook on them meanwhile, caught up with what the others changed. In a split pool a
        turn holds the sub-meshes of its ranks (:mod:`.turns`): cells on other sub-meshes run meanwhile; one
        that must wait says once behind what. Should another notebook have split or joined the pool while
        this one waited, the turn is taken again for the sub-meshes there are now."""
        def keys():  # read under the turns' lock: a split of this process in progress holds the whole pool
            return {WHOLE} if ranks is None else keys_for(self.group.meshes, ranks)

        if ranks is not None:  # a first look without the lock: a split made elsewhere decides which turn to
            self.check()       # wait for (else this notebook would wait for the whole pool, its old view)
            self.catch_up()
        while True:
            with self.busy.held(keys, what, waiting=self._behind) as mine:
                self.check()
                with self.shared.held(self.notify, what=what, keys=mine.keys):
                    self.catch_up()
                    if keys() == mine.keys:
                        yield
                        return

    def _behind(self, turns: list[Turn]) -> None:
        """Say once behind what a turn of this session waits (another cell of this notebook)."""
        meshes = self.group.meshes
        self.notify("workbench: " + behind(turns, lambda name: format_ranks(meshes.get(name, []))))

    @contextlib.contextmanager
    def held(self, what: str):
        """This session's turn on the whole pool, for a restart, a scale, a split or a join."""
        with self.turn(what):
            yield

    def _quiet_on(self, ranks: list[int]):
        """A turn on ``ranks`` if no cell of this session runs there (what ends it), else None: the health
        watcher reports a death in an idle sub-mesh at once, while another sub-mesh's cell runs."""
        turn = self.busy.try_hold(lambda: keys_for(self.group.meshes, ranks), "a death report")
        return None if turn is None else (lambda: self.busy.give(turn))

    def busy_on(self, ranks: list[int]) -> bool:
        """Whether a cell (a restart ...) of this session runs on ``ranks`` now: on their sub-meshes, in a
        split pool; a cell submitted in the background counts from the moment ``submit`` returned."""
        if any(set(ranks) & {r.rank for r in cell.targets} for cell in list(self.submitted)):
            return True
        return bool(self.busy.now(keys_for(self.group.meshes, ranks)))

    def submit(self, cell: CellRun) -> None:
        """Count ``cell`` as running from now, before its thread takes its turn, until it ends."""
        self.submitted.append(cell)

    def in_use(self) -> bool:
        """A cell of this session runs, or any notebook's cell ran since the last look (attached notebooks
        too: a kept pool's owner is the Jupyter server, its cells come from kernels)."""
        return self.busy.locked() or self.shared.lock.used()

    def resolve(self, ranks=None, on: str | None = None) -> list[RankInfo]:
        """``None`` (all), a rank, a list of ranks or a spec like ``"0,2-3"``: the ranks, checked; ``on``: the
        ranks of that sub-mesh (``ranks``, if given, are pool ranks within it)."""
        world = self.group.ranks
        if ranks is None and on is None:
            return list(world)
        if isinstance(ranks, str):
            ranks = parse_ranks(ranks, len(world))
        elif isinstance(ranks, int):
            ranks = [ranks]
        bad = [r for r in ranks or () if not 0 <= r < len(world)]
        if bad:
            raise ValueError(f"rank {bad[0]} is out of range: this pool has ranks 0-{len(world) - 1}.")
        if on is not None:
            ranks = resolve_on(self.group.meshes, on, ranks)
        return [world[r] for r in sorted(set(ranks))]

    # -- sub-meshes ----------------------------------------------------------------------------------
    def split(self, meshes: dict[str, list[int]]) -> None:
        """Form one default group per sub-mesh (``{}``: one of all, a join), in the whole pool's turn, Python
        state kept; then watch the ranks and reconnect their metrics as after any forming."""
        with self.held("a split" if meshes else "a join"):
            dead = self.health.dead
            if dead:
                raise RankDiedError(f"rank {format_ranks(sorted(dead))} is dead: `%dist restart` brings it "
                                    "back first (a split or a join forms a group on every rank).")
            self.form(meshes=meshes)

    def ensure_group(self, targets: list[RankInfo] | None = None) -> None:
        """Before a cell: refuse with dead ranks among ``targets`` (default: all), re-form a process group
        that a fault aborted. A cell on living ranks only runs, with a warning (to save their state before
        ``%dist restart``): the group is not re-formed without the dead ranks. In a split pool only the dead
        ranks of the cell's sub-meshes count: another sub-mesh's group is not this cell's."""
        dead = dict(self.health.dead)
        meshes = self.group.meshes
        if dead and targets is not None and meshes:
            aimed = {r.rank for r in targets}  # a rank a sub-mesh's elastic run left out is in no sub-mesh
            mine = keys_for(meshes, aimed)
            dead = {rank: how for rank, how in dead.items() if mesh_of(meshes, rank) in mine or rank in aimed}
        if dead and targets is not None and not {r.rank for r in targets} & dead.keys():
            self.notify(f"workbench: rank {format_ranks(sorted(dead))} is dead: this cell runs on rank "
                        f"{format_ranks([r.rank for r in targets])} only, and a collective with the dead "
                        "rank fails; `%dist restart` brings it back and re-forms the process group.")
            return
        if dead:
            rank = min(dead)
            raise RankDiedError(f"{self.group.ranks[rank].label()} is dead ({dead[rank]}): `%dist restart` "
                                "(Session.restart()) starts a new engine for it and re-forms the process "
                                "group.")
        self.group.heard_groups(self.beacons.latest)  # a cell before may have destroyed it without an error
        ranks = [r.rank for r in (self.group.ranks if targets is None else targets)]
        keys = keys_for(self.group.meshes, ranks)
        broken = self.group.broken_in(keys)
        if broken:  # in a split pool: only the sub-meshes of this cell (another may run a cell meanwhile)
            self.reform(only=None if WHOLE in broken else broken)

    # -- cells ---------------------------------------------------------------------------------------
    def run_cell(self, cell: CellRun, code: str) -> CellResult:
        """Run ``cell`` (made for ``code``) in this session's turn on the pool; what ran on every rank is
        kept for a new engine's setup."""
        ranks = [r.rank for r in cell.targets]
        try:
            with self.turn("a cell", ranks):
                # another notebook may have restarted or re-formed ranks while this one waited
                cell.targets = self.resolve(ranks)
                self.ensure_group(cell.targets)
                self.folders.follow(cell.targets)
                self.cells.append(cell)
                try:
                    result = cell.run(code)  # new engines on their way into an elastic run stop at its end
                finally:
                    self.cells.remove(cell)
        finally:  # a background cell ended, or its turn was refused (the pool stopped meanwhile)
            if cell in self.submitted:
                self.submitted.remove(cell)
        if len(cell.targets) == len(self.group.ranks) or cell.elastic.dropped and not cell.elastic.mesh:
            self.transcript.cell(code)  # every rank ran it
        elif self._whole_mesh(cell.targets) or cell.elastic.dropped:  # every rank of one sub-mesh ran it
            self.transcript.cell(code, engines=[r.engine_id for r in cell.targets])
        return result

    def _whole_mesh(self, targets: list[RankInfo]) -> bool:
        """Whether ``targets`` are every rank of one sub-mesh (a new engine there replays their cells)."""
        ranks = sorted(r.rank for r in targets)
        return any(ranks == sorted(members) for members in self.group.meshes.values())

    def elastic_run(self):
        """The :class:`~.cell_elastic.ElasticWatch` of the cell running an elastic Trainer now, if any (it
        takes ranks in and out at a step boundary). Not a sub-mesh's run: ranks do not join one during it
        (a restart waits for its cell to end, in the whole pool's turn)."""
        return next((cell.elastic for cell in list(self.cells)
                     if not cell.elastic.mesh and cell.elastic.active() is not None), None)

    @property
    def running(self) -> CellRun | None:
        """The cell running now, the first of them where cells run on several sub-meshes (None: none)."""
        cells = list(self.cells)
        return cells[0] if cells else None

    # -- the pool in one line, and in a table -------------------------------------------------------
    def group_state(self) -> str:
        """The process group in one line (see :meth:`workbench.session.Session.group_state`)."""
        dead = self.health.dead
        if dead:
            return (f"process group: broken, {ranks_named(sorted(dead))} dead; cells on the other "
                    "ranks run, `%dist restart` brings it back and re-forms the group")
        if not self.cells:
            self.group.heard_groups(self.beacons.latest)  # between cells only: a regroup changes them
        if self.group.destroyed:
            return (f"process group: destroyed on {ranks_named(self.group.destroyed)} (torch's own "
                    "destroy_process_group, not the pool's deferred one); the next cell re-forms it")
        group = self.group
        if group.meshes:
            return "process groups: " + "; ".join(
                f"sub-mesh {name} (ranks {format_ranks(ranks)}): "
                + ("aborted after a fault; its next cell re-forms it" if group.broken_in({name}) else
                   f"formed (backend {group.backend}, world size {len(ranks)})")
                for name, ranks in group.meshes.items())
        if not group.ok:
            return "process group: aborted after a fault; the next cell re-forms it"
        return f"process group: formed (backend {group.backend}, world size {len(group.ranks)})"

    def status(self) -> list[dict]:
        """One row per rank, then one per engine declared lost (:meth:`workbench.session.Session.status`)."""
        ranks = self.group.ranks
        states = rank_states(self.pool.client, {r.rank: r.engine_id for r in ranks},
                             dead=dict(self.health.dead))
        beats = self.beacons.latest
        # the engines in an elastic run's plan, not trained in it yet
        joining = {eid for cell in list(self.cells) for eid in cell.elastic.joining}
        meshes = self.group.meshes
        rows = [{"rank": r.rank, **({"mesh": mesh_of(meshes, r.rank)} if meshes else {}),
                 "host": self.pool.host_label(r.host), "pid": r.pid, "device": r.device,
                 "state": "joining" if r.engine_id in joining else states[r.rank],
                 "started": (beats.get(r.rank) or {}).get("children") or []}  # processes it started
                for r in ranks]
        lost = self.group.fenced
        return rows + fenced_rows(lost, self.beacons, self.pool.fenced_ended({r.pid for r in lost}))

    # -- the end ---------------------------------------------------------------------------------------
    def close(self, end_pool: bool, by: str | None = None, note: bool = True) -> None:
        """Close every room (the health room writes a pending fault to the log); then the pool ends
        (``end_pool``; ``note``: leave a note saying ``by`` whom, for the notebooks still attached) or this
        process only lets go of it. Twice is once."""
        if self.closed:
            return
        self.closed = True
        for room in (self.health, self.door, self.metrics, self.beacons, self.stacks, self.shared):
            room.close()
        pool = self.pool
        if end_pool:
            if note:  # first: a notebook that finds the pool gone at once is told who stopped it
                sharing.note_stopped(pool.pool_id, pool.name, by or sharing.this_notebook())
            pool.stop(grace=0.5)  # an engine with torch._dynamo takes ~3 s to exit: its state is thrown away
        else:
            pool.close()
