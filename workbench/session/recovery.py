"""The recovery room: restart, scale, and bringing a lost rank back, between cells and during one.

:class:`Recovery` is what ``%dist restart`` and ``%dist scale N`` (``Session.restart`` and
``Session.scale``, which forward here) do to a pool: new engines for dead ranks on the same host and
device, the pool grown or shrunk, and the group re-formed; or, while an elastic run goes on
(``%%distributed --async``), new engines set up by replaying the notebook's setup (:class:`Transcript`)
and handed to the running cell, which lets them join at its next step boundary
(:class:`~workbench.session.cell_elastic.ElasticWatch`). A Trainer with ``ElasticConfig(replace=True)``
that loses a rank has it brought back here too (:meth:`Recovery.bring_back`). Off this machine the pool's
launcher says where a new engine starts (:mod:`workbench.session.hosts_back`: an ssh host, a step of
the Slurm job) or, in one sentence, why it cannot (MPI; a Slurm job that lost the node).

It may import :mod:`workbench.pool` (rank maps, GPU fit), :mod:`workbench.remote` (the one door) and the
errors; it holds no pool and no group of its own: the session hands it its rooms.

>>> s.restart(progress=print)        # doctest: +SKIP
starting 1 engine(s) for rank 1
re-forming the process group
[1]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from workbench import remote
from workbench.config import PoolConfig
from workbench.errors import RankDiedError, WorkbenchError
from workbench.pool.machine.devices import check_gpu_fit, visible_gpu_count
from workbench.pool.rankmap import RankInfo, extend_rank_map, format_ranks, remap_engines, remap_moved
from workbench.session.hosts_back import where_to_start

Progress = Callable[[str], None]


class Recovery:
    """Restart, scale and bring back the ranks of one session's pool.

    The session hands it its rooms: ``group`` (:class:`~workbench.session.group.ProcessGroup`),
    ``health`` (dead ranks), ``beacons``, the ``transcript`` of the notebook's setup, and what only the
    session does: ``turn(what)`` (its lock and the pool's turn), ``reform(since)`` (re-form the group and
    follow it) and ``elastic_cell()`` (the cell running an elastic Trainer now, or None).
    """

    def __init__(self, *, config: PoolConfig, group, health, beacons, transcript: Transcript,
                 turn: Callable, reform: Callable[[float], None], elastic_cell: Callable):
        self.config, self.group, self.health, self.beacons = config, group, health, beacons
        self.transcript = transcript
        self._turn, self._reform, self._elastic_cell = turn, reform, elastic_cell
        self._bringing_back = threading.Lock()  # one replacement at a time (ElasticConfig(replace=True))

    @property
    def local(self) -> bool:
        return self.config.launcher == "local"

    def restart(self, progress: Progress = lambda msg: None) -> list[int]:
        """New engines for every dead rank (and every rank an elastic run went on without), then the group
        re-formed; during an elastic run they join it at its next step boundary. Returns their ranks."""
        running = self._elastic_cell()
        if running is not None:
            return restart_running(running, self.transcript, self.beacons, progress)
        with self._turn("a restart"):  # the health watcher waits for the new ranks too
            t0 = time.perf_counter()
            dead = sorted(dict(self.health.dead))
            lost = list(self.group.lost) or [self.group.ranks[r] for r in dead]
            hosts = where_to_start(self.group, lost, progress) if lost else None  # ssh: which hosts answer
            if self.group.lost:  # an elastic run went on without them: new engines, set up, then join
                dead += [r.rank for r in replace_lost(self.group, self.transcript, progress, hosts)]
            elif dead:
                progress(f"starting {len(dead)} engine(s) for rank {', '.join(map(str, dead))}")
                self.group.replace(dead, hosts)
            progress("re-forming the process group")
            self._reform(t0)
            return dead

    def scale(self, n: int, progress: Progress = lambda msg: None) -> list[RankInfo]:
        """Grow or shrink to ``n`` ranks and re-form the group at that size (during an elastic run, ranks
        join or leave at its next step boundary). Returns the new rank map."""
        check_size(n)
        running = self._elastic_cell()
        if running is not None:
            return scale_running(running, n, self.transcript, self.beacons, progress)
        with self._turn("a scale"):
            t0 = time.perf_counter()
            dead = sorted(self.health.dead)
            if dead:  # to the survivors (or fewer): the dead ranks are left behind
                left = len(self.group.ranks) - len(dead)
                if n > left:
                    raise RankDiedError(f"rank {format_ranks(dead)} is dead: `%dist restart` brings it back, "
                                        f"or `%dist scale {left}` goes on with the {left} ranks left.")
                progress(f"going on without rank {format_ranks(dead)}")
                self.group.drop(dead)
            if n > len(self.group.ranks) and self.local:
                check_gpu_fit(n, visible_gpu_count(), share=self.config.share_gpus)
            before = {r.engine_id for r in self.group.ranks}
            resized = self.group.resize(n, progress, share_gpus=self.config.share_gpus)
            if resized:
                new = [r for r in self.group.ranks if r.engine_id not in before]
                set_up(self.group, new, self.transcript, progress)
            if resized or dead:
                progress(f"re-forming the process group at world size {n}")
                self._reform(t0)
        return list(self.group.ranks)

    def bring_back(self, cell) -> None:
        """An elastic Trainer with ``replace=True`` lost a rank: start its replacement in the background,
        set up by replaying the setup; it joins the run at a step boundary, as ``%dist restart`` would."""
        if self.config.launcher == "mpi":
            cell.elastic.report("an MPI pool cannot start an engine by itself (mpiexec cannot add a process "
                                "to a running world): the run goes on with the ranks it has")
            return
        say = (lambda message: None) if self.local else cell.elastic.report  # ssh: which host, said

        def replace_it() -> None:
            with self._bringing_back:
                try:
                    restart_running(cell, self.transcript, self.beacons, say)
                except ValueError as exc:  # the launcher cannot: the Slurm job lost the node, no host answers
                    cell.elastic.report(f"the lost rank was not brought back: {exc}")
                except Exception as exc:
                    cell.elastic.report(f"the lost rank was not brought back ({exc}); `%dist restart` "
                                        "tries again")

        thread = threading.Thread(target=replace_it, name="workbench-bring-back", daemon=True)
        cell.elastic.replacements.append(thread)
        thread.start()


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

    def cell(self, code: str) -> None:
        self.items.append(("cell", code))

    def push(self, values: dict) -> None:
        self.items.append(("push", dict(values)))

    def replay(self, group, infos: list[RankInfo], trainers: int, timeout: float, data: dict | None = None):
        """Run the setup on the engines of ``infos`` until each has built ``trainers`` elastic Trainers,
        whose data must match ``data`` (the running ranks' loader signature)."""
        client = group.pool.client
        for r in infos:
            # its standby store listens on its own address (off this machine: the one that reaches us)
            own = group.config.address if group.local else \
                client[r.engine_id].apply_sync(remote.route_to, group.config.address)["address"]
            client[r.engine_id].apply_sync(remote.join_alone, device=r.device, backend=group.config.backend,
                                           timeout_s=group.config.timeout, channel=group.pool.channel,
                                           standby_address=own,
                                           stores_folder=group.stores_folder())
        view = group.view(infos)
        view.apply_sync(remote.set_replay, True)
        built, cells = 0, 0
        try:
            for kind, item in self.items:
                if built >= trainers:
                    break
                if kind == "push":
                    view.push(item, block=True)
                    continue
                cells += 1
                try:
                    view.execute(item, silent=True, block=False).get(timeout=timeout)
                except Exception as exc:
                    ename, evalue = _remote(exc)
                    raise WorkbenchError(
                        f"the new engine could not replay the notebook's setup: cell {cells} raised "
                        f"{ename}: {evalue}. Run the setup on the new rank yourself (%%distributed "
                        "--ranks N), then the next trainer.run() brings it up to date.") from None
                built = min(view.apply_sync(remote.trainer_count))
        finally:
            view.apply_sync(remote.set_replay, False)
        if built < trainers:
            raise WorkbenchError(
                f"the new engine replayed the {cells} cells that ran on every rank, but they built "
                f"{built} elastic Trainer(s), not {trainers}: build the Trainer in a cell that runs on "
                "every rank (not --ranks), or run the setup on the new rank yourself.")
        if data is not None:
            try:
                view.apply_sync(remote.check_joining_data, data)
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


def newest_elastic_run(group, ranks: list[RankInfo], beacons=None) -> dict | None:
    """The newest elastic Trainer of ``ranks`` (``serial``: how many they have built, ``data``: its
    loader's signature), or None when they have built none. During a run (``beacons``) their beacons
    say, the engines being busy; between cells the engines are asked (the last cell may have built one
    that has not run yet)."""
    if beacons is not None:
        latest = beacons.latest
        found = [((latest.get(r.rank) or {}).get("trainer") or {}).get("elastic") for r in ranks]
    else:
        found = group.view(ranks).apply_sync(remote.newest_elastic_status) if ranks else []
    return max((f for f in found if f), key=lambda f: f["serial"], default=None)


def replace_lost(group, transcript: Transcript, progress, hosts: dict[str, int] | None = None
                 ) -> list[RankInfo]:
    """New engines for the ranks an elastic run went on without, on their hosts and devices (``hosts``:
    an ssh pool's placement, another host for one that did not answer), set up by replaying the
    notebook's setup; they get the next rank numbers. The caller re-forms the group."""
    lost, pool = list(group.lost), group.pool
    progress(f"starting {len(lost)} engine{'s' if len(lost) != 1 else ''} for the rank"
             f"{'s' if len(lost) != 1 else ''} the elastic run lost")
    new_ids = pool.start_more(len(lost), set(pool.client.ids), alive=len(group.ranks), hosts=hosts)
    infos = new_ranks(group, new_ids, like=lost, moved=bool(hosts))
    set_up(group, infos, transcript, progress)
    group.adopt(infos)
    return infos


def set_up(group, infos: list[RankInfo], transcript: Transcript, progress, beacons=None) -> None:
    """Give new engines the notebook's setup when the ranks have an elastic Trainer (else nothing: a
    plain new engine starts empty, as always). A setup that fails stops the new engines. ``beacons``:
    the ranks are running the Trainer (see :func:`newest_elastic_run`)."""
    newest = newest_elastic_run(group, [r for r in group.ranks if r.engine_id not in
                                        {i.engine_id for i in infos}], beacons)
    if newest is None:
        return
    progress(f"replaying the notebook's setup on the new engine{'s' if len(infos) != 1 else ''}")
    try:
        transcript.replay(group, infos, newest["serial"], group.config.timeout, data=newest.get("data"))
    except WorkbenchError:
        group.pool.stop_engines([r.engine_id for r in infos])
        raise


def restart_running(cell, transcript: Transcript, beacons, progress) -> list[int]:
    """``%dist restart`` while an elastic run goes on: new engines for the ranks it lost join it at its
    next step boundary. Returns their new rank numbers."""
    group = cell.group
    lost = list(group.lost)
    if not lost:
        return []
    hosts = where_to_start(group, lost, progress)  # ssh: the lost ranks' hosts if they answer
    progress(f"starting {len(lost)} engine{'s' if len(lost) != 1 else ''} for the lost rank"
             f"{'s' if len(lost) != 1 else ''}")
    infos = new_ranks(group, group.pool.start_more(len(lost), set(group.pool.client.ids),
                                                       alive=len(group.ranks), hosts=hosts),
                      like=lost, moved=bool(hosts))
    try:
        joined = grow_running(cell, infos, transcript, beacons, progress)
    except WorkbenchError:
        raise  # the setup failed: set_up stopped the new engines
    except Exception:  # the run ended before they could join: no engine is left outside the group
        group.pool.stop_engines([r.engine_id for r in infos if r.engine_id not in
                                 {k.engine_id for k in group.ranks}])
        raise
    group.forget_lost(lost)
    return [r.rank for r in joined]


def scale_running(cell, n: int, transcript: Transcript, beacons, progress) -> list[RankInfo]:
    """``%dist scale N`` while an elastic run goes on: ranks join or leave at its next step boundary."""
    group = cell.group
    if n > len(group.ranks):
        progress(f"starting {n - len(group.ranks)} engines")
        infos = new_ranks(group, group.pool.start_more(n - len(group.ranks), set(group.pool.client.ids),
                                                         alive=len(group.ranks)))
        grow_running(cell, infos, transcript, beacons, progress)
    elif n < len(group.ranks):
        shrink_running(cell, n, progress)
    return list(group.ranks)


def grow_running(cell, infos: list[RankInfo], transcript: Transcript, beacons, progress,
                 timeout: float = 120.0) -> list[RankInfo]:
    """New engines (``infos``: host, device, engine) join the elastic run ``cell`` runs, at its next
    step boundary: set up by replaying the notebook's setup, then handed to the cell's thread. Returns
    them under their new rank numbers once they took part in a step."""
    group = cell.group
    set_up(group, infos, transcript, progress, beacons)
    progress("joining the run at its next step boundary")
    joined = cell.elastic.request("join", infos).result(timeout)
    _until(lambda: cell.elastic.recovering is None, timeout)
    return joined


def shrink_running(cell, n: int, progress, timeout: float = 120.0) -> list[RankInfo]:
    """The elastic run ``cell`` runs keeps its first ``n`` ranks from the next step boundary; the others
    end their run there and their engines stop. Returns the ranks that left (their old numbers)."""
    leave = cell.elastic.request("leave", n).result(timeout)
    progress(f"rank {format_ranks(r.rank for r in leave)} leave{'s' if len(leave) == 1 else ''} at the next "
             "step boundary")
    gone = {r.engine_id for r in leave}
    _until(lambda: all(c.done() for r, c in cell.children if r.engine_id in gone), timeout)
    cell.group.pool.stop_engines(sorted(gone))
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
        infos = extend_rank_map(group.ranks, engines, share_gpus=group.config.share_gpus)[len(group.ranks):]
    return [replace(r, rank=len(group.ranks) + i) for i, r in enumerate(infos)]


def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
