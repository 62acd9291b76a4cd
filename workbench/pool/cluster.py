"""Engine pool lifecycle over ipyparallel: start engines, watch them come up, stop them all.

Never imports torch: the engines do that.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import ipyparallel as ipp
import psutil
from ipyparallel.cluster.launcher import BatchSystemLauncher, LocalProcessLauncher, SSHLauncher

from workbench import wire
from workbench.config import WALLTIME_WARNING_S, PoolConfig
from workbench.errors import PoolStartError
from workbench.pool.launch import Launcher, launcher_for, spawn, start_errors
from workbench.pool.machine import exposure
from workbench.pool.processes import quiet, reap, spare
from workbench.pool.processes.zygote import Zygote
from workbench.pool.records import sharing
from workbench.pool.records import state as pool_state
from workbench.pool.records.state import PoolState
from workbench.pool.watch.relay import Relay
from workbench.pool.watch.walltime import Walltime

# The controller counts newly registered engines only at its next heartbeat round:
# the default 3 s period makes a local start wait seconds for nothing. This is the pace while engines
# register; a settled pool beats once a second (workbench.pool.watch.heart).
HEARTBEAT_MS = 100
# ...but an engine that misses pings on a loaded machine must not be dropped as dead after 1 s (the
# default 10 misses): the controller would then fail its cells and forget it. Deaths are found by our
# own watcher (a pidfd locally, the beacons elsewhere) within a second; this is the controller's
# last resort, at 10 s.
HEARTBEAT_MISSES = 100
# The controller forgets an engine that registered but whose heart it has not seen answer a ping within
# its registration timeout (ipyparallel: 30 s); on a loaded machine an engine can take that long between its
# registration and its first answer (it builds its kernel first). The controller waits as long as we do.
# A start whose count of engines has not moved for this long asks the controller which it registered.
RESYNC_S = 2.0
# How many engines one ``timeout`` is for: a start of more waits proportionally longer.
ENGINES_PER_TIMEOUT = 32


def _ended(launcher) -> bool:
    """Whether the process of an engine launcher has ended (ipyparallel marks it "after" from its event loop,
    which may not run here: the process is looked at too; a zombie has ended)."""
    if getattr(launcher, "state", "") == "after":
        return True
    process = getattr(launcher, "process", None)
    if process is None:
        return False
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def registration_wait(timeout: float, n: int) -> float:
    """How long a start of ``n`` engines waits for them to register: ``timeout``, longer beyond
    :data:`ENGINES_PER_TIMEOUT` engines (a 2-core machine starts 64 forked engines in about 20 s idle, more
    under load).

    >>> registration_wait(60, 8), registration_wait(60, 64)
    (60, 120.0)
    """
    return timeout if n <= ENGINES_PER_TIMEOUT else timeout * n / ENGINES_PER_TIMEOUT

# Engines started as new interpreters (remote launchers) import torch in the background while they
# register: that import is most of their time to a ready pool, and it overlaps with the registration.
PRELOAD = ("import threading; "
           "threading.Thread(target=__import__, args=('workbench.engine.rendezvous',), daemon=True).start()")
# No ipyparallel nanny per engine: the kernel signals local engines by pid, and the others through their
# agent (workbench.engine.agent); engine deaths are seen by the health watcher.
ENGINE_ARGS = [f"--IPEngine.startup_command={PRELOAD}", "--IPEngine.enable_nanny=False"]
# A forked engine does not watch the controller's heartbeat itself (that wakes its main thread ten times a
# second, idle or not): its zygote and the pool's lease end it with the pool, whatever ends first.
FORKED_ENGINE_ARGS = ["--IPEngine.max_heartbeat_misses=0"]

Progress = Callable[[str], None]


class EnginePool:
    """A controller plus ``n`` engines, each process recorded so none is left behind.

    >>> pool = EnginePool(n=2)                       # doctest: +SKIP
    >>> client = pool.start(progress=print)          # doctest: +SKIP
    >>> pool.stop()                                  # doctest: +SKIP
    """

    def __init__(self, *, n: int, launcher: str = "local", address: str = "127.0.0.1",
                 timeout: float = 60.0, env: dict[str, str] | None = None, config: PoolConfig | None = None,
                 pool_id: str | None = None):
        self.config = config or PoolConfig(launcher=launcher, timeout=timeout, address=address)
        self.n = n
        # what differs between launchers, asked of one object chosen once (workbench.pool.launch)
        self.launcher: Launcher = launcher_for(self.config)
        self.address = address
        self.timeout = timeout
        self.env = dict(env or {})
        self.pool_id = pool_id or uuid.uuid4().hex[:8]  # given: a pool started again keeps its id
        self.name = self.config.name or sharing.name_for(self.pool_id)
        self.work_dir: str | None = None  # scratch folder: batch scripts, never the notebook's folder
        self.cluster: ipp.Cluster | None = None
        self.client: ipp.Client | None = None
        self.state_file = None
        self.log_file: Path | None = None  # the controller's and engines' output
        self._lease: subprocess.Popen | None = None
        self.attached = False  # True when another process started this pool
        self.state = PoolState()  # what the state file says (workbench.pool.records.state)
        self._controller_watch: pool_state.ProcessWatch | None = None
        self.relay: Relay | None = None  # the side channel (beacons, metrics, commands); owner only
        self.channel: dict | None = None  # how to reach it: {"up": url, "out": url, "key": hex}
        self.zygote: Zygote | None = None  # local pools: forks the controller and the engines
        self._id_given = pool_id is not None
        self.notes: list[str] = []  # what its start said besides its progress (it uses part of a Slurm job)
        self.ends: float | None = None  # when its Slurm job's time limit ends it (None: none known)
        self._walltime: Walltime | None = None

    @property
    def forks(self) -> bool:
        """Whether this pool's processes are forked from a zygote: local pools, unless the launcher options
        name their own engine command."""
        return self.launcher.forks

    @property
    def engine_args(self) -> list[str]:
        """The ipengine arguments of every engine of this pool."""
        return ENGINE_ARGS + FORKED_ENGINE_ARGS * self.forks

    # -- start -----------------------------------------------------------------------
    def start(self, progress: Progress = lambda msg: None) -> ipp.Client:
        """Start controller and engines; return a connected client once all ``n`` registered.

        A start that fails in any way stops every process it started and raises one
        :class:`PoolStartError` (a :class:`~workbench.pool.launch.start_errors.StartInterrupted` for Ctrl-C).
        """
        self.launcher.check_address(self.address)
        self.launcher.check_capacity(self.n)
        self.launcher.preflight(self.n)
        if self.forks and not self._id_given:  # (a pool started again keeps its id, hence its tag)
            self.zygote = spare.take()  # started at %load_ext: torch is loaded already
            if self.zygote is not None:
                self.pool_id = self.zygote.pool_id  # its tag is the pool's
                self.name = self.config.name or sharing.name_for(self.pool_id)
        try:
            pool_state.prune_logs()
            self.log_file = pool_state.log_path(self.pool_id)
            pool_state.private_file(self.log_file).close()
            self.work_dir = tempfile.mkdtemp(prefix=f"workbench-{self.pool_id}-")
            self.env = {**self.env, **reap.tag(self.pool_id)}  # every process of the pool carries it
            spawn.allow(f"workbench-{self.pool_id}")  # a pool started again keeps its id
            self.cluster = ipp.Cluster(
                n=self.n,
                engines=self.launcher.engine_set,
                controller=spawn.PoolControllerLauncher,
                cluster_id=f"workbench-{self.pool_id}",
                # our state folder, not the profile's security/ folder: ipyparallel's own JupyterLab panel
                # lists every cluster file there (with START and DELETE buttons)
                cluster_file=str(pool_state.state_dir() / f"cluster-{self.pool_id}.json"),
                controller_ip=self.address,
                # warnings only: at INFO the controller logs a line for every query, e.g. each look of the
                # sidebar at which ranks are busy
                controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}", "--log-level=WARN",
                                 f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
                                 "--IPController.registration_timeout="
                                 f"{max(30, math.ceil(registration_wait(self.timeout, self.n)))}",
                                 *self._curve()],
                delay=0,  # engines wait for the controller's connection info anyway
                # forked engines start at once and read the controller's connection file when it is written
                send_engines_connection_env=not self.forks,
                # everything is set here: loading the profile's ipcluster config would scan every installed
                # package's entry points (0.1-0.5 s)
                load_profile=False,
                log_level=logging.ERROR,  # our messages name failures; ipyparallel would dump whole logs
                shutdown_atexit=False,  # stop() and the lease end the pool; ipyparallel's hook would block
            )
            key = wire.new_key()  # the side channel first: the state file records how to reach it
            # a local pool's side channel is unix sockets in its private folder: no other user can listen in
            self.relay = Relay(self.address, key, self.launcher.store_folder(self.pool_id))
            self.channel = {"up": self.relay.up, "out": self.relay.out, "key": key}
            self._record()  # the lease runs before any process of the pool exists
            if self.forks:
                if self.zygote is None:
                    self.zygote = Zygote(pool_id=self.pool_id, log=str(self.log_file), cwd=os.getcwd())
                self.zygote.hubs = self.launcher.hubs(self.pool_id, self.channel)  # a hub per host of forks
                spawn.zygotes[self.cluster.cluster_id] = self.zygote
                self._record()
            progress("starting controller")
            self.cluster.start_controller_sync(output_file=str(self.log_file),
                                               environment=reap.tag(self.pool_id))
            self._record()
            exposure.check(self._controller_pids(), [self.relay.up, self.relay.out], self.address,
                           self.config.interface)
            progress(f"starting {self.n} engines{self.launcher.via}")
            self.notes = self.launcher.notes(self.n)
            self.launcher.start_engines(self, self.n)
            # ipyparallel's serializer imports numpy at the first call sent to the engines: now, while they
            # register (not before: the import would hold up this thread's own)
            threading.Thread(target=importlib.import_module, args=("numpy",), name="workbench-numpy",
                             daemon=True).start()
            with quiet.curve_client():  # CurveZMQ: "signing is disabled" is wrong here
                self.client = self.cluster.connect_client_sync()
            self._wait_for_engines(progress)
            _, self.ends = self.launcher.ends(self)  # its Slurm job runs now: when it ends
            self._record()
        except BaseException as exc:
            with interrupts_held():  # a second Ctrl-C must not cut the clean-up short
                try:
                    error = self.explain(exc)
                finally:
                    self.stop()
            raise error from None
        return self.client

    def _curve(self) -> list[str]:
        """CurveZMQ for the controller: without it any user who reaches it can subscribe to its iopub and
        read every rank's output (signed, not encrypted); with it a socket needs the controller's key,
        which only the 0600 connection files (and the engines' connection info) hold."""
        return ["--IPController.enable_curve=True"]

    def explain(self, exc: BaseException) -> BaseException:
        """The one error to raise for ``exc``, which ended this pool's start (see start_errors)."""
        return start_errors.explain(exc, launcher=self.launcher, address=self.address, log=self.log_file,
                                    launched=self._launched(), n=self.n)

    def start_engine_set(self, n: int, placement: dict | None = None) -> None:
        """Start ``n`` engines through the pool's launcher (``placement``: where replacements go, as
        :meth:`Launcher.where_to_start <workbench.pool.launch.base.Launcher.where_to_start>` said)."""
        kwargs = self.launcher.engine_set_kwargs(n, work_dir=self.work_dir, env=self.env,
                                                 engine_args=self.engine_args, log=str(self.log_file or ""),
                                                 placement=placement)
        self._start_engines(n, kwargs)

    def start_engine_set_with(self, engine_set: type, n: int, kwargs: dict) -> list:
        """Start ``n`` engines with another ipyparallel engine-set launcher than the pool's own (a Slurm
        pool's replacement steps); return their launchers."""
        with _engine_class(self.cluster, engine_set):
            set_id = self._start_engines(n, kwargs)
        return list(self.cluster.engines[set_id].launchers.values())

    def _start_engines(self, n: int, kwargs: dict) -> str:
        try:
            return self.cluster.start_engines_sync(n=n, **kwargs)
        except subprocess.CalledProcessError as exc:  # sbatch, mpiexec or ssh refused: keep what it said
            if self.log_file is not None and exc.output:
                with pool_state.private_file(self.log_file) as f:
                    out = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output
                    f.write(out)
            raise
        finally:
            self._record()

    def _launched(self) -> int:
        """How many engines (or engine sets, for mpiexec and Slurm) were launched."""
        running = sum(1 for el in self.engine_launchers()
                      if getattr(el, "pid", 0) > 0 or getattr(el, "job_id", ""))
        return running + len(self._dead_engines())

    def _wait_for_engines(self, progress: Progress) -> None:
        wait = registration_wait(self.timeout, self.n)
        deadline = time.monotonic() + wait
        seen, changed = -1, time.monotonic()
        while True:
            up = len(self.client.ids)
            if up < self.n and time.monotonic() - changed > RESYNC_S:
                up, changed = self._sync_engines(), time.monotonic()
            if up != seen:
                seen, changed = up, time.monotonic()
                progress(f"engines up: {up}/{self.n}")
            if up >= self.n:
                return
            controller = self.cluster.controller
            if controller is not None and controller.state == "after":
                raise start_errors.start_error(
                    f"the controller exited while the engines were starting (it listened on {self.address})",
                    "The log has its whole output.", log=self.log_file)
            failed = self.launcher.start_failed(self)  # e.g. a pod no node fits, in the API's words
            if failed is not None:
                raise failed
            dead = self._dead_engines()
            if dead:
                raise start_errors.start_error(self.launcher.engines_exited(len(dead), self.n),
                                               "Their output is above; the log has all of it.",
                                               log=self.log_file)
            if time.monotonic() > deadline:
                why = self.launcher.why_slow(self)  # Slurm: its jobs' states; local: the machine's load
                raise start_errors.start_error(
                    f"only {up} of {self.n} engines registered within {wait:g} s{why}",
                    "Try a longer --timeout, or fewer engines.", log=self.log_file)
            time.sleep(self.launcher.poll_s)

    def _sync_engines(self) -> int:
        """How many engines the controller has registered, as it says; the client's list is brought up to
        date. (The client learns of each engine from a notification it subscribes to; on a loaded machine
        a start was seen stuck at 4 of 8 engines for two minutes while the controller's heart monitor had
        reported all 8 hearts.)"""
        try:
            future = self.client._send(self.client._query_stream, "connection_request")
            engines = future.result(timeout=5)["content"].get("engines") or {}
        except Exception:  # the controller is busy or gone: the loop's other checks say what happened
            return len(self.client.ids)
        self.client._update_engines(engines)
        return len(self.client.ids)

    def start_more(self, n: int, known_ids: set[int], *, alive: int, hosts: dict[str, int] | None = None,
                   cancelled: Callable[[], bool] = lambda: False) -> list[int]:
        """Start ``n`` more engines (to replace dead ones, or to grow) beside the ``alive`` ones still
        running; return their ids once registered. (``known_ids`` may hold dead engines: the controller
        drops an engine only after 10 s of missed heartbeats, so they do not count for the capacity.)
        ``hosts``: where they start, as the launcher's
        :meth:`~workbench.pool.launch.base.Launcher.where_to_start` said (an ssh pool: how many on which
        host; a Slurm pool: how many in which ``(job, node)``, each a new step). ``cancelled``: the wait ends
        (a :class:`PoolStartError`, the engines of this start ended) once it says so (an elastic run that
        asked for them ended)."""
        self.launcher.check_capacity(alive + n)
        self.launcher.preflight(n)
        steps = self.launcher.start_more(self, n, hosts)
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                new = sorted(set(self.client.ids) - known_ids)
                if len(new) >= n:
                    return new[:n]
                failed = self.launcher.start_failed(self)  # e.g. no node fits the new pod
                if failed is not None and len(new) < n:  # the pool runs on: only what failed is said
                    raise PoolStartError(f"{failed.what.rstrip(':.')}. "
                                         f"{failed.todo.replace(start_errors.STOPPED, '').strip()}")
                ended = [el for el in steps if _ended(el)]
                # srun refused or its step ended, or a new engine was killed before it registered: said at
                # once (it said why in the log), never waited for until the timeout
                if len(ended) > len(new):
                    raise PoolStartError(self.launcher.steps_ended(len(ended), self.log_file))
                if time.monotonic() > deadline:
                    raise PoolStartError(f"only {len(new)} of {n} new engines registered within "
                                         f"{self.timeout:g} s.")
                if cancelled():
                    raise PoolStartError("the start of new engines was cancelled")
                time.sleep(0.02)
        except BaseException:  # none of them registers later, to be taken for the engines of another start
            for el in steps:
                if not _ended(el):
                    with contextlib.suppress(Exception):
                        el.signal(signal.SIGKILL)
            raise

    def stop_engines(self, engine_ids: list[int], block: bool = True) -> None:
        """Shut down some engines (a shrink): their processes exit, the others keep running (``block``:
        wait for them; without, one that is stopped ends when it runs again)."""
        if engine_ids:
            self.client.shutdown(targets=list(engine_ids), block=block)

    def watch_walltime(self, warn: Callable[[str], None], end: Callable[[str], None]) -> None:
        """Watch the end of the pool's Slurm job, if it runs in one (:mod:`workbench.pool.watch.walltime`):
        ``warn(text)`` once, ``walltime_warning`` seconds before it (default 600), ``end(text)`` once the job
        is over. The pool's state records the job and its end (``workbench pools``, the card, ``%dist
        status``). Stopping the pool stops the watch."""
        record = self.launcher.allocation_record(self)
        if record is None or self._walltime is not None:
            return
        def ends() -> tuple[bool, float | None]:
            holding, when = self.launcher.ends(self)
            if when != self.ends and holding:  # a time limit changed (scontrol update): the state says so
                self.ends = when
                with contextlib.suppress(Exception):
                    self._record()
            return holding, when

        job = pool_state.allocation_words(record).removeprefix("inside ").removeprefix("in ")
        self._walltime = Walltime(ends, job=job, before=self.config.walltime_warning or WALLTIME_WARNING_S,
                                  warn=warn, ended=end, steps_ended=self._local_ended)

    def _local_ended(self) -> int:
        """How many of the pool's processes here that start engines (``srun`` steps) have ended."""
        return sum(1 for el in self.local_launchers() if el.state == "after")

    def fence(self, pids: list[int]) -> None:
        """End these engines (an elastic run declared them lost) where they run, if the launcher can (an ssh
        pool: over ssh, in the background, once their hosts answer; see
        :mod:`workbench.pool.launch.fence`)."""
        self.launcher.fence(self, pids)

    def host_label(self, host: str) -> str:
        """A rank's host as tables show it: with its machine where the host is not one (``wb-1a2b-x7k2p
        (node-3)``, a Kubernetes pod on its node)."""
        node = (self.launcher.places(self) or self.state.places).get(host)
        return f"{host} ({node})" if node else host

    def lost_hosts(self) -> dict[str, str]:
        """Hosts (a Kubernetes pool: pods) whose engines the launcher's own system says are gone, with how;
        the health watcher asks every look (:meth:`~workbench.pool.launch.base.Launcher.lost_hosts`)."""
        return self.launcher.lost_hosts(self)

    def fenced_ended(self, pids: set[int]) -> set[int]:
        """Of the engines declared lost (``pids``), those known ended (their host answered the ssh kill, or
        their process here is gone)."""
        return self.launcher.fenced_ended(set(pids))

    def engine_sets(self) -> list:
        """ipyparallel's engine-set launchers of the pool, one per start of engines."""
        return list((self.cluster.engines or {}).values()) if self.cluster else []

    def engine_launchers(self):
        """Every engine launcher: one per engine (local, ssh) or the whole set (mpiexec, a Slurm job)."""
        for engine_set in self.engine_sets():
            per_engine = getattr(engine_set, "launchers", None)
            if per_engine:  # a copy: ipyparallel's thread may be adding engines (a start being cancelled)
                yield from list(per_engine.values())
            else:
                yield engine_set

    def local_launchers(self):
        """The launchers whose process runs on this machine (ssh pids are on other hosts)."""
        for el in self.engine_launchers():
            if isinstance(el, LocalProcessLauncher) and not isinstance(el, SSHLauncher):
                yield el

    def _job_states(self) -> dict[str, str]:
        """Each batch job of the pool with its state and reason, e.g. ``{"12": "PENDING (Resources)"}``."""
        return self.launcher.job_states(self.engine_sets())

    def _dead_engines(self) -> set[str]:
        """The engines (or engine sets) that ended before registering; their output is in the log."""
        dead = set()
        for es in self.engine_sets():
            # copies: ipyparallel's thread adds and forgets engines while a cancelled start is explained;
            # a set forgets ended ones
            ended = list((getattr(es, "stop_data", None) or {}).get("engines", {}))
            dead.update(f"{es.engine_set_id}/{i}" for i in ended)
            for i, el in list((getattr(es, "launchers", None) or {"": es}).items()):
                if isinstance(el, BatchSystemLauncher):
                    gone = el.job_id and self._job_states().get(el.job_id) == "ended"
                else:
                    gone = el.state == "after" or (getattr(el, "process", None) is not None
                                                   and not el.process.is_running())
                if gone:
                    dead.add(f"{es.engine_set_id}/{i}")
        return dead

    # -- attach --------------------------------------------------------------------------
    @classmethod
    def attach(cls, ref: str, timeout: float = 10.0) -> EnginePool:
        """Connect to a pool another process started (a kernel, or the Jupyter server), by name or id."""
        running = pool_state.list_states()
        state = next((s for s in running if ref in (s.id, s.name)), None)
        if state is None:
            names = ", ".join(s.name or s.id for s in running) or "none"
            raise ValueError(f"no running pool {ref!r}; running pools: {names}.")
        config = pool_state.config_of(state)
        self = cls(n=state.n, launcher=config.launcher, timeout=timeout, address=config.address,
                   config=config, pool_id=state.id)
        self.name = state.name or self.name
        self.state = state
        # engines this process starts for the pool (a restart from an attached notebook) carry its tag, so
        # the owner's stop finds and ends them though it never recorded them
        self.env = {**self.env, **reap.tag(self.pool_id)}
        # quiet: when the owner stops the pool, ipyparallel would log the controller's whole output here
        self.cluster = ipp.Cluster.from_file(state.cluster_file, log_level=logging.CRITICAL,
                                             shutdown_atexit=False)
        with quiet.curve_client():  # CurveZMQ: "signing is disabled" is wrong here
            self.client = self.cluster.connect_client_sync()
        self.client.wait_for_engines(self.n, timeout=timeout)
        self.state_file = pool_state.state_path(self.pool_id)
        self.channel = state.channel
        self.attached = True
        return self

    # -- bookkeeping -----------------------------------------------------------------
    def pids(self) -> list[int]:
        """Every process this pool started on this machine: controller, engines (or mpiexec), lease.

        Engines started through Slurm or ssh run elsewhere: their jobs are in :meth:`jobs`.
        """
        if self.attached:
            return [rec["pid"] for rec in self.state.processes if pool_state.process_alive(rec)]
        pids = []
        if self.zygote is not None and self.zygote.alive():
            pids.append(self.zygote.pid)
        if self._controller_pid() > 0:
            pids.append(self._controller_pid())
        pids += [el.pid for el in self.local_launchers() if el.pid > 0]
        if self._lease is not None:
            pids.append(self._lease.pid)
        return pids

    def _controller_pid(self) -> int:
        """The controller's pid where this process started it (0: not started here, or not yet)."""
        return self.cluster.controller.pid if self.cluster and self.cluster.controller is not None else 0

    def _controller_record(self) -> dict | None:
        pid = self._controller_pid()
        if pid > 0:
            try:
                return pool_state.process_record(pid)
            except Exception:
                pass  # gone already: the record written before, if any, says which it was
        return self.state.controller

    def controller_exited(self) -> int | None:
        """The pid of this pool's controller if it has exited (killed, crashed), else None.

        Every request to the engines passes through the controller: without it a request (a cell, the
        ranks' queue states) would wait for ever, so the session asks this first. The controller runs on
        this machine for every launcher (the engines reach it over the network)."""
        record = self.state.controller
        if not record:
            return None
        if self._controller_watch is None or self._controller_watch.record != record:
            self._forget_controller()
            self._controller_watch = pool_state.ProcessWatch(record)  # asked before every cell: a pidfd
        return record["pid"] if self._controller_watch.exited() else None

    def _forget_controller(self) -> None:
        if self._controller_watch is not None:
            self._controller_watch.close()
            self._controller_watch = None

    def _controller_pids(self) -> list[int]:
        """The controller's process and its children (this machine)."""
        pid = self._controller_pid()
        try:
            proc = psutil.Process(pid) if pid > 0 else None
            return [pid, *(c.pid for c in proc.children(recursive=True))] if proc else []
        except psutil.Error:
            return []

    def jobs(self) -> list[str]:
        """The Slurm job ids of the pool's engine sets."""
        if self.attached:
            return [j["id"] for j in self.state.jobs]
        return [es.job_id for es in self.engine_sets() if isinstance(es, BatchSystemLauncher) and es.job_id]

    def _record(self, **extra) -> None:
        """Write the state file (and start the lease the first time)."""
        records = []
        for pid in self.pids():
            try:
                records.append(pool_state.process_record(pid))
            except Exception:
                pass  # already gone: nothing to clean up later
        cluster_id = self.cluster.cluster_id if self.cluster else ""
        security = Path(self.cluster.profile_dir, "security") if self.cluster else None
        self.state = replace(
            self.state,  # what update_state added (ranks, backend)
            id=self.pool_id,
            name=self.name,
            owner=pool_state.process_record(os.getpid()),
            n=self.n,
            config=self.config,  # every field: a restart elsewhere starts it as it was
            # what the lease cancels if the owner dies: engines on other nodes are not our processes
            jobs=[{"id": job, "cancel": [*self._cancel_command(), job]} for job in self.jobs()]
            + self.launcher.lease_jobs(self.pool_id),  # a Kubernetes pool: one delete of its objects
            # engines started over ssh: what stop and the lease run to end them
            remote=[{"id": f"{el.location}:{el.pid}",
                     "cancel": [*el.ssh_cmd, *el.ssh_args, el.location, "kill", str(el.pid)]}
                    for el in self.engine_launchers() if isinstance(el, SSHLauncher) and el.pid > 0],
            # the scratch folder; a local pool's store folder (where its ranks meet) goes with it
            dirs=([self.work_dir] if self.work_dir else [])
            + [folder for folder in [self.launcher.store_folder(self.pool_id, create=False)] if folder],
            cluster_file=self.cluster.cluster_file if self.cluster else None,
            processes=records,
            # the controller's own record: without it no rank can be reached (see controller_exited)
            controller=self._controller_record(),
            channel=self.channel,
            # ipyparallel's cluster and connection files: a SIGKILLed controller leaves them behind
            files=([self.cluster.cluster_file]
                   + [str(security / f"ipcontroller-{cluster_id}-{k}.json") for k in ("client", "engine")]
                   + [str(Path(self.cluster.profile_dir, "log", f"engines{cluster_id}.json"))]
                   if self.cluster else []),
            log=str(self.log_file) if self.log_file else None,
            places=self.launcher.places(self),  # a Kubernetes pool: each pod's node
            created=time.time(),
            allocation=self.launcher.allocation_record(self),  # the Slurm job its engines run in
            ends=self.ends,
            **extra,
        )
        self.state_file = pool_state.write_state(self.pool_id, self.state)
        if self._lease is None:
            with pool_state.private_file(self.log_file or Path(os.devnull)) as log:
                self._lease = subprocess.Popen(
                    [sys.executable, "-m", "workbench.pool.processes.lease", str(self.state_file)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                )

    def _cancel_command(self) -> list[str]:
        for es in self.engine_sets():
            if isinstance(es, BatchSystemLauncher):
                return list(es.delete_command)
        return ["scancel"]

    def update_state(self, **extra) -> None:
        """Record what the session knows (ranks, backend, the group's generation) for every other process.

        An attached session writes only these, into the owner's file (the pool's cell lock is held)."""
        if self.state_file is None:
            return
        if not self.attached:
            self._record(**extra)
            return
        state = pool_state.read_state(self.state_file)  # a file that is not a state: StateFileError
        if state is not None:
            self.state = replace(state, **extra)
            pool_state.write_state(self.pool_id, self.state)

    def _engine_processes(self) -> list[psutil.Process]:
        """The engine processes this process launched on this machine (none for an attached pool)."""
        procs = []
        for el in ([] if self.attached else self.local_launchers()):
            with contextlib.suppress(psutil.Error, ValueError):
                if el.pid > 0:
                    procs.append(psutil.Process(el.pid))
        return procs

    def close(self) -> None:
        """Let go of a pool without stopping it (an attached session detaches): the client closes."""
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        self.client = None
        self.cluster = None
        self._forget_controller()

    # -- stop ------------------------------------------------------------------------
    def stop(self, grace: float = 1.0) -> None:
        """End the pool: no engine starts any more, every process of it is gone, its files removed.

        Bounded: nothing waits for a reply from an engine (it may be gone already); processes that
        ignore SIGTERM for ``grace`` seconds are SIGKILLed. The log stays (a failed start names it).
        """
        if not self.attached and self.state_file is not None:
            with contextlib.suppress(Exception):
                self._record()  # the launchers' latest pids, jobs and remote engines
        state, self.state, self.state_file = self.state, PoolState(), None
        # first: while the file stands, the pool is listed as running, and its engines ending below would
        # show as failed ranks on the card of every server that lists it (issue 40, point 9)
        pool_state.state_path(self.pool_id).unlink(missing_ok=True)
        self._forget_controller()
        if self._walltime is not None:
            self._walltime.close()
            self._walltime = None
        if self.cluster is not None:
            spawn.cancel(self.cluster.cluster_id)
            spawn.zygotes.pop(self.cluster.cluster_id, None)
            self.cluster.cluster_file = ""  # ipyparallel's callbacks must not write it again
        engines = self._engine_processes()
        if self.client is not None:
            with contextlib.suppress(Exception):  # shutting engines down first keeps their tracebacks quiet
                self.client.shutdown(targets="all", block=False)
            # an engine asked to shut down exits in a moment, quietly; a SIGTERMed one writes a traceback
            # into the log, and ipyparallel copies a failed engine's log into its owner's (the Jupyter
            # server's) log. One that takes longer (torch._dynamo makes exit take seconds) is SIGKILLed:
            # its state is being thrown away. The client closes after: closed at once, it dropped the
            # request unsent, and every engine was SIGKILLed after the whole grace
            _, slow = psutil.wait_procs(engines, timeout=grace)
            for proc in slow:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            self.client.close()
            self.client = None
        ended = self.launcher.lease_jobs(self.pool_id)  # what its close() deletes itself (a Kubernetes pool's
        self.launcher.close()  # objects), after the engines were told
        if self._lease is not None:  # before the pool's processes: with its owner alive it only watches
            self._lease.terminate()
            self._lease.wait(timeout=5)
            self._lease = None
        reap.clean_up(replace(state, id=self.pool_id, jobs=[j for j in state.jobs if j not in ended]), grace)
        if self.zygote is not None:  # ended above with the pool's other processes
            self.zygote.close()
            self.zygote.proc.poll()
            self.zygote = None
        self.work_dir = None
        if self.relay is not None:  # last: the ranks' final beacons have somewhere to go until they end
            self.relay.close()
            self.relay = None
        self.cluster = None


@contextlib.contextmanager
def _engine_class(cluster: ipp.Cluster, launcher: type):
    """``cluster`` starts its next engine set with ``launcher``, then has its own class again, also in its
    cluster file (which names one class for every set: another process attaching reads the file)."""
    own = cluster.engine_launcher_class
    cluster.engine_launcher_class = launcher
    try:
        yield
    finally:
        cluster.engine_launcher_class = own
        cluster.update_cluster_file()


@contextlib.contextmanager
def interrupts_held():
    """Ignore SIGINT (main thread only) while a failed start cleans up: stop is bounded by its grace.

    >>> with interrupts_held():
    ...     pass
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_pool(ref: str, by: str) -> None:
    """Stop a pool by its name or id, whichever process started it; ``by``: who, for the notebooks
    still attached (e.g. "the JupyterLab panel").

    >>> stop_pool("pool-glad-heron", by="the JupyterLab panel")       # doctest: +SKIP
    """
    pool = EnginePool.attach(ref)
    pool.stop()
    sharing.note_stopped(pool.pool_id, pool.name, by)
