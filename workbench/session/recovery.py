"""The recovery room: restart, scale, and bringing a lost rank back, between cells and during one.

:class:`Recovery` is what ``%dist restart`` and ``%dist scale N`` (``Session.restart`` and
``Session.scale``, which forward here) do to a pool: new engines for dead ranks on the same host and
device, the pool grown or shrunk, and the group re-formed; or, while an elastic run goes on
(``%%distributed --async``), new engines set up by replaying the notebook's setup (:class:`Transcript`)
and handed to the running cell, which lets them join at its next step boundary
(:class:`~workbench.session.cell_elastic.ElasticWatch`). A Trainer with ``ElasticConfig(replace=True)``
that loses a rank has it brought back by the run's size keeper
(:class:`~workbench.session.target_size.SizeKeeper`), which starts and sets up new engines with the
functions here. Off this machine the pool's
launcher says where a new engine starts (:meth:`~workbench.pool.launch.base.Launcher.where_to_start`: an
ssh host, a step of the Slurm job) or, in one sentence, why it cannot (MPI; a Slurm job that lost the node).

It may import :mod:`workbench.pool` (rank maps, GPU fit), :mod:`workbench.remote` (the catalogue: its
sends go through the pool's door) and the errors; it holds no pool and no group of its own: it is handed
the session's rooms whole (:class:`~workbench.session.rooms.Rooms`).

>>> s.restart(progress=print)        # doctest: +SKIP
starting 1 engine(s) for rank 1
re-forming the process group
[1]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from workbench import remote
from workbench.errors import RankDiedError, WorkbenchError
from workbench.pool.rankmap import RankInfo, extend_rank_map, format_ranks, remap_engines, remap_moved
from workbench.session.target_size import RunEnded

if TYPE_CHECKING:
    from workbench.session.cell_elastic import ElasticWatch
    from workbench.session.rooms import Rooms

Progress = Callable[[str], None]


class Recovery:
    """Restart, scale and bring back the ranks of one session's pool.

    ``rooms``: the session's rooms: the group, health (dead ranks), beacons, the transcript of the
    notebook's setup, the door; the session's turn on the pool (:meth:`~workbench.session.rooms.Rooms.held`),
    re-forming the group (:meth:`~workbench.session.rooms.Rooms.reform`) and the elastic run going on now,
    if any (:meth:`~workbench.session.rooms.Rooms.elastic_run`).
    """

    def __init__(self, rooms: Rooms):
        self.rooms = rooms

    def restart(self, progress: Progress = lambda msg: None) -> list[int]:
        """New engines for every dead rank (and every rank an elastic run went on without), then the group
        re-formed; during an elastic run they join it at its next step boundary. Returns their ranks."""
        rooms = self.rooms
        running = rooms.elastic_run()
        if running is not None:
            try:
                return restart_running(rooms, running, progress)
            except RunEnded:  # the run ended meanwhile: the restart happens between cells
                pass
        group = rooms.group
        with rooms.held("a restart"):  # the health watcher waits for the new ranks too
            t0 = time.perf_counter()
            dead = sorted(dict(rooms.health.dead))
            lost = list(group.lost) or [group.ranks[r] for r in dead]
            launcher = group.pool.launcher  # ssh: which hosts answer
            hosts = launcher.where_to_start(group.pool, lost, group.ranks, progress) if lost else None
            if group.lost:  # an elastic run went on without them: new engines, set up, then join
                dead += [r.rank for r in replace_lost(rooms, progress, hosts)]
            elif dead:
                progress(f"starting {len(dead)} engine(s) for rank {', '.join(map(str, dead))}")
                left_out = {r: group.ranks[r] for r in dead if r in group.left_out}  # by a sub-mesh's run
                group.replace(dead, hosts)
                for rank, old in left_out.items():
                    set_up_in_mesh(rooms, group.ranks[rank], old, [*left_out], progress)
            progress("re-forming the process group")
            rooms.reform(t0)
            return dead

    def scale(self, n: int, progress: Progress = lambda msg: None) -> list[RankInfo]:
        """Grow or shrink to ``n`` ranks and re-form the group at that size (during an elastic run, ranks
        join or leave at its next step boundary). Returns the new rank map."""
        check_size(n)
        rooms, config = self.rooms, self.rooms.config
        running = rooms.elastic_run()
        if running is not None:
            try:
                return scale_running(rooms, running, n, progress)
            except RunEnded:  # the run ended meanwhile: the scale happens between cells
                pass
        group = rooms.group
        with rooms.held("a scale"):
            t0 = time.perf_counter()
            dead = sorted(rooms.health.dead)
            if dead:  # to the survivors (or fewer): the dead ranks are left behind
                left = len(group.ranks) - len(dead)
                if n > left:
                    raise RankDiedError(f"rank {format_ranks(dead)} is dead: `%dist restart` brings it back, "
                                        f"or `%dist scale {left}` goes on with the {left} ranks left.")
                progress(f"going on without rank {format_ranks(dead)}")
                group.drop(dead)
            if n > len(group.ranks):
                group.pool.launcher.check_gpu_fit(n)
            before = {r.engine_id for r in group.ranks}
            resized = group.resize(n, progress, share_gpus=config.share_gpus)
            if resized:
                new = [r for r in group.ranks if r.engine_id not in before]
                set_up(rooms, new, progress)
            if resized or dead:
                progress(f"re-forming the process group at world size {n}")
                rooms.reform(t0)
        return list(group.ranks)


def check_size(n: int) -> None:
    """A pool has at least one rank.

    >>> check_size(0)
    Traceback (most recent call last):
    ...
    ValueError: a pool needs at least one rank (got 0).
    """
    if n < 1:
        raise ValueError(f"a pool needs at least one rank (got {n}).")


class Transcript:
    """The cells and pushes that ran on every rank, in order: the setup a new engine replays before it
    joins an elastic run (a fresh engine has none of the notebook's objects).

    The replay stops at the cell that built as many elastic Trainers as the running ranks have built
    (the one that runs is the newest), so later cells (training, saving, exporting) are not repeated;
    ``Trainer.run`` does nothing meanwhile. The new engine replays in a group of its own, where every
    collective is a no-op; its model, optimizer and data position then come from a peer when it joins.
    """

    def __init__(self):
        self.items: list[tuple[str, object]] = []
        self.only: dict[int, frozenset[int]] = {}  # item -> the engines it ran on, where not every rank

    def cell(self, code: str, engines=None) -> None:
        """``code`` ran on every rank, or only on ``engines`` (engine ids: every rank of one sub-mesh):
        a new engine replays it only where it replaces one of them (:meth:`replay`'s ``replacing``)."""
        if engines is not None:
            self.only[len(self.items)] = frozenset(engines)
        self.items.append(("cell", code))

    def of(self, replacing=()) -> list[tuple[str, object]]:
        """What a new engine replays: what ran on every rank, and what ran on the engines it replaces
        (``replacing``: their ids), in order.

        >>> t = Transcript()
        >>> t.cell("x = 1"); t.cell("y = 2", engines=[5, 6]); t.cell("z = 3", engines=[7])
        >>> [code for _, code in t.of()], [code for _, code in t.of([6])]
        (['x = 1'], ['x = 1', 'y = 2'])
        """
        replacing = set(replacing)
        return [item for i, item in enumerate(self.items) if i not in self.only or self.only[i] & replacing]

    def push(self, values: dict) -> None:
        self.items.append(("push", dict(values)))

    def replay(self, door, group, infos: list[RankInfo], trainers: int, timeout: float,
               data: dict | None = None, replacing=()) -> None:
        """Run the setup on the engines of ``infos`` (through ``door``, the pool's) until each has built
        ``trainers`` elastic Trainers, whose data must match ``data`` (the running ranks' loader
        signature); ``replacing``: the engines they replace (a sub-mesh's cells that ran there are replayed
        too, :meth:`of`)."""
        for r in infos:
            # its standby store listens on its own address (off this machine: the one that reaches us)
            own = group.config.address if group.local else \
                door.call(remote.route_to, [r], group.config.address)[0]["address"]
            standby = door.call_one(remote.join_alone, r, device=r.device, backend=group.config.backend,
                                    timeout_s=group.config.timeout, channel=group.pool.channel,
                                    standby_address=own, stores_folder=group.stores_folder())
            group.note_standby(r, standby)  # once it joined, it may host a regroup like any member
        door.call(remote.set_replay, infos, True)
        built, cells = 0, 0
        try:
            for kind, item in self.of(replacing):
                if built >= trainers:
                    break
                if kind == "push":
                    door.push(infos, item)
                    continue
                cells += 1
                try:
                    door.replay_cell(infos, item, within=timeout)
                except Exception as exc:
                    ename, evalue = _remote(exc)
                    raise WorkbenchError(
                        f"the new engine could not replay the notebook's setup: cell {cells} raised "
                        f"{ename}: {evalue}. Run the setup on the new rank yourself (%%distributed "
                        "--ranks N), then the next trainer.run() brings it up to date.") from None
                built = min(door.call(remote.trainer_count, infos))
        finally:
            door.call(remote.set_replay, infos, False)
        if built < trainers:
            raise WorkbenchError(
                f"the new engine replayed the {cells} cells that ran on every rank, but they built "
                f"{built} elastic Trainer(s), not {trainers}: build the Trainer in a cell that runs on "
                "every rank (not --ranks), or run the setup on the new rank yourself.")
        if data is not None:
            try:
                door.call(remote.check_joining_data, infos, data)
            except Exception as exc:
                reason = _remote(exc)[1]
                raise WorkbenchError(f"the new engine cannot join the elastic run: {reason}") from None


def _remote(exc: Exception) -> tuple[str, str]:
    """(ename, evalue) of what an engine raised (ipyparallel's RemoteError, or the first of a
    CompositeError's), or of ``exc`` itself."""
    first = (getattr(exc, "elist", None) or [None])[0]
    if first is not None:
        return first[0], first[1]
    return getattr(exc, "ename", type(exc).__name__), getattr(exc, "evalue", str(exc))


def newest_elastic_run(rooms: Rooms, ranks: list[RankInfo], running: bool = False) -> dict | None:
    """The newest elastic Trainer of ``ranks`` (``serial``: how many they have built, ``data``: its
    loader's signature), or None when they have built none. During a run (``running``) their beacons
    say, the engines being busy; between cells the engines are asked (the last cell may have built one
    that has not run yet)."""
    if running:
        latest = rooms.beacons.latest
        found = [((latest.get(r.rank) or {}).get("trainer") or {}).get("elastic") for r in ranks]
    else:
        found = rooms.door.call(remote.newest_elastic_status, ranks) if ranks else []
    return max((f for f in found if f), key=lambda f: f["serial"], default=None)


def replace_lost(rooms: Rooms, progress, hosts: dict[str, int] | None = None) -> list[RankInfo]:
    """New engines for the ranks an elastic run went on without, on their hosts and devices (``hosts``:
    an ssh pool's placement, another host for one that did not answer), set up by replaying the
    notebook's setup; they get the next rank numbers. The caller re-forms the group."""
    group = rooms.group
    lost, pool = list(group.lost), group.pool
    progress(f"starting {len(lost)} engine{'s' if len(lost) != 1 else ''} for the rank"
             f"{'s' if len(lost) != 1 else ''} the elastic run lost")
    new_ids = pool.start_more(len(lost), set(pool.client.ids), alive=len(group.ranks), hosts=hosts)
    infos = new_ranks(group, new_ids, like=lost, moved=bool(hosts))
    set_up(rooms, infos, progress)
    group.adopt(infos)
    return infos


def set_up(rooms: Rooms, infos: list[RankInfo], progress, running: bool = False,
           peers: list[RankInfo] | None = None, replacing=(), keep: bool = False) -> None:
    """Give new engines the notebook's setup when the ranks have an elastic Trainer (else nothing: a
    plain new engine starts empty, as always). A setup that fails stops the new engines. ``running``:
    the ranks are running the Trainer (see :func:`newest_elastic_run`). ``peers``: the ranks whose
    Trainer counts (default: every other rank; a sub-mesh's: its own), ``replacing``: the engines the new
    ones replace (the cells that ran on them only are replayed too, :meth:`Transcript.of`); ``keep``: a
    setup that fails leaves the new engines running (they hold their ranks already)."""
    group = rooms.group
    if peers is None:
        peers = [r for r in group.ranks if r.engine_id not in {i.engine_id for i in infos}]
    newest = newest_elastic_run(rooms, peers, running)
    if newest is None:
        return
    progress(f"replaying the notebook's setup on the new engine{'s' if len(infos) != 1 else ''}")
    try:
        rooms.transcript.replay(rooms.door, group, infos, newest["serial"], group.config.timeout,
                                data=newest.get("data"), replacing=replacing)
    except WorkbenchError:
        if not keep:
            group.pool.stop_engines([r.engine_id for r in infos])
        raise


def set_up_in_mesh(rooms: Rooms, info: RankInfo, old: RankInfo, new: list[int], progress) -> None:
    """``info``, the new engine for ``old``, which a sub-mesh's elastic run went on without (``%dist restart``
    has put it back in that sub-mesh: :meth:`~workbench.session.group.ProcessGroup.replace`), gets the
    notebook's setup: the cells that ran on every rank and those that ran on ``old``'s sub-mesh with it, up to
    its peers' newest elastic Trainer (``new``: the pool ranks restarted now, no peers). Where that cannot be
    done the engine stays, empty (as a dead rank's new engine in a sub-mesh), and the notebook is told why."""
    group = rooms.group
    mesh = next(name for name, ranks in group.meshes.items() if info.rank in ranks)
    peers = [group.ranks[r] for r in group.meshes[mesh] if r not in new]
    try:
        set_up(rooms, [info], progress, peers=peers, replacing=[old.engine_id], keep=True)
    except WorkbenchError as exc:
        rooms.notify(f"workbench: rank {info.rank} is back in sub-mesh {mesh}, empty: {exc}")


def restart_running(rooms: Rooms, elastic: ElasticWatch, progress, timeout: float = 120.0) -> list[int]:
    """``%dist restart`` while an elastic run goes on (``elastic``: its cell's watch): new engines for the
    ranks it lost join it at its next step boundary, through the run's keeper (which aims at the run's size
    again, the bound on failed starts reset). Returns their new rank numbers.
    :class:`~workbench.session.target_size.RunEnded` when the run ends first."""
    keeper = elastic.keeper()
    before = {r.engine_id for r in rooms.group.ranks}
    n = keeper.target if keeper.auto and keeper.target is not None else \
        len(elastic.members()) + len(rooms.group.lost)
    if n > len(elastic.members()):
        progress(f"starting {n - len(elastic.members())} engine(s) for the ranks the run lost")
    keeper.aim(n)
    keeper.wait(n, timeout)
    return [r.rank for r in rooms.group.ranks if r.engine_id not in before]


def scale_running(rooms: Rooms, elastic: ElasticWatch, n: int, progress, timeout: float = 120.0
                  ) -> list[RankInfo]:
    """``%dist scale N`` while an elastic run goes on: the run's keeper aims at ``N`` ranks from now on (it
    is never above them); ranks join or leave at its next step boundary. Returns the rank map once the run
    has ``N`` members; :class:`~workbench.session.target_size.RunEnded` when the run ends first."""
    keeper = elastic.keeper()
    if n > len(elastic.members()):
        rooms.group.pool.launcher.check_gpu_fit(n)
        progress(f"starting {n - len(elastic.members())} engines")
    keeper.aim(n)
    if n < len(elastic.members()):
        shrink_running(rooms, elastic, n, progress, timeout)
    keeper.wait(n, timeout)
    return list(rooms.group.ranks)


def shrink_running(rooms: Rooms, elastic: ElasticWatch, n: int, progress, timeout: float = 120.0
                   ) -> list[RankInfo]:
    """The elastic run going on keeps its first ``n`` ranks from the next step boundary; the others end
    their run there and their engines stop. Returns the ranks that left (their old numbers)."""
    leave = elastic.request("leave", n).result(timeout)  # RunEnded when the run ends first
    if not leave:  # a loss meanwhile took the run down to n
        return []
    progress(f"rank {format_ranks(r.rank for r in leave)} leave{'s' if len(leave) == 1 else ''} at the next "
             "step boundary")
    gone = {r.engine_id for r in leave}
    _until(lambda: all(c.done() for r, c in elastic.children if r.engine_id in gone), timeout)
    rooms.group.pool.stop_engines(sorted(gone))
    return leave


def new_ranks(group, ids: list[int], like: list[RankInfo] = (), moved: bool = False) -> list[RankInfo]:
    """RankInfos for new engines ``ids``, numbered after the group's ranks: on the host and device of the
    ranks they replace (``like``; ``moved``: or on the host they were started on instead), else where
    ``%dist scale`` would put them. Only the new engines are asked who they are (the running ones are
    busy with the cell)."""
    engines = group.describe(ids)
    if like and moved:
        infos = remap_moved(list(like), engines, group.ranks)
    elif like:
        infos = remap_engines(list(like), engines)
    else:
        infos = []
    taken = {r.engine_id for r in infos}
    rest = [e for e in engines if e.engine_id not in taken]  # more new engines than lost ranks: a scale
    if rest:
        known = [*group.ranks, *infos]
        infos += extend_rank_map(known, rest, share_gpus=group.config.share_gpus)[len(known):]
    return [replace(r, rank=len(group.ranks) + i) for i, r in enumerate(infos)]


def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
