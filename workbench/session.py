"""The one joint between the engine pool and the process group.

>>> from workbench import Session
>>> with Session(n=2).start() as s:                        # doctest: +SKIP
...     s.run("import torch; t = torch.ones(1) * rank; dist.all_reduce(t)")
...     s.pull("t")
[tensor([1.]), tensor([1.])]
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil

from workbench import faults
from workbench.config import PoolConfig
from workbench.errors import CellTimeout, NoPoolError, PoolStartError, RankDiedError, RankError
from workbench.pool import netif
from workbench.pool.cluster import EnginePool
from workbench.pool.devices import visible_gpu_count
from workbench.pool.idle import IdleRelease
from workbench.pool.launchers import default_engines
from workbench.pool.rankmap import (EngineInfo, RankInfo, build_rank_map, format_ranks, parse_ranks,
                                    remap_engines)
from workbench.pool.watch import BeaconReceiver

# Called with (rank, kind, payload): kind is "stdout"/"stderr" (text) or "display" (a display_data content dict).
OutputCallback = Callable[[int, str, Any], None]

# How the other ranks are stopped once one failed: (seconds after the failure, step). "abort" aborts the
# process group on the ranks that already stopped, so peers blocked in a collective with them fail at once.
AFTER_FAILURE = ((0.3, "abort"), (0.8, "sigint"), (3.0, "sigterm"), (5.0, "sigkill"))
# After a timeout or Ctrl-C the ranks running Python are interrupted first.
AFTER_INTERRUPT = ((0.0, "sigint"), (0.3, "abort"), (3.0, "sigterm"), (5.0, "sigkill"))
# While a cell runs, dead ranks are looked for at most this often (each look reads /proc for every
# rank): a trivial cell then costs no look at all, and a death is still seen within 0.1 s.
DEAD_CHECK_S = 0.05
# Silence after which a rank on another node counts as dead.
REMOTE_SILENCE_S = 3.0

_current: Session | None = None


def current() -> Session:
    """The session started last in this process (what the magics drive)."""
    if _current is None or not _current.running:
        raise NoPoolError()
    return _current


@dataclass
class RankResult:
    """What one rank produced for one cell."""

    rank: RankInfo
    stdout: str = ""
    stderr: str = ""
    result: dict | None = None  # the last expression's mime bundle, e.g. {"text/plain": "42"}
    outputs: list = field(default_factory=list)  # display_data contents
    error: Any = None  # ipyparallel RemoteError, or RankDied
    completed: Any = None


@dataclass
class CellResult:
    """Every target rank's result, in rank order."""

    ranks: list[RankResult]
    elapsed: float
    fault: faults.FaultEvent | None = None

    def failures(self) -> list[RankResult]:
        """The ranks that failed, root cause first: dead ranks, then real errors, then echoes."""
        def order(r):
            err = r.error
            tier = 0 if isinstance(err, RankDied) else 2 if faults.is_secondary(err.ename, str(err.evalue)) else 1
            done = r.completed.timestamp() if hasattr(r.completed, "timestamp") else float("inf")
            return tier, done, r.rank.rank
        return sorted((r for r in self.ranks if r.error is not None), key=order)


class RankDied:
    """The error of a rank whose engine process is gone."""

    ename = "RankDied"

    def __init__(self, info: RankInfo, how: str):
        self.evalue = f"the engine process {info.pid} of rank {info.rank} {how}"

    def render_traceback(self) -> list[str]:
        return [f"RankDied: {self.evalue}. `%dist restart` (Session.restart()) brings the rank back."]


