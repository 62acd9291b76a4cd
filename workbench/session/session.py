"""The one joint between the engine pool and the process group.

A :class:`Session` wires the rooms for a pool it started or one it attached to, the same way for
both: the pool (:mod:`workbench.pool`: processes), the process group (:mod:`.group`), health
(:mod:`.health`: dead ranks, beacons, the fault log), recovery (:mod:`.recovery`: restart, scale,
bring-back), the cell (:mod:`.cell_run`) and the pool as other notebooks share it (:mod:`.shared`).
Its own jobs: the registry (:func:`current`, :func:`use`), start/attach wiring, stop and idle release,
cells, status; push, pull and apply go through a :class:`~.rank_view.RankView` (:meth:`Session.view`).

>>> from workbench import Session
>>> with Session(n=2).start() as s:                        # doctest: +SKIP
...     s.run("import torch; t = torch.ones(1) * rank; dist.all_reduce(t)")
...     s.pull("t")
[tensor([1.]), tensor([1.])]
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable

from workbench import remote
from workbench.config import PoolConfig
from workbench.errors import NoPoolError, PoolGone, PoolStartError, RankDiedError
from workbench.pool import keeper
from workbench.pool.cluster import EnginePool, interrupts_held
from workbench.pool.launch import default_engines
from workbench.pool.machine import netif
from workbench.pool.machine.devices import check_gpu_fit, visible_gpu_count
from workbench.pool.rankmap import RankInfo, build_rank_map, format_ranks, parse_ranks, ranks_text
from workbench.pool.records import sharing
from workbench.pool.records import state as pool_state
from workbench.pool.watch.beacons import BeaconReceiver
from workbench.pool.watch.idle import IdleRelease
from workbench.pool.watch.queues import rank_states
from workbench.session import postmortem_report, recovery, script
from workbench.session.cell_run import CellRun, OutputCallback, RunHandle
from workbench.session.group import ProcessGroup
from workbench.session.health import Health
from workbench.session.losses import fenced_rows
from workbench.session.rank_view import RankView
from workbench.session.recovery import Recovery
from workbench.session.results import CellResult
from workbench.session.shared import Shared
from workbench.session.stack_report import StackGatherer, Stacks

log = logging.getLogger(__name__)

# A replacement that ElasticConfig(replace=True) started may still be joining when its run ends: the
# cell waits this long for it (it then stops the new engine, or has joined).
REPLACEMENT_WAIT_S = 60.0

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
        self.metrics = None  # the kernel-side metrics collector (workbench.metrics), once connected
        self.notify: Callable[[str], None] = lambda text: print(text, flush=True)  # "pool busy ..."
        self._pool_id = pool_id
        self._kept_here = kept_here
        self._pool: EnginePool | None = None
        self._group: ProcessGroup | None = None
        self._health: Health | None = None
        self._beacons: BeaconReceiver | None = None
        self._stacks: StackGatherer | None = None
        self._shared: Shared | None = None
        self._busy = threading.Lock()  # held while a cell, a restart or a scale of this session runs
        self._transcript = recovery.Transcript()  # what ran on every rank: a new engine's setup
        self._active: CellRun | None = None  # the cell running now (restart and scale ask it, when elastic)
        self._recovery: Recovery | None = None  # restart, scale, bring-back (once connected)
        self._idle: IdleRelease | None = None  # config.idle_release: stops a pool nobody uses
        self._cwds: dict[int, str] = {}  # engine id -> the notebook's folder it was last asked to follow
        self._folders: dict[int, tuple[str, str]] = {}  # engine id -> (its host, the folder it works in)

    # -- what it is ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._pool is not None and self._pool.client is not None

    @property
    def ranks(self) -> list[RankInfo]:
        return self._group.ranks if self._group else []

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def backend(self) -> str | None:
        return self._group.backend if self._group else None

    @property
    def faults(self) -> list:
        """Every fault this session saw (:class:`workbench.faults.FaultEvent`), oldest first."""
        return self._health.faults if self._health else []

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
        return self.config.launcher == "local"

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
        gpus = visible_gpu_count() if self.local else 0
        n = default_engines(self.config, gpus)
        if self.local:  # more ranks than GPUs, or nccl without a GPU: refused before anything starts
            check_gpu_fit(n, gpus, share=self.config.share_gpus, backend=self.config.backend)
        if not netif.is_loopback(self.config.address):
            warnings.warn(netif.UNAUTHENTICATED.format(address=self.config.address),
                          netif.UnauthenticatedNetworkWarning, stacklevel=2)
        pool = EnginePool(n=n, launcher=self.config.launcher, address=self.config.address,
                          timeout=self.config.timeout, env=self._engine_env(n), config=self.config,
                          pool_id=self._pool_id)
        self._pool = pool
        client = pool.start(progress)
        try:
            progress("forming the process group")
            self._connect(pool, "started")
            engines = self._group.describe(client.ids)
            self._group.seat(build_rank_map(engines, share_gpus=self.config.share_gpus))
            self._form()
        except BaseException as exc:  # one short error naming the log, and nothing left running
            error = pool.explain(exc)
            with interrupts_held():
                self._close(end_pool=True, note=False)  # nobody was attached to a pool that never ran
            raise error from None
        self.start_seconds = time.perf_counter() - t0
        progress(f"ready: {ranks_text(n)}, backend {self.backend}, {self.start_seconds:.1f} s")
        if self.config.idle_release:
            self._idle = IdleRelease(self.config.idle_release, warn=self._idle_warning,
                                     release=self._idle_stop, busy=self._in_use)
        use(self)
        return self

    def _start_kept(self, progress: Callable[[str], None]) -> Session:
        """The server starts the pool as one of its own (its idle release applies there); then attach."""
        t0 = time.perf_counter()
        self._take(EnginePool.attach(keeper.hand_over(self.config, progress)))
        self.start_seconds = time.perf_counter() - t0
        progress(f"ready: {ranks_text(self.world_size)}, backend {self.backend}, {self.start_seconds:.1f} s; "
                 f"kept by the Jupyter server (after a kernel restart: `%dist attach {self.name}`)")
        return self

    def _in_use(self) -> bool:
        """For the idle release: a cell of this session runs, or any notebook's cell ran since the last look
        (attached notebooks too: a kept pool's owner is the Jupyter server, its cells come from kernels)."""
        return self._busy.locked() or (self._shared is not None and self._shared.lock.used())

    def _engine_env(self, n: int) -> dict[str, str]:
        if not self.local:
            return {"OMP_NUM_THREADS": "1"}
        return {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n))}

    @classmethod
    def attach(cls, ref: str) -> Session:
        """Drive a pool that another notebook or the JupyterLab panel started, by its name or id.

        The same abilities as a session that started it: dead ranks and hangs named, the live
        dashboard, restart and scale. The ranks keep their process group and their state.

        >>> s = Session.attach("pool-glad-heron")      # doctest: +SKIP
        """
        pool = EnginePool.attach(ref)
        return cls(pool_state.config_of(pool.state))._take(pool)

    def _take(self, pool: EnginePool) -> Session:
        """Drive ``pool``, attached: its ranks, process group and state as they are."""
        state = pool.state
        self.config = pool_state.config_of(state)
        if len(state.ranks) != state.n:
            pool.client.close()
            raise PoolStartError(f"pool {pool.name} has not finished starting: try again in a moment.")
        self._pool = pool
        self._connect(pool, "attached")
        self._shared.catch_up()  # ranks, backend, the group's generation: from the state file
        use(self)
        return self

    def _connect(self, pool: EnginePool, role: str) -> None:
        """Wire the rooms over ``pool``, started here or attached: the same rooms either way.

        Beacons and metrics come from the pool's relay, to which every session subscribes (before
        the ranks join, so their first records wait for us).
        """
        from workbench.metrics.collector import Collector

        self._group = ProcessGroup(pool, self.config)
        if pool.channel:
            self._beacons = BeaconReceiver(pool.channel)
            self._beacons.on_fenced = self._group.fence  # a lost engine heard again is told to stop
            self._stacks = StackGatherer(pool.channel)  # subscribed now: the first `%dist stacks` is answered
            self.metrics = Collector(pool.channel)
        self._health = Health(pool_id=pool.pool_id, busy=self._busy, beacons=self._beacons,
                              pool_running=lambda: self._shared is None or not self._shared.gone(),
                              endpoints=lambda: self._group.endpoints, lost_hosts=pool.lost_hosts)
        on_ranks = self.metrics.set_ranks if self.metrics is not None else (lambda ranks: None)
        self._shared = Shared(pool, self._group, self._health, local=self.local, role=role, on_ranks=on_ranks)
        self._recovery = Recovery(config=self.config, group=self._group, health=self._health,
                                  beacons=self._beacons, transcript=self._transcript, turn=self._held,
                                  reform=lambda since: self._reform(since=since),
                                  elastic_cell=self._elastic_cell)
        atexit.register(self.stop)  # kernel shutdown and restart: the pool ends, or this notebook detaches

    def _form(self, reform: bool = False) -> None:
        """(Re-)form the group on every rank, then watch the ranks and (re)connect their metrics."""
        if reform:
            self._group.reform(self.ranks)
        else:
            self._group.form()
        self._follow_membership()
        if self.metrics is not None:  # every rank's publisher (re)connects: metrics never stop a pool
            try:
                self._group.view(self.ranks).apply_sync(remote.connect_metrics, self._pool.channel)
            except Exception:
                log.warning("live metrics are off: the ranks' publishers did not start", exc_info=True)

    def _follow_membership(self) -> None:
        """Watch the ranks of the group now formed and publish them (also after an elastic regroup)."""
        self._health.watch(self.ranks, local=self.local)
        if self._beacons is not None:  # engines declared lost: refused, told to stop when heard
            self._beacons.fence([r.host, r.pid] for r in self._group.fenced)
        self._shared.publish(ranks=[r.__dict__ for r in self.ranks], backend=self.backend,
                             backend_requested=self.config.backend, generation=self._group.generation,
                             endpoints=self._group.endpoints, group_ok=True)
        if self.metrics is not None:
            self.metrics.set_ranks(self.ranks)

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
        for room in (self._idle, self._health, self._group, self.metrics, self._beacons, self._stacks):
            if room is not None:
                room.close()  # the health room writes a pending fault to the log
        self._idle = self.metrics = self._beacons = self._stacks = None
        if self._shared is not None:
            self._shared.close()
        if pool is None:
            pass
        elif end_pool:
            if note:  # first: a notebook that finds the pool gone at once is told who stopped it
                sharing.note_stopped(pool.pool_id, pool.name, by or sharing.this_notebook())
            pool.stop(grace=0.5)  # an engine with torch._dynamo takes ~3 s to exit: its state is thrown away
        else:
            pool.close()
        if _current is self:
            _current = None

    def __enter__(self) -> Session:
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- recovery ------------------------------------------------------------------------
    def dead_ranks(self) -> dict[int, str]:
        """Ranks whose engine is gone, with how (the health watcher notices at once)."""
        return dict(self._health.dead) if self._health else {}

    def _turn(self, what: str):
        """This session's turn on the pool: no other cell of this process or another notebook meanwhile."""
        if not self.running:
            raise NoPoolError(what)
        self._check()
        return self._shared.turn(self.notify, what=what)

    def _check(self) -> None:
        """A pool stopped elsewhere (another notebook, the panel, its lease), or whose controller exited,
        ends this session in one line."""
        if self._shared is not None and self._shared.gone():
            self._close(end_pool=not self.attached, note=False)  # whoever stopped it said so already
            self._shared.catch_up()  # raises PoolGone with who stopped it and when
        pid = self._pool.controller_exited() if self._pool is not None else None
        if pid is not None:  # every request to the ranks would wait for ever: end what is left, say so
            owner = not self.attached
            self._close(end_pool=owner)
            raise PoolGone(f"the pool's controller (pid {pid}) exited, so no rank can be reached: "
                           + ("the pool was stopped (its engines ended); `%dist start` starts a new one."
                              if owner else "its owner stops it at its next command, or `workbench stop` "
                              "from a terminal; `%dist start` starts a new one."))

    def _ensure_group(self, targets: list[RankInfo] | None = None) -> None:
        """Before a cell: refuse with dead ranks among ``targets`` (default: all), re-form a process group
        that a fault aborted. A cell on living ranks only runs, with a warning (to save their state before
        ``%dist restart``): the group is not re-formed without the dead ranks."""
        dead = self.dead_ranks()
        if dead and targets is not None and not {r.rank for r in targets} & dead.keys():
            self.notify(f"workbench: rank {format_ranks(sorted(dead))} is dead: this cell runs on rank "
                        f"{format_ranks([r.rank for r in targets])} only, and a collective with the dead "
                        "rank fails; `%dist restart` brings it back and re-forms the process group.")
            return
        if dead:
            rank = min(dead)
            raise RankDiedError(f"{self.ranks[rank].label()} is dead ({dead[rank]}): `%dist restart` "
                                "(Session.restart()) starts a new engine for it and re-forms the process "
                                "group.")
        if self._beacons is not None:  # a cell before may have destroyed the group without an error
            self._group.heard_groups(self._beacons.latest)
        if not self._group.ok:
            self._reform()

    def _elastic_cell(self) -> CellRun | None:
        """The cell running an elastic Trainer now, if any (it takes ranks in and out at a step boundary)."""
        cell = self._active
        return cell if cell is not None and cell.elastic.active() is not None else None

    def _reform(self, since: float | None = None) -> None:
        t0 = time.perf_counter() if since is None else since
        self._form(reform=True)
        self._health.recovered(time.perf_counter() - t0)

    def restart(self, progress: Callable[[str], None] = lambda msg: None) -> list[int]:
        """Start a new engine for every dead rank, on the same host and device, and re-form the group.

        The surviving ranks keep their Python state. Returns the ranks that were restarted. Ranks an
        elastic run went on without come back too, set up by replaying the notebook's setup; while that
        run goes on (``%%distributed --async``) they join it at its next step boundary
        (:meth:`workbench.session.recovery.Recovery.restart`).
        """
        return self._recovery_room("a restart").restart(progress)

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
        return self._recovery_room("a scale").scale(n, progress)

    def _recovery_room(self, what: str) -> Recovery:
        if self._recovery is None or not self.running:
            raise NoPoolError(what)
        return self._recovery

    @contextlib.contextmanager
    def _held(self, what: str):
        """This session's lock and its turn on the pool, for a restart or a scale."""
        with self._busy, self._turn(what):
            yield

    def _idle_warning(self, seconds_left: float) -> None:
        self.notify(f"workbench: pool {self.name} has been idle; it stops in {seconds_left:.0f} s to release "
                    "its nodes. Run a cell on it to keep it.")

    def _idle_stop(self) -> None:
        n = self.world_size
        self.stop(everyone=True, by="its idle release")
        self.notify(f"workbench: stopped the idle pool ({ranks_text(n)}) after "
                    f"{self.config.idle_release:g} s without a cell; its nodes are released. "
                    "`%dist start` starts a new one.")

    # -- ranks and data ------------------------------------------------------------------
    def targets(self, ranks=None) -> list[RankInfo]:
        """Resolve ``None`` (all), a rank, a list of ranks or a spec like ``"0,2-3"``."""
        if not self.running:
            raise NoPoolError()
        self._check()
        if self._idle is not None:
            self._idle.touch()  # every cell, push, pull and apply comes through here
        if ranks is None:
            return list(self.ranks)
        if isinstance(ranks, str):
            ranks = parse_ranks(ranks, self.world_size)
        elif isinstance(ranks, int):
            ranks = [ranks]
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"rank {bad[0]} is out of range: this pool has ranks 0-{self.world_size - 1}.")
        return [self.ranks[r] for r in sorted(set(ranks))]

    def view(self, ranks=None) -> RankView:
        """The ranks ``ranks`` (``None``: all, a rank, a list, ``"0,2-3"``) as one object that pushes,
        pulls, applies, scatters and gathers (:class:`~workbench.session.rank_view.RankView`).

        >>> s.view("0-1").scatter(list(range(8)), "x")     # doctest: +SKIP
        [4, 4]
        """
        return RankView(ranks, resolve=self.targets, engines=lambda targets: self._group.view(targets),
                        dead=self.dead_ranks, on_push=self._transcript.push)

    def push(self, values: dict, ranks=None) -> None:
        """Send ``{name: value}`` into the namespace of the target ranks (:meth:`RankView.push`)."""
        self.view(ranks).push(values)

    def pull(self, name: str, rank: int | None = None):
        """A value from one rank, or a list with every rank's value (:meth:`RankView.pull`)."""
        values = self.view(rank).pull(name)
        return values[0] if rank is not None else values

    def apply(self, fn: Callable, *args, ranks=None, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on the target ranks at once; the results in rank order."""
        return self.view(ranks).apply(fn, *args, **kwargs)

    # -- cells ---------------------------------------------------------------------------
    def run(self, code: str, *, ranks=None, timeout: float | None = None,
            on_output: OutputCallback | None = None, on_tick: Callable[[], None] | None = None) -> CellResult:
        """Run ``code`` on the target ranks at once, streaming output as it comes.

        Raises :class:`RankError` naming the rank that failed first (an exception, or a
        dead engine), :class:`CellTimeout` naming the stalled rank when ``timeout``
        passes, and :class:`CellInterrupted` (a ``KeyboardInterrupt``) on Ctrl-C, saying where
        each rank stopped. In each case the other ranks are stopped within seconds, gently first.
        While another notebook's cell runs on the pool this one waits, saying so. A syntax error is
        raised here, before anything is sent.
        """
        script.check_cell(code)
        return self._run(self._cell(ranks, timeout, on_output, on_tick), code)

    def _cell(self, ranks, timeout, on_output, on_tick=None) -> CellRun:
        cell = CellRun(self._group, self._health, self.targets(ranks), timeout, on_output, on_tick,
                       on_regroup=self._follow_membership)
        cell.elastic.bring_back = lambda: self._recovery.bring_back(cell)
        return cell

    def _run(self, cell: CellRun, code: str) -> CellResult:
        with self._busy, self._turn("a cell"):
            # another notebook may have restarted or re-formed ranks while this one waited
            cell.targets = self.targets([r.rank for r in cell.targets])
            self._ensure_group(cell.targets)
            self._follow_cwd(cell.targets)
            cell.folders = self.folders
            self._active = cell
            try:
                result = cell.run(code)
            finally:
                self._active = None
                for thread in cell.elastic.replacements:  # they end once the run did (joined or not)
                    thread.join(REPLACEMENT_WAIT_S)
        if len(cell.targets) == self.world_size or cell.elastic.dropped:  # every rank ran it
            self._transcript.cell(code)
        return result

    def run_script(self, path: str, args=(), *, ranks=None, timeout: float | None = None,
                   on_output: OutputCallback | None = None,
                   on_tick: Callable[[], None] | None = None) -> CellResult:
        """Run a torchrun script on the target ranks, as ``torchrun --nproc-per-node N path *args`` would.

        On each rank ``__name__`` is ``"__main__"``, ``sys.argv`` is ``[path, *args]`` and torchrun's
        environment is set; the script's ``init_process_group`` finds the pool's group. Its globals stay
        on the ranks. A syntax error is raised here before anything is sent; errors as for :meth:`run`.

        >>> s.run_script("train.py", ["--epochs", "2"])      # doctest: +SKIP
        """
        script.check_script(path, local=self.local)
        cwd = os.getcwd()  # the ranks work there where their host has it; else a missing script says so
        targets = [r.rank for r in self.targets(ranks)]
        self.push({script.RUNNER: remote.run_script}, ranks=targets)  # then called by the cell, as one
        return self.run(script.script_cell(path, list(args), cwd), ranks=targets, timeout=timeout,
                        on_output=on_output, on_tick=on_tick)

    def _follow_cwd(self, targets: list[RankInfo]) -> None:
        """The ranks work in the notebook's folder (also after ``%cd``) where their host has it (a local
        pool's always does): moved when it changed. Where each rank works is kept for the errors that
        name it (:attr:`folders`)."""
        here = os.getcwd()
        stale = [r for r in targets if self._cwds.get(r.engine_id) != here]
        if stale:
            try:  # bounded: a rank still busy must not hold the cell here, past its own timeout and ladder
                found = self._group.view(stale).apply_async(remote.follow_folder, here).get(
                    timeout=self.config.timeout)
            except Exception as exc:
                log.warning("the ranks' folder was not moved to %s: %s", here, exc)
                return
            self._cwds.update((r.engine_id, here) for r in stale)
            self._folders.update((r.engine_id, (found_at["host"], found_at["folder"]))
                                 for r, found_at in zip(stale, found, strict=True))

    def folders(self, targets: list[RankInfo]) -> dict[int, tuple[str, str]]:
        """rank -> (host, the folder it works in as it last followed the notebook's), for the ranks of
        ``targets`` whose folder is known."""
        return {r.rank: self._folders[r.engine_id] for r in targets if r.engine_id in self._folders}

    def submit(self, code: str, *, ranks=None, timeout: float | None = None,
               on_output: OutputCallback | None = None) -> RunHandle:
        """Start ``code`` on the target ranks like :meth:`run`, but return at once.

        >>> h = s.submit("trainer.run(steps=5000)")     # doctest: +SKIP
        >>> h.done(), h.stop()                           # doctest: +SKIP
        """
        return RunHandle(self._cell(ranks, timeout, on_output), code, self._run)

    # -- looking inside: every rank's stacks now, a failed rank's frames ------------------
    def stacks(self, ranks=None, native: bool = False) -> Stacks:
        """Every thread's stack on the target ranks, taken by each rank's agent at once (also while a
        cell runs, or the ranks wait in a collective), grouped by identical stacks, odd ranks first.

        ``native``: native frames too, through py-spy, where it can attach (else it says why).

        >>> print(s.stacks().format())        # doctest: +SKIP
        stacks of 4 ranks in 2 groups (0.04 s)
        rank 3: sleep at cell line 3
        ...
        """
        targets = self.targets(ranks)
        if self._stacks is None:
            raise ValueError("this pool has no side channel to ask its ranks through.")

        def send(ranks: list[int], **details) -> None:
            self._group.command("stacks", [self.ranks[r] for r in ranks], **details)

        return self._stacks.gather([r.rank for r in targets], send, native=native)

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
        if self._busy.locked():
            raise ValueError("a cell is running on the pool: `%dist debug` looks at a failed cell once it "
                             "ended; `%dist stacks` shows what every rank does now.")
        view = self._group.view([info])
        if expr is None:
            if frame is not None:
                raise ValueError("--frame picks the frame to evaluate -e EXPR in: give an expression too.")
            return postmortem_report.fetch(view, rank)
        return postmortem_report.evaluate(view, rank, expr, frame)

    # -- status ----------------------------------------------------------------------
    def group_state(self) -> str:
        """The process group in one line: formed, destroyed on some ranks (torch's own
        ``destroy_process_group``: the next cell re-forms it), aborted after a fault (the next cell
        re-forms it), or broken by dead ranks (``%dist restart``). A script's ``destroy_process_group()``
        keeps it formed (the pool defers it).

        >>> s.group_state()      # doctest: +SKIP
        'process group: formed (backend gloo, world size 2)'
        """
        dead = self.dead_ranks()
        if dead:
            return (f"process group: broken, rank {format_ranks(sorted(dead))} dead; cells on the other "
                    "ranks run, `%dist restart` brings it back and re-forms the group")
        if self._group is not None and self._beacons is not None and self._active is None:
            self._group.heard_groups(self._beacons.latest)  # between cells only: a regroup changes them
        if self._group is not None and self._group.destroyed:
            return (f"process group: destroyed on rank {format_ranks(self._group.destroyed)} (torch's own "
                    "destroy_process_group, not the pool's deferred one); the next cell re-forms it")
        if self._group is None or not self._group.ok:
            return "process group: aborted after a fault; the next cell re-forms it"
        return f"process group: formed (backend {self.backend}, world size {self.world_size})"

    def status(self) -> list[dict]:
        """One row per rank: rank, host, pid, device, state (idle, busy or failed: see
        :func:`workbench.pool.watch.queues.rank_states`, which the panel's cards read too); then one per
        engine declared lost ("lost, fenced": refused, told to stop when heard; "lost, stopped": its host
        answered the kill, or it was heard, told, and is silent since)."""
        if not self.running:
            return []
        self._check()
        states = rank_states(self.client, {r.rank: r.engine_id for r in self.ranks}, dead=self.dead_ranks())
        rows = [{"rank": r.rank, "host": self._pool.host_label(r.host), "pid": r.pid, "device": r.device,
                 "state": states[r.rank]}
                for r in self.ranks]
        return rows + fenced_rows(self._group.fenced, self._beacons, self._pool.fenced_ended())
