"""The one joint between the engine pool and the process group: what a notebook holds.

A :class:`Session` starts a pool (:mod:`workbench.pool`: processes) or attaches to one, then builds its
rooms once, the same way for both (:class:`~.rooms.Rooms`, the composition root: the door, the process
group, health, beacons, sharing, recovery, stacks, metrics), and forwards its verbs to them. Its own jobs:
the registry (:func:`current`, :func:`use`), the pool's life (start, attach, stop, detach, idle release)
and the public face (cells, data, recovery, looking inside, status), each verb a line or two; push, pull
and apply go through a :class:`~.rank_view.RankView` (:meth:`Session.view`).

>>> from workbench import Session
>>> with Session(n=2).start() as s:                        # doctest: +SKIP
...     s.run("import torch; t = torch.ones(1) * rank; dist.all_reduce(t)")
...     s.pull("t")
[tensor([1.]), tensor([1.])]
"""

from __future__ import annotations

import atexit
import os
import time
import warnings
from collections.abc import Callable

from workbench import remote
from workbench.config import PoolConfig
from workbench.errors import NoPoolError, PoolGone, PoolStartError
from workbench.pool import keeper
from workbench.pool.cluster import EnginePool, interrupts_held
from workbench.pool.launch import launcher_for
from workbench.pool.machine import netif
from workbench.pool.rankmap import RankInfo, build_rank_map, ranks_text
from workbench.pool.records import sharing
from workbench.pool.records import state as pool_state
from workbench.pool.watch.idle import IdleRelease
from workbench.session import postmortem_report, recovery, script
from workbench.session.cell_run import CellRun, OutputCallback, RunHandle
from workbench.session.meshes import split_plan
from workbench.session.rank_view import RankView
from workbench.session.results import CellResult
from workbench.session.rooms import Rooms
from workbench.session.stack_report import Stacks
from workbench.wire import Command

_current: Session | None = None


def current() -> Session:
    """The session that the magics drive in this process (the one started or attached last)."""
    if _current is None or not _current.running:
        raise NoPoolError(running=[(p.name or p.id, p.n) for p in running_pools()])
    return _current


def current_or_none() -> Session | None:
    """Like :func:`current`, but ``None`` when no pool is running here."""
    return _current if _current is not None and _current.running else None


def use(session: Session | None) -> None:
    """Make ``session`` the one the magics drive (``None``: none, so ``%dist start`` starts a new one)."""
    global _current
    _current = session


def running_pools() -> list[pool_state.PoolState]:
    """The pools of this machine's Jupyter runtime folder whose owner is alive (their state files)."""
    return pool_state.list_states()


