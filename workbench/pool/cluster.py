"""Engine pool lifecycle over ipyparallel: start engines, watch them come up, stop them all.

Never imports torch: the engines do that.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import ipyparallel as ipp

from workbench.errors import PoolStartError
from workbench.pool import state as pool_state

# The controller counts newly registered engines only at its next heartbeat round:
# the default 3 s period makes a local start wait seconds for nothing.
HEARTBEAT_MS = 100

# Engines import torch in the background while they register: that import is most of the
# time to a ready pool, and it overlaps with the controller's registration round trip.
PRELOAD = "import threading; threading.Thread(target=__import__, args=('workbench.dist.engine',), daemon=True).start()"

Progress = Callable[[str], None]


class EnginePool:
    """A controller plus ``n`` engines, each process recorded so none is left behind.

    >>> pool = EnginePool(n=2)                       # doctest: +SKIP
    >>> client = pool.start(progress=print)          # doctest: +SKIP
    >>> pool.stop()                                  # doctest: +SKIP
    """

    def __init__(self, *, n: int, launcher: str = "local", address: str = "127.0.0.1",
                 timeout: float = 60.0, env: dict[str, str] | None = None):
        self.n = n
        self.launcher = launcher
        self.address = address
        self.timeout = timeout
        self.env = dict(env or {})
        self.pool_id = uuid.uuid4().hex[:8]
        self.cluster: ipp.Cluster | None = None
        self.client: ipp.Client | None = None
        self.state_file = None
        self._lease: subprocess.Popen | None = None
        self.attached = False  # True when another process started this pool
        self.state: dict = {}

    # -- start -----------------------------------------------------------------------
    def start(self, progress: Progress = lambda msg: None) -> ipp.Client:
        """Start controller and engines; return a connected client once all ``n`` registered."""
        self.cluster = ipp.Cluster(
            n=self.n,
            engines=self.launcher,
            cluster_id=f"workbench-{self.pool_id}",
            controller_ip=self.address,
            controller_args=[f"--HeartMonitor.period={HEARTBEAT_MS}"],
            delay=0,  # engines wait for the controller's connection info anyway
            log_level=logging.WARNING,
        )
        try:
            progress("starting controller")
            self.cluster.start_controller_sync()
            self._record()
            progress(f"starting {self.n} engines")
            self.cluster.start_engines_sync(n=self.n, environment=self.env,
                                            engine_args=[f"--IPEngine.startup_command={PRELOAD}"])
            self._record()
            self.client = self.cluster.connect_client_sync()
            self._wait_for_engines(progress)
        except BaseException:
            self.stop()
            raise
        return self.client

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
                    f"only {up} of {self.n} engines registered within {self.timeout:.0f} s. "
                    "Try a longer --timeout, or fewer engines; every process started has been stopped."
                )
            time.sleep(0.02)

    def start_more(self, n: int, known_ids: set[int]) -> list[int]:
        """Start ``n`` more engines (to replace dead ones); return their engine ids once registered."""
        self.cluster.start_engines_sync(n=n, environment=self.env,
                                        engine_args=[f"--IPEngine.startup_command={PRELOAD}"])
        self._record()
        deadline = time.monotonic() + self.timeout
        while True:
            new = sorted(set(self.client.ids) - known_ids)
            if len(new) >= n:
                return new[:n]
            if time.monotonic() > deadline:
                raise PoolStartError(f"only {len(new)} of {n} new engines registered within {self.timeout:.0f} s.")
            time.sleep(0.02)

    def _launchers(self):
        for engine_set in (self.cluster.engines or {}).values() if self.cluster else ():
            yield from getattr(engine_set, "launchers", {}).values()

    def _dead_engines(self) -> list[str]:
        out = []
        for el in self._launchers():
            if el.state == "after" or (el.process is not None and not el.process.is_running()):
                tail = "\n".join((el.get_output() or "").splitlines()[-15:])
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
        self = cls(n=state["n"], launcher=state["launcher"], timeout=timeout)
        self.pool_id = pool_id
        self.state = state
        self.cluster = ipp.Cluster.from_file(state["cluster_file"], log_level=logging.WARNING,
                                             shutdown_atexit=False)
        self.client = self.cluster.connect_client_sync()
        self.client.wait_for_engines(self.n, timeout=timeout)
        self.state_file = pool_state.state_path(pool_id)
        self.attached = True
        return self

    # -- bookkeeping -----------------------------------------------------------------
    def pids(self) -> list[int]:
        """Every process this pool started: controller, engines, lease."""
        if self.attached:
            return [rec["pid"] for rec in self.state.get("processes", []) if pool_state.process_alive(rec)]
        pids = []
        if self.cluster and self.cluster.controller is not None and self.cluster.controller.pid > 0:
            pids.append(self.cluster.controller.pid)
        pids += [el.pid for el in self._launchers() if el.pid > 0]
        if self._lease is not None:
            pids.append(self._lease.pid)
        return pids

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
            "n": self.n,
            "cluster_file": self.cluster.cluster_file if self.cluster else None,
            "processes": records,
            "files": [self.cluster.cluster_file] if self.cluster else [],
            "created": time.time(),
            **extra,
        }
        self.state_file = pool_state.write_state(self.pool_id, state)
        if self._lease is None:
            self._lease = subprocess.Popen(
                [sys.executable, "-m", "workbench.pool.lease", str(self.state_file)],
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

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
        if self.cluster is not None:
            try:
                self.cluster.stop_cluster_sync()
            except Exception:
                pass
        if self.state_file is not None:
            self.state_file.unlink(missing_ok=True)  # the lease sees this and exits
        pool_state.terminate(records)
        if self._lease is not None:
            self._lease.wait(timeout=5)
            self._lease = None
        self.cluster = None


def stop_pool(pool_id: str) -> None:
    """Stop a pool by its id, whichever process started it.

    >>> stop_pool("1a2b3c4d")       # doctest: +SKIP
    """
    EnginePool.attach(pool_id).stop()
