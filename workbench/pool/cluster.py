"""Engine pool lifecycle over ipyparallel: start engines, watch them come up, stop them all.

Never imports torch: the engines do that.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

import ipyparallel as ipp
from ipyparallel.cluster.launcher import BatchSystemLauncher, LocalProcessLauncher, SSHLauncher

from workbench import wire
from workbench.config import PoolConfig
from workbench.errors import PoolStartError
from workbench.pool import launchers
from workbench.pool import state as pool_state
from workbench.pool.relay import Relay

# The controller counts newly registered engines only at its next heartbeat round:
# the default 3 s period makes a local start wait seconds for nothing.
HEARTBEAT_MS = 100

# Engines import torch in the background while they register: that import is most of the
# time to a ready pool, and it overlaps with the controller's registration round trip.
PRELOAD = ("import threading; "
           "threading.Thread(target=__import__, args=('workbench.engine.rendezvous',), daemon=True).start()")

Progress = Callable[[str], None]


class EnginePool:
    """A controller plus ``n`` engines, each process recorded so none is left behind.

    >>> pool = EnginePool(n=2)                       # doctest: +SKIP
    >>> client = pool.start(progress=print)          # doctest: +SKIP
    >>> pool.stop()                                  # doctest: +SKIP
    """

    def __init__(self, *, n: int, launcher: str = "local", address: str = "127.0.0.1",
                 timeout: float = 60.0, env: dict[str, str] | None = None, config: PoolConfig | None = None):
        self.config = config or PoolConfig(launcher=launcher, timeout=timeout, address=address)
        self.n = n
        self.launcher = self.config.launcher
        self.address = address
        self.timeout = timeout
        self.env = dict(env or {})
        self.pool_id = uuid.uuid4().hex[:8]
        self.work_dir: str | None = None  # scratch folder: batch scripts, never the notebook's folder
        self.cluster: ipp.Cluster | None = None
        self.client: ipp.Client | None = None
        self.state_file = None
        self._lease: subprocess.Popen | None = None
        self.attached = False  # True when another process started this pool
        self.state: dict = {}
        self.relay: Relay | None = None  # the side channel (beacons, metrics, commands); owner only
        self.channel: dict | None = None  # how to reach it: {"up": url, "out": url, "key": hex}

    # -- start -----------------------------------------------------------------------
    def start(self, progress: Progress = lambda msg: None) -> ipp.Client:
        """Start controller and engines; return a connected client once all ``n`` registered."""
        launchers.check_address(self.config, self.address)
        self.work_dir = tempfile.mkdtemp(prefix=f"workbench-{self.pool_id}-")
        key = wire.new_key()
        self.relay = Relay(self.address, key)
        self.channel = {"up": self.relay.up, "out": self.relay.out, "key": key}
        self.cluster = ipp.Cluster(
            n=self.n,
            engines=launchers.engine_launcher(self.config),
            cluster_id=f"workbench-{self.pool_id}",
            controller_ip=self.address,
            controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}"],
            delay=0,  # engines wait for the controller's connection info anyway
            log_level=logging.ERROR,  # our own messages name failures; ipyparallel would dump whole logs
        )
        try:
            progress("starting controller")
            self.cluster.start_controller_sync()
            self._record()
            via = f" through {self.launcher}" if self.launcher != "local" else ""
            progress(f"starting {self.n} engines{via}")
            self._start_engine_set(self.n)
            self.client = self.cluster.connect_client_sync()
            self._wait_for_engines(progress)
        except BaseException:
            self.stop()
            raise
        return self.client

    def _start_engine_set(self, n: int) -> None:
        kwargs = launchers.engine_set_kwargs(self.config, n, work_dir=self.work_dir, env=self.env,
                                             engine_args=[f"--IPEngine.startup_command={PRELOAD}"])
        try:
            self.cluster.start_engines_sync(n=n, **kwargs)
        except subprocess.CalledProcessError as exc:  # sbatch, mpiexec or ssh refused
            out = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output or ""
            command = " ".join(map(str, exc.cmd))
            raise PoolStartError(f"{self.launcher} could not start the engines: {command} exited with "
                                 f"{exc.returncode}. {out.strip()}") from None
        finally:
            self._record()

    def _wait_for_engines(self, progress: Progress) -> None:
        deadline = time.monotonic() + self.timeout
        seen = -1
        while True:
            up = len(self.client.ids)
            if up != seen:
                seen = up
                progress(f"engines up: {up}/{self.n}")
            if up >= self.n:
                return
            dead = self._dead_engines()
            if dead:
                raise PoolStartError(
                    f"{len(dead)} of {self.n} engines exited while starting. Their output:\n"
                    + "\n".join(dead)
                )
            if time.monotonic() > deadline:
                raise PoolStartError(
                    f"only {up} of {self.n} engines registered within {self.timeout:g} s. "
                    + "".join(f"Slurm job {job}: {how}. " for job, how in self._job_states().items())
                    + "Try a longer --timeout, or fewer engines; every process started has been stopped."
                )
            time.sleep(0.02 if self.launcher == "local" else 0.1)

    def start_more(self, n: int, known_ids: set[int]) -> list[int]:
        """Start ``n`` more engines (to replace dead ones, or to grow); return their ids once registered."""
        self._start_engine_set(n)
        deadline = time.monotonic() + self.timeout
        while True:
            new = sorted(set(self.client.ids) - known_ids)
            if len(new) >= n:
                return new[:n]
            if time.monotonic() > deadline:
                raise PoolStartError(f"only {len(new)} of {n} new engines registered within "
                                     f"{self.timeout:g} s.")
            time.sleep(0.02)

    def stop_engines(self, engine_ids: list[int]) -> None:
        """Shut down some engines (a shrink): their processes exit, the others keep running."""
        if engine_ids:
            self.client.shutdown(targets=list(engine_ids), block=True)

    def _engine_sets(self) -> list:
        return list((self.cluster.engines or {}).values()) if self.cluster else []

    def _launchers(self):
        """Every engine launcher: one per engine (local, ssh) or the whole set (mpiexec, a Slurm job)."""
        for engine_set in self._engine_sets():
            per_engine = getattr(engine_set, "launchers", None)
            if per_engine:
                yield from per_engine.values()
            else:
                yield engine_set

    def _local_launchers(self):
        """The launchers whose process runs on this machine (ssh pids are on other hosts)."""
        for el in self._launchers():
            if isinstance(el, LocalProcessLauncher) and not isinstance(el, SSHLauncher):
                yield el

    def _job_states(self) -> dict[str, str]:
        """Each Slurm job of the pool with its state and reason, e.g. ``{"12": "PENDING (Resources)"}``."""
        cached_at, states = getattr(self, "_job_cache", (0.0, {}))
        if time.monotonic() - cached_at < 1.0:  # squeue asks slurmctld: at most once a second
            return states
        states = {}
        for es in self._engine_sets():
            if isinstance(es, BatchSystemLauncher) and es.job_id:
                try:
                    out = subprocess.run(["squeue", "-h", "-j", es.job_id, "-o", "%T|%r"],
                                         capture_output=True, text=True, timeout=10).stdout.strip()
                except (OSError, subprocess.TimeoutExpired):
                    out = ""
                state, _, reason = out.partition("|")
                states[es.job_id] = f"{state} ({reason})" if state else "ended"
        self._job_cache = (time.monotonic(), states)
        return states

    def _dead_engines(self) -> list[str]:
        out = []
        for el in self._launchers():
            if isinstance(el, BatchSystemLauncher):
                dead = el.job_id and self._job_states().get(el.job_id) == "ended"
            else:
                dead = el.state == "after" or (getattr(el, "process", None) is not None
                                               and not el.process.is_running())
            if dead:
                tail = "\n".join((el.get_output(remove=False) or "").splitlines()[-15:])
                out.append(f"--- engine {el.identifier} ---\n{tail}")
        return out

    # -- attach --------------------------------------------------------------------------
    @classmethod
    def attach(cls, pool_id: str, timeout: float = 10.0) -> EnginePool:
        """Connect to a pool another process started (a kernel, or the Jupyter server)."""
        state = pool_state.read_state(pool_state.state_path(pool_id))
        if state is None or not pool_state.process_alive(state.get("owner", {})):
            running = ", ".join(s["id"] for s in pool_state.list_states()) or "none"
            raise ValueError(f"no running pool {pool_id!r}; running pools: {running}.")
        self = cls(n=state["n"], launcher=state["launcher"], timeout=timeout,
                   address=state.get("address", "127.0.0.1"))
        self.pool_id = pool_id
        self.state = state
        # quiet: when the owner stops the pool, ipyparallel would log the controller's whole output here
        self.cluster = ipp.Cluster.from_file(state["cluster_file"], log_level=logging.CRITICAL,
                                             shutdown_atexit=False)
        self.client = self.cluster.connect_client_sync()
        self.client.wait_for_engines(self.n, timeout=timeout)
        self.state_file = pool_state.state_path(pool_id)
        self.channel = state.get("channel")
        self.attached = True
        return self

    # -- bookkeeping -----------------------------------------------------------------
    def pids(self) -> list[int]:
        """Every process this pool started on this machine: controller, engines (or mpiexec), lease.

        Engines started through Slurm or ssh run elsewhere: their jobs are in :meth:`jobs`.
        """
        if self.attached:
            return [rec["pid"] for rec in self.state.get("processes", []) if pool_state.process_alive(rec)]
        pids = []
        if self.cluster and self.cluster.controller is not None and self.cluster.controller.pid > 0:
            pids.append(self.cluster.controller.pid)
        pids += [el.pid for el in self._local_launchers() if el.pid > 0]
        if self._lease is not None:
            pids.append(self._lease.pid)
        return pids

    def jobs(self) -> list[str]:
        """The Slurm job ids of the pool's engine sets."""
        if self.attached:
            return [j["id"] for j in self.state.get("jobs", [])]
        return [es.job_id for es in self._engine_sets() if isinstance(es, BatchSystemLauncher) and es.job_id]

    def _record(self, **extra) -> None:
        """Write the state file (and start the lease the first time)."""
        records = []
        for pid in self.pids():
            try:
                records.append(pool_state.process_record(pid))
            except Exception:
                pass  # already gone: nothing to clean up later
        state = {
            "id": self.pool_id,
            "owner": pool_state.process_record(os.getpid()),
            "launcher": self.launcher,
            "address": self.address,
            "n": self.n,
            # what the lease cancels if the owner dies: engines on other nodes are not our processes
            "jobs": [{"id": job, "cancel": [*self._cancel_command(), job]} for job in self.jobs()],
            # engines started over ssh: what the lease runs to end them if the owner dies (stop() ends
            # them through ipyparallel)
            "remote": [{"id": f"{el.location}:{el.pid}",
                        "cancel": [*el.ssh_cmd, *el.ssh_args, el.location, "kill", str(el.pid)]}
                       for el in self._launchers() if isinstance(el, SSHLauncher) and el.pid > 0],
            "dirs": [self.work_dir] if self.work_dir else [],
            "cluster_file": self.cluster.cluster_file if self.cluster else None,
            "processes": records,
            "files": [self.cluster.cluster_file] if self.cluster else [],
            "channel": self.channel,
            "created": time.time(),
            **extra,
        }
        self.state_file = pool_state.write_state(self.pool_id, state)
        if self._lease is None:
            self._lease = subprocess.Popen(
                [sys.executable, "-m", "workbench.pool.lease", str(self.state_file)],
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def _cancel_command(self) -> list[str]:
        for es in self._engine_sets():
            if isinstance(es, BatchSystemLauncher):
                return list(es.delete_command)
        return ["scancel"]

    def update_state(self, **extra) -> None:
        if self.state_file is not None and not self.attached:
            self._record(**extra)

    # -- stop ------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop engines and controller, then make sure every recorded process is gone."""
        if self.attached:
            records = [rec for rec in self.state.get("processes", []) if pool_state.process_alive(rec)]
        else:
            records = []
            for pid in self.pids():
                try:
                    records.append(pool_state.process_record(pid))
                except Exception:
                    pass
        if self.client is not None:
            try:
                # shutting engines down first keeps ipyparallel from printing their tracebacks
                self.client.shutdown(targets="all", block=True)
            except Exception:
                pass
            self.client.close()
            self.client = None
        jobs = (self.state.get("jobs", []) if self.attached
                else [{"id": j, "cancel": [*self._cancel_command(), j]} for j in self.jobs()])
        if self.cluster is not None:
            try:
                self.cluster.stop_cluster_sync()  # scancel for Slurm, ssh kill for remote engines
            except Exception:
                pass
        pool_state.cancel_jobs(jobs)  # again, in case stop_cluster failed part way: scancel is idempotent
        if self.state_file is not None:
            self.state_file.unlink(missing_ok=True)  # the lease sees this and exits
        pool_state.terminate(records)
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None
        if self._lease is not None:
            self._lease.wait(timeout=5)
            self._lease = None
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        self.cluster = None


def stop_pool(pool_id: str) -> None:
    """Stop a pool by its id, whichever process started it.

    >>> stop_pool("1a2b3c4d")       # doctest: +SKIP
    """
    EnginePool.attach(pool_id).stop()