class Session:
    """A pool of engines joined into one torch.distributed process group.

    ``pool_id``: start the pool under this id (a pool started again keeps its id and name).
    ``kept_here``: this process is the Jupyter server that keeps pools (its manager's sessions): a
    ``keep=True`` config starts here, not handed over again.

    >>> s = Session(n=2, timeout=30)     # doctest: +SKIP
    >>> s.start(progress=print)          # doctest: +SKIP
    >>> s.run("x = rank * 10")           # doctest: +SKIP
    >>> s.pull("x")                      # doctest: +SKIP
    [0, 10]
    >>> s.stop()                         # doctest: +SKIP
    """

    def __init__(self, config: PoolConfig | None = None, *, pool_id: str | None = None,
                 kept_here: bool = False, **kwargs):
        self.config = netif.resolve(config or PoolConfig(**kwargs))  # --interface -> its address
        self.start_seconds: float | None = None
        self.notify: Callable[[str], None] = lambda text: print(text, flush=True)  # "pool busy ..."
        self._pool_id = pool_id
        self._kept_here = kept_here
        self._pool: EnginePool | None = None
        self._rooms: Rooms | None = None  # built once the pool runs (started or attached)
        self._idle: IdleRelease | None = None  # config.idle_release: stops a pool nobody uses
        self.home: str | None = None  # the sub-mesh this notebook was handed (attach(..., on=)): its target

    # -- what it is ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._pool is not None and self._pool.client is not None

    @property
    def rooms(self) -> Rooms:
        """The rooms this session drives its pool with (:class:`~workbench.session.rooms.Rooms`), for the
        kernel's own tools (``%dist check``); ``NoPoolError`` when no pool runs."""
        if not self.running or self._rooms is None:
            raise NoPoolError()
        return self._rooms

    @property
    def ranks(self) -> list[RankInfo]:
        return self._rooms.group.ranks if self._rooms else []

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def backend(self) -> str | None:
        return self._rooms.group.backend if self._rooms else None

    @property
    def faults(self) -> list:
        """Every fault this session saw (:class:`workbench.faults.FaultEvent`), oldest first."""
        return self._rooms.health.faults if self._rooms else []

    @property
    def metrics(self):
        """The kernel-side metrics collector (:class:`workbench.metrics.collector.Collector`) while the pool
        runs, else None."""
        return self._rooms.metrics if self._rooms and not self._rooms.closed else None

    @property
    def pool(self) -> EnginePool | None:
        return self._pool

    @property
    def pool_id(self) -> str | None:
        return self._pool.pool_id if self._pool else None

    @property
    def name(self) -> str | None:
        """What people call the pool: ``%dist attach NAME``."""
        return self._pool.name if self._pool else None

    @property
    def attached(self) -> bool:
        """Whether another notebook (or the JupyterLab panel) started the pool this session drives."""
        return self._pool is not None and self._pool.attached

    @property
    def local(self) -> bool:
        """Every engine runs on this machine (the launcher says)."""
        return launcher_for(self.config).on_this_machine

    @property
    def client(self):
        if not self.running:
            raise NoPoolError()
        return self._pool.client

    def pids(self) -> list[int]:
        """Every process the pool started (controller, engines, lease)."""
        return self._pool.pids() if self._pool else []

    def notebooks(self) -> list[dict]:
        """The notebooks driving the pool now: ``[{"notebook", "role" ("started"/"attached"), "pid"}]``."""
        return sharing.clients(self.pool_id) if self._pool else []

    # -- lifecycle -----------------------------------------------------------------
    def start(self, progress: Callable[[str], None] = lambda msg: None) -> Session:
        """Start the engines and form the process group; returns self once every rank is ready.

        With ``keep=True`` the Jupyter server this kernel runs under starts the pool and keeps it (it
        outlives the kernel); this session attaches to it (:mod:`workbench.pool.keeper`).
        """
        if self.running:
            raise ValueError("this session is already running: stop it first, or use it as it is.")
        if self.config.keep and not self._kept_here:
            return self._start_kept(progress)
        t0 = time.perf_counter()
        self.config = launcher_for(self.config).configured(self.config)  # in a Slurm job: its nodes' route
        launcher = launcher_for(self.config)
        n = launcher.default_engines(launcher.visible_gpus())
        launcher.check_gpu_fit(n, backend=self.config.backend)  # refused before anything starts
        if not netif.is_loopback(self.config.address):
            warnings.warn(netif.UNAUTHENTICATED.format(address=self.config.address),
                          netif.UnauthenticatedNetworkWarning, stacklevel=2)
        pool = EnginePool(n=n, launcher=self.config.launcher, address=self.config.address,
                          timeout=self.config.timeout, env=launcher.engine_env(n), config=self.config,
                          pool_id=self._pool_id)
        self._pool = pool
        client = pool.start(progress)
        try:
            progress("forming the process group")
            rooms = self._build(pool, "started")
            engines = rooms.group.describe(client.ids)
            rooms.group.seat(build_rank_map(engines, share_gpus=self.config.share_gpus,
                                            order=launcher.node_order()))  # a Slurm job: in its node order
            rooms.form()
        except BaseException as exc:  # one short error naming the log, and nothing left running
            error = pool.explain(exc)
            with interrupts_held():
                self._close(end_pool=True, note=False)  # nobody was attached to a pool that never ran
            raise error from None
        self.start_seconds = time.perf_counter() - t0
        progress(f"ready: {ranks_text(n)}, backend {self.backend}, {self.start_seconds:.1f} s")
        pool.watch_walltime(warn=self._walltime_warning, end=self._walltime_end)  # in a Slurm job: its end
        if self.config.idle_release:
            self._idle = IdleRelease(self.config.idle_release, warn=self._idle_warning,
                                     release=self._idle_stop, busy=rooms.in_use)
        use(self)
        return self

    def _start_kept(self, progress: Callable[[str], None]) -> Session:
        """The server starts the pool as one of its own (its idle release applies there); then attach."""
        t0 = time.perf_counter()
        self._take(EnginePool.attach(keeper.hand_over(self.config, progress)))
        self.start_seconds = time.perf_counter() - t0
        progress(f"ready: {ranks_text(self.world_size)}, backend {self.backend}, {self.start_seconds:.1f} s; "
                 "kept by the Jupyter server")  # how to take it back after a restart: the magic says it once
        return self

    @classmethod
    def attach(cls, ref: str, on: str | None = None) -> Session:
        """Drive a pool that another notebook or the JupyterLab panel started, by its name or id.

        The same abilities as a session that started it: dead ranks and hangs named, the live
        dashboard, restart and scale. The ranks keep their process group and their state.

        ``on``: a sub-mesh of the split pool handed to this notebook: its cells, pushes, pulls and stacks go
        there unless told otherwise, another sub-mesh is refused, and what changes the whole pool (split,
        join, scale) is left to the notebook that drives it.

        >>> s = Session.attach("pool-glad-heron")      # doctest: +SKIP
        >>> s = Session.attach("pool-glad-heron", on="b")   # doctest: +SKIP
        >>> s.run("print(rank, world_size)")                 # doctest: +SKIP
        """
        pool = EnginePool.attach(ref)
        s = cls(pool_state.config_of(pool.state))._take(pool)
        if on is not None:
            s._hand(on)
        return s

    def _hand(self, on: str) -> None:
        """Take sub-mesh ``on`` as this notebook's own (:meth:`attach`); detached again if there is none."""
        meshes = self.meshes
        if on not in meshes:
            name = self.name
            self.detach()
            raise ValueError(f"pool {name} has no sub-mesh {on!r}: " + (
                f"its sub-meshes are {', '.join(meshes)}." if meshes else
                "it is not split (the notebook that drives it splits it: `%dist split 2 2`)."))
        self.home = on

    def _on(self, on: str | None) -> str | None:
        """``on``, or the sub-mesh this notebook was handed; another one is refused."""
        if self.home is None:
            return on
        if on not in (None, self.home):
            raise ValueError(f"this notebook was handed sub-mesh {self.home} (attached with --on "
                             f"{self.home}): its cells run there; sub-mesh {on} is another notebook's.")
        return self.home

    def _whole_pool(self, what: str) -> None:
        """Refuse ``what`` (it changes every rank) in a notebook that was handed one sub-mesh."""
        if self.home is not None:
            raise ValueError(f"{what} changes the whole pool, and this notebook was handed sub-mesh "
                             f"{self.home} only: the notebook that drives the pool does it.")

    def _take(self, pool: EnginePool) -> Session:
        """Drive ``pool``, attached: its ranks, process group and state as they are."""
        state = pool.state
        self.config = pool_state.config_of(state)
        if len(state.ranks) != state.n:
            pool.client.close()
            raise PoolStartError(f"pool {pool.name} has not finished starting: try again in a moment.")
        self._pool = pool
        self._build(pool, "attached").catch_up()  # ranks, backend, the group's generation: from its state
        use(self)
        return self

    def _build(self, pool: EnginePool, role: str) -> Rooms:
        """The rooms over ``pool``, started here or attached: the same rooms either way."""
        self._rooms = Rooms(pool, self.config, role=role, notify=lambda text: self.notify(text))
        atexit.register(self.stop)  # kernel shutdown and restart: the pool ends, or this notebook detaches
        return self._rooms

    def stop(self, everyone: bool = False, by: str | None = None) -> None:
        """End this session: the pool stops (nothing of it is left running) when this session started it
        or ``everyone`` is asked for; an attached session only detaches, the pool runs on for the others.

        ``by``: who stopped it, said to the notebooks still attached (default: this notebook). A kept pool
        is stopped by the Jupyter server that keeps it (its side channel and idle timer live there); at
        the kernel's exit this session only detaches.
        """
        pool = self._pool
        if pool is None:
            return
        end = everyone or not pool.attached
        if end and pool.attached and self.config.keep and keeper.stop_kept(pool.pool_id):
            self._close(end_pool=False)
            sharing.note_stopped(pool.pool_id, pool.name, by or sharing.this_notebook())  # not "the panel"
            return
        self._close(end_pool=end, by=by)

    def detach(self) -> None:
        """Leave the pool to the other notebooks: this session closes, the ranks run on."""
        self._close(end_pool=False)

    def _close(self, end_pool: bool, by: str | None = None, note: bool = True) -> None:
        global _current
        pool, self._pool = self._pool, None
        if self._idle is not None:
            self._idle.close()
            self._idle = None
        if self._rooms is not None:
            self._rooms.close(end_pool=end_pool, by=by, note=note)  # the pool ends, or is let go of
        elif pool is not None and end_pool:
            if note:
                sharing.note_stopped(pool.pool_id, pool.name, by or sharing.this_notebook())
            pool.stop(grace=0.5)
        elif pool is not None:
            pool.close()
        if _current is self:
            _current = None

    def __enter__(self) -> Session:
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _idle_warning(self, seconds_left: float) -> None:
        self.notify(f"workbench: pool {self.name} has been idle; it stops in {seconds_left:.0f} s to release "
                    "its nodes. Run a cell on it to keep it.")

    def _idle_stop(self) -> None:
        n = self.world_size
        self.stop(everyone=True, by="its idle release")
        self.notify(f"workbench: stopped the idle pool ({ranks_text(n)}) after "
                    f"{self.config.idle_release:g} s without a cell; its nodes are released. "
                    "`%dist start` starts a new one.")

    def _walltime_warning(self, text: str) -> None:
        """The pool's Slurm job ends soon (its walltime watch says so, once): say it, and ask every rank's
        running Trainer to checkpoint at its next step (its ``wb.Checkpoint`` callback saves there)."""
        self.notify(text)
        rooms = self._rooms
        if rooms is not None and not rooms.closed:
            reason = text.removeprefix("workbench: ").split(": a running")[0]  # "Slurm job 12 ends in ..."
            rooms.group.command(Command.CHECKPOINT, rooms.group.ranks, reason=reason)

    def _walltime_end(self, text: str) -> None:
        """The pool's Slurm job is over (Slurm ended its steps): once a running cell has ended (its ranks are
        gone, it fails within seconds), the pool stops, nothing of it left running here."""
        rooms = self._rooms
        if rooms is not None and rooms.busy.acquire(timeout=30):  # the running cell's end, awaited
            rooms.busy.release()
        self.stop(everyone=True, by="the end of its Slurm job")
        self.notify(text)

    def _live(self, what: str | None = None) -> Rooms:
        """The rooms of the running pool, checked (a pool stopped elsewhere ends this session in one line);
        ``NoPoolError`` when none runs."""
        if not self.running or self._rooms is None:
            raise NoPoolError(what) if what else NoPoolError()
        try:
            self._rooms.check()
        except PoolGone:
            self._close(end_pool=False, note=False)  # the rooms closed already; forget the pool here too
            raise
        return self._rooms

    def check(self) -> None:
        """Whether the pool still runs: one stopped elsewhere (another notebook, the panel, its lease) ends
        this session and raises :class:`~workbench.errors.PoolGone` with who stopped it."""
        self._live()

    # -- recovery ------------------------------------------------------------------------
    def dead_ranks(self) -> dict[int, str]:
        """Ranks whose engine is gone, with how (the health watcher notices at once)."""
        return dict(self._rooms.health.dead) if self._rooms else {}

    def restart(self, progress: Callable[[str], None] = lambda msg: None) -> list[int]:
        """Start a new engine for every dead rank, on the same host and device, and re-form the group.

        The surviving ranks keep their Python state. Returns the ranks that were restarted. Ranks an
        elastic run went on without come back too, set up by replaying the notebook's setup; while that
        run goes on (``%%distributed --async``) they join it at its next step boundary
        (:meth:`workbench.session.recovery.Recovery.restart`).
        """
        return self._recovery("a restart").restart(progress)

    def scale(self, n: int, progress: Callable[[str], None] = lambda msg: None) -> list[RankInfo]:
        """Grow or shrink the pool to ``n`` ranks and re-form the process group at that world size.

        Growing starts engines through the pool's launcher (the new ranks come after the others);
        shrinking stops the highest ranks. The ranks that remain keep their rank, device and Python state
        (a training run then resumes from its checkpoint at the new world size). Returns the new rank map
        (:meth:`workbench.session.recovery.Recovery.scale`).

        >>> s.scale(4, progress=print)        # doctest: +SKIP
        starting 2 engines
        re-forming the process group at world size 4
        """
        recovery.check_size(n)
        self._whole_pool("a scale")
        if self.meshes:
            raise ValueError("the pool is split into sub-meshes: `%dist join` (Session.join()) first, then "
                             "scale; split it again after.")
        return self._recovery("a scale").scale(n, progress)

    # -- sub-meshes (docs/submeshes.md) ---------------------------------------------------------------
    def split(self, sizes, names=None) -> dict[str, list[int]]:
        """Re-form the pool as disjoint sub-meshes of ``sizes`` ranks, in rank order (``names``: default
        ``m0``, ``m1``, ...), each its own default process group: inside a cell on one (``run(..., on=name)``)
        ``rank``, ``world_size``, ``dist``'s default group and torchrun's environment are the sub-mesh's,
        while ``ranks=`` and the status keep the pool's numbers. Python state on the ranks is kept. Returns
        name -> the pool ranks of each.

        >>> s.split([2, 2], names=["a", "b"])                  # doctest: +SKIP
        {'a': [0, 1], 'b': [2, 3]}
        >>> s.run("print(rank, world_size)", on="b")            # doctest: +SKIP
        """
        rooms = self._live("a split")
        self._whole_pool("a split")
        if isinstance(names, str):
            names = names.split(",")
        plan = split_plan(list(sizes), names, self.world_size)
        rooms.split(plan)
        return plan

    def join(self) -> None:
        """Re-form the whole pool as one process group again (after :meth:`split`), Python state kept."""
        rooms = self._live("a join")
        self._whole_pool("a join")
        rooms.split({})

    @property
    def meshes(self) -> dict[str, list[int]]:
        """The sub-meshes: name -> their pool ranks (empty while the pool is one group)."""
        return dict(self._rooms.group.meshes) if self._rooms else {}

    def _recovery(self, what: str) -> recovery.Recovery:
        if not self.running or self._rooms is None:
            raise NoPoolError(what)
        return self._rooms.recovery

    # -- ranks and data ------------------------------------------------------------------
    def targets(self, ranks=None, on: str | None = None) -> list[RankInfo]:
        """Resolve ``None`` (all), a rank, a list of ranks or a spec like ``"0,2-3"`` (``on``: of that
        sub-mesh, all of it by default)."""
        rooms = self._live()
        if self._idle is not None:
            self._idle.touch()  # every cell, push, pull and apply comes through here
        return rooms.resolve(ranks, self._on(on))

    def view(self, ranks=None, on: str | None = None) -> RankView:
        """The ranks ``ranks`` (``None``: all, a rank, a list, ``"0,2-3"``; ``on``: of that sub-mesh) as one
        object that pushes, pulls, applies, scatters and gathers
        (:class:`~workbench.session.rank_view.RankView`).

        >>> s.view("0-1").scatter(list(range(8)), "x")     # doctest: +SKIP
        [4, 4]
        """
        on = self._on(on)
        if on is not None:  # that sub-mesh's pool ranks (a push there is no setup of every rank's)
            ranks = [r.rank for r in self.targets(ranks, on)]
        return RankView(ranks, resolve=self.targets, door=lambda: self.rooms.door, dead=self.dead_ranks,
                        on_push=lambda values: self.rooms.transcript.push(values))

    def push(self, values: dict, ranks=None, on: str | None = None) -> None:
        """Send ``{name: value}`` into the namespace of the target ranks (``on``: a sub-mesh's;
        :meth:`RankView.push`)."""
        self.view(ranks, on).push(values)

    def pull(self, name: str, rank: int | None = None, on: str | None = None):
        """A value from one rank, or a list with every rank's value (``on``: every rank of that sub-mesh, in
        order; ``rank``, if given, a pool rank within it) (:meth:`RankView.pull`).

        >>> s.pull("loss", on="b")          # doctest: +SKIP
        [0.0202, 0.0202]
        """
        values = self.view(rank, on).pull(name)
        return values[0] if rank is not None else values

    def apply(self, fn: Callable, *args, ranks=None, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on the target ranks at once; the results in rank order."""
        return self.view(ranks).apply(fn, *args, **kwargs)

    # -- cells ---------------------------------------------------------------------------
    def run(self, code: str, *, ranks=None, timeout: float | None = None,
            on_output: OutputCallback | None = None, on_tick: Callable[[], None] | None = None,
            spread: bool | None = None, on: str | None = None) -> CellResult:
        """Run ``code`` on the target ranks at once, streaming output as it comes (merged per host where the
        hosts have hubs: see :meth:`hubs`; ``spread``: lines that differ only in numbers merged there too,
        default above 8 ranks).

        Raises :class:`RankError` naming the rank that failed first (an exception, or a
        dead engine), :class:`CellTimeout` naming the stalled rank when ``timeout``
        passes, and :class:`CellInterrupted` (a ``KeyboardInterrupt``) on Ctrl-C, saying where
        each rank stopped. In each case the other ranks are stopped within seconds, gently first.
        While another notebook's cell runs on the pool this one waits, saying so. A syntax error is
        raised here, before anything is sent. ``on``: the sub-mesh to run on (:meth:`split`).
        """
        script.check_cell(code)
        cell = self._cell(ranks, timeout, on_output, on_tick, spread, on)
        return cell.rooms.run_cell(cell, code)

    def _cell(self, ranks, timeout, on_output, on_tick=None, spread=None, on=None) -> CellRun:
        targets = self.targets(ranks, on)  # NoPoolError when no pool runs
        return CellRun(self._rooms, targets, timeout, on_output, on_tick, spread)

    def hubs(self, ranks=None) -> dict[str, tuple[int, ...]] | None:
        """The target ranks per host hub where every one of them has one (their cells' lines then come merged
        per host: ``on_output(hub, "lines", ...)``), else None (their text comes per rank)."""
        return self._rooms.door.hubs(self.targets(ranks)) if self._rooms else None

    def run_script(self, path: str, args=(), *, ranks=None, timeout: float | None = None,
                   on_output: OutputCallback | None = None, on_tick: Callable[[], None] | None = None,
                   spread: bool | None = None, on: str | None = None) -> CellResult:
        """Run a torchrun script on the target ranks, as ``torchrun --nproc-per-node N path *args`` would.

        On each rank ``__name__`` is ``"__main__"``, ``sys.argv`` is ``[path, *args]`` and torchrun's
        environment is set; the script's ``init_process_group`` finds the pool's group. Its globals stay
        on the ranks. A syntax error is raised here before anything is sent; errors as for :meth:`run`.

        >>> s.run_script("train.py", ["--epochs", "2"])      # doctest: +SKIP
        """
        script.check_script(path, local=self.local)
        cwd = os.getcwd()  # the ranks work there where their host has it; else a missing script says so
        targets = self.view(ranks, on).alive()
        code = self._rooms.door.cell(remote.run_script, targets, path, list(args), cwd)  # a cell runs it
        return self.run(code, ranks=[r.rank for r in targets], timeout=timeout, on_output=on_output,
                        on_tick=on_tick, spread=spread)

    def folders(self, targets: list[RankInfo]) -> dict[int, tuple[str, str]]:
        """rank -> (host, the folder it works in as it last followed the notebook's), for the ranks of
        ``targets`` whose folder is known."""
        return self._rooms.folders.of(targets) if self._rooms else {}

    def submit(self, code: str, *, ranks=None, timeout: float | None = None,
               on_output: OutputCallback | None = None, on: str | None = None) -> RunHandle:
        """Start ``code`` on the target ranks like :meth:`run`, but return at once.

        >>> h = s.submit("trainer.run(steps=5000)")     # doctest: +SKIP
        >>> h.done(), h.stop()                           # doctest: +SKIP
        """
        cell = self._cell(ranks, timeout, on_output, on=on)
        cell.rooms.submit(cell)  # busy on its ranks from now (debug, ...), before its thread takes the turn
        return RunHandle(cell, code, cell.rooms.run_cell)

    # -- looking inside: every rank's stacks now, a failed rank's frames ------------------
    def stacks(self, ranks=None, native: bool = False, on: str | None = None) -> Stacks:
        """Every thread's stack on the target ranks (``on``: a sub-mesh's), taken by each rank's agent at
        once (also while a cell runs, or the ranks wait in a collective), grouped by identical stacks, odd
        ranks first.

        ``native``: native frames too, through py-spy, where it can attach (else it says why).

        >>> print(s.stacks().format())        # doctest: +SKIP
        stacks of 4 ranks in 2 groups (0.04 s)
        rank 3: sleep at cell line 3
        ...
        """
        targets = self.targets(ranks, on)
        group = self._rooms.group

        def send(ranks: list[int], **details) -> None:
            group.command(Command.STACKS, [group.ranks[r] for r in ranks], **details)

        return self._rooms.stacks.gather([r.rank for r in targets], send, native=native)

    def debug(self, rank: int, frame: int | None = None, expr: str | None = None):
        """The failing frames, with their locals, of ``rank``'s last cell (a :class:`PostMortem`); with
        ``expr``: its value in frame ``frame`` (default: the innermost), as text.

        >>> s.debug(1)                                  # doctest: +SKIP
        rank 1 failed: ValueError: boom ...
        >>> s.debug(1, frame=1, expr="b.shape")         # doctest: +SKIP
        'torch.Size([4, 3])'
        """
        if not isinstance(rank, int):
            raise ValueError(f"debug takes one rank (a number), got {rank!r}.")
        [info] = self.view(rank).alive()
        if self._rooms.busy_on([rank]):  # in a split pool: on its sub-mesh
            raise ValueError("a cell is running on the pool: `%dist debug` looks at a failed cell once it "
                             "ended; `%dist stacks` shows what every rank does now.")
        door = self._rooms.door
        if expr is None:
            if frame is not None:
                raise ValueError("--frame picks the frame to evaluate -e EXPR in: give an expression too.")
            return postmortem_report.fetch(door, info)
        return postmortem_report.evaluate(door, info, expr, frame)

    # -- status ----------------------------------------------------------------------
    def group_state(self) -> str:
        """The process group in one line: formed, destroyed on some ranks (torch's own
        ``destroy_process_group``: the next cell re-forms it), aborted after a fault (the next cell
        re-forms it), or broken by dead ranks (``%dist restart``). A script's ``destroy_process_group()``
        keeps it formed (the pool defers it).

        >>> s.group_state()      # doctest: +SKIP
        'process group: formed (backend gloo, world size 2)'
        """
        if self._rooms is None:
            return "process group: aborted after a fault; the next cell re-forms it"
        return self._rooms.group_state()

    def status(self) -> list[dict]:
        """One row per rank: rank, host, pid, device, state (idle, busy or failed: see
        :func:`workbench.pool.watch.queues.rank_states`, which the panel's cards read too); then one per
        engine declared lost ("lost, fenced": refused, told to stop when heard; "lost, stopped": its host
        answered the kill, or it was heard, told, and is silent since)."""
        if not self.running:
            return []
        return self._live().status()