class Session:
    """A pool of engines joined into one torch.distributed process group.

    >>> s = Session(n=2, timeout=30)     # doctest: +SKIP
    >>> s.start(progress=print)          # doctest: +SKIP
    >>> s.run("x = rank * 10")           # doctest: +SKIP
    >>> s.pull("x")                      # doctest: +SKIP
    [0, 10]
    >>> s.stop()                         # doctest: +SKIP
    """

    def __init__(self, config: PoolConfig | None = None, **kwargs):
        self.config = netif.resolve(config or PoolConfig(**kwargs))  # --interface -> its address
        self.ranks: list[RankInfo] = []
        self.backend: str | None = None
        self.start_seconds: float | None = None
        self.faults: list[faults.FaultEvent] = []
        self._pool: EnginePool | None = None
        self._beacons: BeaconReceiver | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._group_ok = False
        self._dead: dict[int, str] = {}  # rank -> how it died
        self._pending_fault: faults.FaultEvent | None = None
        self._watcher: threading.Thread | None = None
        self._busy = threading.Lock()
        self._gloo_ports: list[int] = []  # where gloo listens, on every rank: what an abort cuts
        self.metrics = None  # the kernel-side metrics collector (workbench.metrics), once started
        self._idle: IdleRelease | None = None  # config.idle_release: stops a pool nobody uses

    # -- lifecycle -----------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._pool is not None and self._pool.client is not None

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def pool_id(self) -> str | None:
        return self._pool.pool_id if self._pool else None

    @property
    def local(self) -> bool:
        return self.config.launcher == "local"

    def start(self, progress: Callable[[str], None] = lambda msg: None) -> Session:
        """Start the engines and form the process group; returns self once every rank is ready."""
        global _current
        if self.running:
            raise ValueError("this session is already running: stop it first, or use it as it is.")
        t0 = time.perf_counter()
        n = default_engines(self.config, visible_gpu_count() if self.local else 0)
        if not netif.is_loopback(self.config.address):
            warnings.warn(netif.UNAUTHENTICATED.format(address=self.config.address),
                          netif.UnauthenticatedNetworkWarning, stacklevel=2)
        self._pool = EnginePool(n=n, launcher=self.config.launcher, address=self.config.address,
                                timeout=self.config.timeout, env=self._engine_env(n), config=self.config)
        client = self._pool.start(progress)
        try:
            progress("forming the process group")
            self._beacons = BeaconReceiver(self.config.address)
            self.ranks = build_rank_map(self._describe(client.ids))
            self._join_all()
            from workbench.metrics import collector as metrics_collector

            self.metrics = metrics_collector.attach(self)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - t0
        progress(f"ready: {n} ranks, backend {self.backend}, {self.start_seconds:.1f} s")
        atexit.register(self.stop)  # kernel shutdown and restart end the pool too
        self._start_watcher()
        if self.config.idle_release:
            self._idle = IdleRelease(self.config.idle_release, warn=self._idle_warning,
                                     release=self._idle_stop, busy=self._busy.locked)
        _current = self
        return self

    def _engine_env(self, n: int) -> dict[str, str]:
        if not self.local:
            return {"OMP_NUM_THREADS": "1"}
        return {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n))}

    @classmethod
    def attach(cls, pool_id: str) -> Session:
        """Drive a pool that another notebook or the JupyterLab panel started.

        The ranks keep their process group and their state.

        >>> s = Session.attach("1a2b3c4d")      # doctest: +SKIP
        """
        global _current
        pool = EnginePool.attach(pool_id)
        state = pool.state
        self = cls(PoolConfig(n=state["n"], launcher=state["launcher"],
                              backend=state.get("backend_requested", "auto"),
                              address=state.get("address", "127.0.0.1")))
        self._pool = pool
        self.ranks = [RankInfo(**r) for r in state.get("ranks", [])]
        if len(self.ranks) != state["n"]:
            pool.client.close()
            raise PoolStartError(f"pool {pool_id} has not finished starting: try again in a moment.")
        self.backend = state.get("backend")
        self._group_ok = True
        _current = self
        return self

    def _describe(self, engine_ids) -> list[EngineInfo]:
        from workbench.engine import rendezvous

        view = self._pool.client[list(engine_ids)]
        infos = view.apply_async(rendezvous.describe).get(timeout=self.config.timeout)
        return [EngineInfo(eid, i["host"], i["pid"], i["gpus"]) for eid, i in zip(view.targets, infos)]

    def _join_all(self) -> None:
        """Form (or re-form) the process group on every rank at once."""
        from workbench.engine import rendezvous

        client = self._pool.client
        per_host = max(sum(r.host == h for r in self.ranks) for h in {r.host for r in self.ranks})
        threads = max(1, (os.cpu_count() or 1) // per_host)
        root = self.ranks[0]
        # Off this machine each rank talks over the interface that reaches the kernel's address, and rank 0
        # binds the store on its own address there (never on all interfaces).
        routes = {}
        if not self.local:
            found = client[[r.engine_id for r in self.ranks]].apply_sync(netif.route_to, self.config.address)
            routes = {r.rank: route for r, route in zip(self.ranks, found, strict=True)}
        store_address = routes[root.rank]["address"] if routes else self.config.address
        port = client[root.engine_id].apply_sync(rendezvous.open_store, store_address, self.config.timeout)
        futures = [
            client[r.engine_id].apply_async(
                rendezvous.join, rank=r.rank, local_rank=r.local_rank, world_size=len(self.ranks),
                address=store_address, port=port, backend=self.config.backend, device=r.device,
                timeout_s=self.config.timeout, threads=threads,
                ifname="lo" if self.local else routes[r.rank]["ifname"],
                beacon=self._beacons.url if self._beacons else None)
            for r in self.ranks
        ]
        try:
            joined = [f.get(timeout=self.config.timeout + 5) for f in futures]
        except Exception as exc:
            raise PoolStartError(f"the process group did not form: {exc}") from exc
        self.backend = joined[0]["backend"]
        if self._beacons is not None:
            self._beacons.expect(r.rank for r in self.ranks)
        self._gloo_ports = sorted({p for j in joined for p in j.get("gloo_ports", [])})
        self._procs = {r.rank: psutil.Process(r.pid) for r in self.ranks} if self.local else {}
        self._group_ok = True
        self._pool.update_state(ranks=[r.__dict__ for r in self.ranks], backend=self.backend,
                                backend_requested=self.config.backend)
        if self.metrics is not None:  # re-formed or restarted: every rank's publisher (re)connects
            from workbench.metrics.collector import attach as attach_metrics

            attach_metrics(self, self.metrics)

    def stop(self) -> None:
        """Stop every engine and the controller; nothing of the pool is left running."""
        global _current
        watcher, self._watcher = self._watcher, None
        if self._idle is not None:
            self._idle.close()
            self._idle = None
        if self._pending_fault is not None:
            faults.append(self._pending_fault)
            self._pending_fault = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self._pool is not None:
            self._end_local_engines()
            self._pool.stop()
        self._pool = None
        if self._beacons is not None:
            self._beacons.close()
            self._beacons = None
        if watcher is not None:
            watcher.join(2)
        if _current is self:
            _current = None

    def _end_local_engines(self, grace: float = 0.5) -> None:
        """Ask the engines to shut down; SIGKILL local ones still exiting after ``grace``.

        Once torch._dynamo is imported (FSDP and pipelining import it) an engine spends about
        3 s in interpreter exit; its state is being thrown away, so we do not wait for that.
        """
        if not self.local or self._pool.client is None or self._pool.attached:
            return
        procs = [p for p in self._procs.values() if p.is_running()]
        try:
            self._pool.client.shutdown(targets="all", block=False)  # no reply to wait for at exit
        except Exception:
            pass  # an engine already gone: the pool's stop cleans up the rest
        _, slow = psutil.wait_procs(procs, timeout=grace)
        for proc in slow:
            try:  # its helpers too (ipyparallel's nanny): they would wait for a parent that is gone
                doomed = [*proc.children(recursive=True), proc]
            except psutil.Error:
                continue
            for p in doomed:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(doomed, timeout=grace)

    def __enter__(self) -> Session:
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pids(self) -> list[int]:
        """Every process the pool started (controller, engines, lease)."""
        return self._pool.pids() if self._pool else []

    @property
    def client(self):
        if not self.running:
            raise NoPoolError()
        return self._pool.client

    # -- health ----------------------------------------------------------------------
    def dead_ranks(self) -> dict[int, str]:
        """Ranks whose engine is gone, with how: a local engine's exit is seen at once."""
        for r in self.ranks:
            if r.rank in self._dead:
                continue
            proc = self._procs.get(r.rank)
            if proc is not None:
                try:
                    gone = proc.status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    gone = True
                if gone:
                    self._dead[r.rank] = "exited"
            elif self._beacons is not None and self._beacons.silent_for(r.rank) > REMOTE_SILENCE_S:
                self._dead[r.rank] = f"sent no heartbeat for {REMOTE_SILENCE_S:g} s"
        return dict(self._dead)

    def _start_watcher(self) -> None:
        """Report a rank that dies while the pool is idle, not only at the next cell."""
        def watch():
            while self._watcher is me and self.running:
                if self._busy.acquire(blocking=False):
                    try:
                        known = set(self._dead)
                        for rank, how in self.dead_ranks().items():
                            if rank not in known:
                                self._record_fault("died", self.ranks[rank], f"rank {rank} {how} while idle",
                                                   detect_s=None, abort_s=0.0)
                                print(f"workbench: rank {rank} ({self.ranks[rank].host}, {self.ranks[rank].device}) "
                                      f"died while the pool was idle; `%dist restart` brings it back.", flush=True)
                    finally:
                        self._busy.release()
                time.sleep(0.5)

        me = self._watcher = threading.Thread(target=watch, name="workbench-watch", daemon=True)
        me.start()

    def _record_fault(self, kind, info, text, detect_s, abort_s) -> faults.FaultEvent:
        if self._pending_fault is not None:
            faults.append(self._pending_fault)
        event = faults.FaultEvent(pool=self.pool_id, kind=kind, rank=info.rank if info else None,
                                  host=info.host if info else None, device=info.device if info else None,
                                  first_failure=text, time=faults.now(), detect_s=detect_s, abort_s=abort_s)
        self.faults.append(event)
        self._pending_fault = event
        return event

    def _ensure_group(self) -> None:
        """Before a cell: refuse with dead ranks, re-form a process group that a fault aborted."""
        dead = self.dead_ranks()
        if dead:
            rank = min(dead)
            raise RankDiedError(f"{self.ranks[rank].label()} is dead ({dead[rank]}): `%dist restart` "
                                "(Session.restart()) starts a new engine for it and re-forms the process group.")
        if not self._group_ok:
            self._reform()

    def _reform(self, since: float | None = None) -> None:
        """Abort what is left of the old group on every rank (never destroy), then join anew."""
        from workbench.engine import guard

        t0 = time.perf_counter() if since is None else since
        alive = [r.engine_id for r in self.ranks if r.rank not in self._dead]
        self._pool.client[alive].apply_sync(guard.abort, self._gloo_ports)
        self._join_all()
        self._close_fault(time.perf_counter() - t0)

    def _close_fault(self, recover_s: float) -> None:
        if self._pending_fault is not None:
            self._pending_fault.recover_s = recover_s
            faults.append(self._pending_fault)
            self._pending_fault = None

    def restart(self, progress: Callable[[str], None] = lambda msg: None) -> list[int]:
        """Start a new engine for every dead rank, on the same host and device, and re-form the group.

        The surviving ranks keep their Python state. Returns the ranks that were restarted.
        """
        if not self.running:
            raise NoPoolError("restart")
        with self._busy:  # keep the idle watcher from judging the ranks half-way
            return self._restart(progress)

    def _restart(self, progress) -> list[int]:
        t0 = time.perf_counter()
        dead = sorted(self.dead_ranks())
        if dead:
            if not self.local:
                raise ValueError("restarting ranks is supported for local pools; stop and start the pool.")
            old_ids = set(self._pool.client.ids)
            progress(f"starting {len(dead)} engine(s) for rank {', '.join(map(str, dead))}")
            new_ids = self._pool.start_more(len(dead), old_ids)
            replaced = remap_engines([self.ranks[r] for r in dead], self._describe(new_ids))
            for info in replaced:
                self.ranks[info.rank] = info
            self._dead.clear()
        progress("re-forming the process group")
        self._reform(since=t0)
        return dead

    def scale(self, n: int, progress: Callable[[str], None] = lambda msg: None) -> list[RankInfo]:
        """Grow or shrink the pool to ``n`` ranks and re-form the process group at that world size.

        Growing starts engines through the pool's launcher; shrinking stops the highest ranks. Ranks
        stay contiguous per host; the ranks that remain keep their Python state (a training run then
        resumes from its checkpoint at the new world size). Returns the new rank map.

        >>> s.scale(4, progress=print)        # doctest: +SKIP
        starting 2 engines
        re-forming the process group at world size 4
        """
        if n < 1:
            raise ValueError(f"a pool needs at least one rank (got {n}).")
        if not self.running:
            raise NoPoolError("scale")
        with self._busy:
            dead = self.dead_ranks()
            if dead:
                raise RankDiedError(f"rank {min(dead)} is dead: `%dist restart` it (or stop and start the "
                                    "pool) before scaling.")
            t0 = time.perf_counter()
            keep = [r.engine_id for r in self.ranks[:n]]
            if n > self.world_size:
                progress(f"starting {n - self.world_size} engines")
                keep += self._pool.start_more(n - self.world_size, set(self._pool.client.ids))
            elif n < self.world_size:
                progress(f"stopping rank {format_ranks(range(n, self.world_size))}")
                self._pool.stop_engines([r.engine_id for r in self.ranks[n:]])
            else:
                return list(self.ranks)
            self.ranks = build_rank_map(self._describe(keep))
            self._pool.n = n
            self._dead.clear()
            progress(f"re-forming the process group at world size {n}")
            self._reform(since=t0)
        return list(self.ranks)

    def _idle_warning(self, seconds_left: float) -> None:
        print(f"workbench: pool {self.pool_id} has been idle; it stops in {seconds_left:.0f} s to release "
              "its nodes. Run a cell on it to keep it.", flush=True)

    def _idle_stop(self) -> None:
        n = self.world_size
        self.stop()
        print(f"workbench: stopped the idle pool ({n} ranks) after {self.config.idle_release:g} s without "
              "a cell; its nodes are released. `%dist start` starts a new one.", flush=True)

    # -- rank helpers --------------------------------------------------------------
    def targets(self, ranks=None) -> list[RankInfo]:
        """Resolve ``None`` (all), a rank, a list of ranks or a spec like ``"0,2-3"``."""
        if not self.running:
            raise NoPoolError()
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

    def _view(self, targets: list[RankInfo]):
        return self.client[[r.engine_id for r in targets]]

    # -- data --------------------------------------------------------------------------
    def push(self, values: dict, ranks=None) -> None:
        """Send ``{name: value}`` into the namespace of the target ranks."""
        self._view(self.targets(ranks)).push(values, block=True)

    def pull(self, name: str, rank: int | None = None):
        """A value from one rank, or a list with every rank's value (in rank order)."""
        if rank is not None:
            return self.client[self.targets(rank)[0].engine_id].pull(name, block=True)
        return self._view(self.targets()).pull(name, block=True)

    def apply(self, fn: Callable, *args, ranks=None, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on the target ranks at once; the results in rank order."""
        return self._view(self.targets(ranks)).apply_sync(fn, *args, **kwargs)

    # -- cells ---------------------------------------------------------------------------
    def run(self, code: str, *, ranks=None, timeout: float | None = None,
            on_output: OutputCallback | None = None, on_tick: Callable[[], None] | None = None) -> CellResult:
        """Run ``code`` on the target ranks at once, streaming output as it comes.

        Raises :class:`RankError` naming the rank that failed first (an exception, or a
        dead engine), :class:`CellTimeout` naming the stalled rank when ``timeout``
        passes, and ``KeyboardInterrupt`` after interrupting the ranks. In each case the
        other ranks are stopped within seconds and the next cell re-forms the group.
        """
        targets = self.targets(ranks)
        with self._busy:
            self._ensure_group()
            return _CellWatch(self, targets, timeout, on_output, on_tick).run(code)

    def submit(self, code: str, *, ranks=None, timeout: float | None = None,
               on_output: OutputCallback | None = None) -> RunHandle:
        """Start ``code`` on the target ranks like :meth:`run`, but return at once.

        >>> h = s.submit("trainer.run(steps=5000)")     # doctest: +SKIP
        >>> h.done(), h.stop()                           # doctest: +SKIP
        """
        return RunHandle(self, code, ranks=ranks, timeout=timeout, on_output=on_output)

    def _abort_on(self, infos: list[RankInfo]) -> None:
        from workbench.engine import guard

        alive = [r for r in infos if r.rank not in self._dead]
        if alive:
            self._group_ok = False
            self._view(alive).apply_async(guard.abort, self._gloo_ports).wait(1.0)

    def _signal(self, infos: list[RankInfo], sig: int) -> None:
        """Signal the engines of ``infos``: directly where local, through ipyparallel otherwise."""
        infos = [r for r in infos if r.rank not in self._dead]
        if not infos:
            return
        if sig != signal.SIGINT:
            self._group_ok = False
        if self.local:
            for r in infos:
                try:
                    os.kill(r.pid, sig)
                except ProcessLookupError:
                    pass
        else:
            self.client.send_signal(sig, targets=[r.engine_id for r in infos], block=False)

    # -- status ----------------------------------------------------------------------
    def status(self) -> list[dict]:
        """One row per rank: rank, host, pid, device, state (idle, busy or dead)."""
        if not self.running:
            return []
        dead = self.dead_ranks()
        alive = set(self.client.ids)
        queues = self.client.queue_status(targets=[r.engine_id for r in self.ranks if r.engine_id in alive])
        rows = []
        for r in self.ranks:
            if r.rank in dead or r.engine_id not in alive:
                state = "dead"
            else:
                q = queues.get(r.engine_id, {})
                state = "busy" if q.get("queue", 0) or q.get("tasks", 0) else "idle"
            rows.append({"rank": r.rank, "host": r.host, "pid": r.pid, "device": r.device, "state": state})
        return rows


class _CellWatch:
    """One cell on its ranks: streams output, watches for failures, stops the rest when one fails."""

    def __init__(self, session: Session, targets: list[RankInfo], timeout, on_output, on_tick=None):
        self.s, self.targets, self.timeout = session, targets, timeout
        self.on_tick = on_tick  # called on the kernel's main thread at every wake-up (the dashboard)
        self.relay = _OutputRelay(on_output)
        self.ladder: tuple = ()
        self.fault_at: float | None = None
        self.steps_done: set[str] = set()
        self.fault: faults.FaultEvent | None = None
        self.interrupted = False
        self.timed_out: str | None = None

    def run(self, code: str) -> CellResult:
        t0 = time.perf_counter()
        ar = self.s._view(self.targets).execute(code, silent=False, block=False)
        by_engine = {r.engine_id: r for r in self.targets}
        self.children = [(by_engine[eid], child) for eid, child in zip(ar._targets, ar._children)]
        wake = threading.Event()
        for _, child in self.children:
            child.iopub_callbacks.append(lambda msg: wake.set())
        ar.add_done_callback(lambda f: wake.set())
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self._checked, self._dead_seen = time.monotonic(), dict(self.s._dead)  # run() just checked
        while True:
            try:
                wake.wait(0.05)
                wake.clear()
                self.relay.forward(self.children)
                if self.on_tick is not None:
                    self.on_tick()
                if self._finished():
                    break
                now = time.monotonic()
                if self.fault_at is None:
                    self._detect(now)
                    if deadline is not None and now > deadline and self.fault_at is None:
                        self._hang(now)
                else:
                    self._escalate(now)
            except KeyboardInterrupt:
                if self.interrupted:
                    raise
                self.interrupted = True
                self._start_fault(time.monotonic(), "interrupt", None, "Ctrl-C in the notebook", AFTER_INTERRUPT)
        if all(c.done() for _, c in self.children):  # a dead rank's output never completes
            ar.wait_for_output(0 if self.fault_at else 5)
        self.relay.forward(self.children)
        result = CellResult([self._rank_result(r, c) for r, c in self.children], time.perf_counter() - t0)
        if self.fault is not None:
            self.fault.abort_s = round(time.monotonic() - self.fault_at, 3)
            result.fault = self.fault
        if self.interrupted:
            raise KeyboardInterrupt
        if self.timed_out is not None:
            raise CellTimeout(self.timed_out)
        failures = result.failures()
        if failures:
            if self.fault is None:  # failed without anyone waiting: nothing to stop
                first = failures[0]
                self.fault = result.fault = self.s._record_fault(
                    "exception", first.rank, f"{first.error.ename}: {first.error.evalue}", None, 0.0)
            raise RankError([(f.rank, f.error) for f in failures], result)
        return result

    def _dead(self, now: float | None = None) -> dict[int, str]:
        """Dead ranks, looked for (psutil reads /proc for every rank) at most every DEAD_CHECK_S."""
        now = time.monotonic() if now is None else now
        if now - self._checked >= DEAD_CHECK_S:
            self._checked, self._dead_seen = now, self.s.dead_ranks()
        return self._dead_seen

    def _finished(self) -> bool:
        if all(c.done() for _, c in self.children):
            return True
        dead = self._dead()
        return all(c.done() or r.rank in dead for r, c in self.children)

    def _detect(self, now: float) -> None:
        dead = self._dead(now)
        for r, _ in self.children:
            if r.rank in dead:
                self._start_fault(now, "died", r, f"rank {r.rank} {dead[r.rank]}", AFTER_FAILURE)
                return
        for r, c in self.children:
            err = c.output.metadata["error"]
            if err is not None and not faults.is_secondary(err.ename, str(err.evalue)):
                done = c.output.metadata["completed"]
                detect = time.time() - done.timestamp() if hasattr(done, "timestamp") else None
                self._start_fault(now, "exception", r, f"{err.ename}: {err.evalue}", AFTER_FAILURE, detect)
                return

    def _hang(self, now: float) -> None:
        """The timeout passed: name the stalled ranks and the last collective all ranks completed."""
        running = [r for r, c in self.children if not c.done()]
        beats = self.s._beacons.latest if self.s._beacons else {}
        stalled = [r for r in running if not (beats.get(r.rank) or {}).get("inflight")] or running
        done = [beats[r.rank]["done"] for r in self.targets if r.rank in beats]
        last = min(done) if done else None
        last_name = next((beats[r.rank]["done_name"] for r in self.targets
                          if r.rank in beats and beats[r.rank]["done"] == last), None)
        where = {r.rank: (beats.get(r.rank) or {}).get("where") for r in stalled}
        self.timed_out = (
            f"the cell ran past its timeout of {self.timeout:g} s. Stalled: "
            + "; ".join(f"{r.label()} at {where[r.rank] or 'an unknown line'}" for r in stalled)
            + (f". Last collective every rank completed: #{last} ({last_name})." if last else
               ". No collective had completed on every rank.")
            + " The ranks were interrupted; the next cell re-forms the process group."
        )
        self._start_fault(now, "hang", stalled[0], self.timed_out, AFTER_INTERRUPT)

    def _start_fault(self, now, kind, info, text, ladder, detect_s=None) -> None:
        self.fault_at, self.ladder = now, ladder
        self.fault = self.s._record_fault(kind, info, text, detect_s, None)
        self._escalate(now)

    def _escalate(self, now: float) -> None:
        for after, step in self.ladder:
            if step in self.steps_done or now - self.fault_at < after:
                continue
            self.steps_done.add(step)
            running = [r for r, c in self.children if not c.done() and r.rank not in self.s._dead]
            if not running:
                return
            if step == "abort":
                self.s._abort_on([r for r, c in self.children if c.done() or r.rank in self.s._dead]
                                 or running)
            else:
                self.s._signal(running, {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM,
                                         "sigkill": signal.SIGKILL}[step])

    def _rank_result(self, info: RankInfo, child) -> RankResult:
        md = child.output.metadata
        error = md["error"]
        if error is None and child.done() and child.exception() is not None:
            error = child.exception()
        if info.rank in self.s._dead and (error is None or error.ename == "EngineError"):
            error = RankDied(info, self.s._dead[info.rank])
        return RankResult(
            rank=info, stdout=md["stdout"] or "", stderr=md["stderr"] or "",
            result=(md["execute_result"] or {}).get("data"), outputs=list(md["outputs"]),
            error=error, completed=md["completed"],
        )


class _OutputRelay:
    """Forwards each rank's new output exactly once, from the full text ipyparallel accumulates."""

    def __init__(self, on_output: OutputCallback | None):
        self.on_output = on_output
        self.sent: dict[tuple[int, str], int] = {}

    def forward(self, children) -> None:
        if self.on_output is None:
            return
        for info, child in children:
            md = child.output.metadata
            for kind in ("stdout", "stderr"):
                text = md[kind] or ""
                done = self.sent.get((info.rank, kind), 0)
                if len(text) > done:
                    self.sent[(info.rank, kind)] = len(text)
                    self.on_output(info.rank, kind, text[done:])
            outputs = md["outputs"]
            done = self.sent.get((info.rank, "display"), 0)
            for content in outputs[done:]:
                self.on_output(info.rank, "display", content)
            self.sent[(info.rank, "display")] = len(outputs)


class RunHandle:
    """A cell running in the background (:meth:`Session.submit`): :meth:`Session.run` on a thread."""

    def __init__(self, session: Session, code: str, **run_kwargs):
        from concurrent.futures import Future

        self.session = session
        self.targets = session.targets(run_kwargs.get("ranks"))
        self._future: Future = Future()
        threading.Thread(target=self._run, args=(code, run_kwargs), name="workbench-submit", daemon=True).start()

    def _run(self, code: str, run_kwargs: dict) -> None:
        try:
            self._future.set_result(self.session.run(code, **run_kwargs))
        except BaseException as exc:
            self._future.set_exception(exc)

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> CellResult:
        """The cell's result once it ends; raises what :meth:`Session.run` raises (e.g. RankError)."""
        return self._future.result(timeout)

    def stop(self, timeout: float = 10.0) -> CellResult | None:
        """Interrupt the ranks still running the cell and wait for them; returns what they produced."""
        if not self.done():
            self.session._signal(self.targets, signal.SIGINT)
        try:
            return self.wait(timeout)
        except RankError as exc:
            return exc.result

    def add_done_callback(self, fn: Callable[[RunHandle], None]) -> None:
        self._future.add_done_callback(lambda _: fn(self))

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._future.exception() else "done")
        return f"<RunHandle ranks {[r.rank for r in self.targets]} {state}>"
