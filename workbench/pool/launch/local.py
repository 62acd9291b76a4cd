"""``--launcher local``: every engine on this machine, forked from the pool's zygote.

ipyparallel's local engine-set launcher (:class:`~workbench.pool.launch.spawn.CancellableEngineSetLauncher`)
starts them, one fork each (:mod:`workbench.pool.processes.zygote`) unless the launcher options name their own
engine command. Running here, the engines are this machine's processes: the pool refuses more ranks than the
machine holds (:mod:`workbench.pool.launch.capacity`) or than its GPUs fit, signals them by pid, never fences
them (a dead one is dead), and lets their ranks meet in files of a private folder instead of over TCP.

>>> from workbench.config import PoolConfig
>>> launcher = Local(PoolConfig(n=4))
>>> launcher.on_this_machine, launcher.fences, launcher.default_engines()
(True, False, 4)
>>> Local(PoolConfig()).default_engines(local_gpus=0), Local(PoolConfig()).default_engines(local_gpus=8)
(2, 8)
>>> launcher.engine_env(2)["GLOO_SOCKET_IFNAME"]
'lo'
"""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil

from workbench import wire
from workbench.pool.launch import capacity
from workbench.pool.launch.base import ENGINE_MAIN, Launcher, Pool
from workbench.pool.launch.spawn import CancellableEngineSetLauncher
from workbench.pool.machine.devices import check_gpu_fit, visible_gpu_count
from workbench.pool.records import state as pool_state


class Local(Launcher):
    """Engines on this machine."""

    name = "local"
    engine_set = CancellableEngineSetLauncher
    on_this_machine = True
    fences = False  # an engine of this machine found dead is dead
    poll_s = 0.02  # a fork takes milliseconds

    def _default_count(self, local_gpus: int) -> int:
        return local_gpus or 2

    def visible_gpus(self) -> int:
        return visible_gpu_count()

    def check_gpu_fit(self, n: int, *, backend: str = "auto") -> None:
        """More ranks than GPUs, or nccl without a GPU: refused before anything starts."""
        check_gpu_fit(n, self.visible_gpus(), share=self.config.share_gpus, backend=backend)

    def check_capacity(self, n: int) -> None:
        capacity.check_this_machine(n, self.config.oversubscribe)

    def needs_routable_address(self) -> bool:
        return False

    def fenced_ended(self, pids: set[int]) -> set[int]:
        """Of the engines declared lost, those whose process is gone here (or a zombie): `%dist status` says
        "lost, stopped", never "fenced", of an engine that was killed."""
        def running(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False

        return {pid for pid in pids if not running(pid)}

    def start_more(self, pool: Pool, n: int, placement: dict | None) -> list:
        """Fork ``n`` more engines; returns their launchers, so that one killed before its engine registered
        fails the start at once (an elastic run's replacement is then started again, not waited for)."""
        before = {id(el) for el in pool.local_launchers()}
        pool.start_engine_set(n, placement)
        return [el for el in pool.local_launchers() if id(el) not in before]

    @property
    def forks(self) -> bool:
        """Forked from a zygote, unless the launcher options name their own engine command."""
        return "engine_cmd" not in self.config.launcher_options

    def engine_env(self, n: int) -> dict[str, str]:
        """gloo over loopback, and this machine's cores shared among the ranks.

        >>> from workbench.config import PoolConfig
        >>> Local(PoolConfig()).engine_env(os.cpu_count() or 1)["OMP_NUM_THREADS"]
        '1'
        """
        return {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n))}

    def store_folder(self, pool_id: str, create: bool = True) -> str | None:
        """``stores-<id>`` in the state folder, 0700 (:func:`workbench.pool.records.state.store_dir`)."""
        return str(pool_state.store_dir(pool_id, create=create))

    def hubs(self, pool_id: str, channel: dict) -> dict | None:
        """Forked engines stand for hosts of eight (the zygote's groups), each with a hub whose sockets lie in
        the pool's private folder. Engines started by a command of their own have none.

        >>> from workbench.config import PoolConfig
        >>> Local(PoolConfig(launcher_options={"engine_cmd": ["x"]})).hubs("p", {}) is None
        True
        """
        if not self.forks or not wire.fanout():
            return None
        return {"folder": self.store_folder(pool_id), "relay": dict(channel), "pool": pool_id}

    def traits(self, n: int, *, work_dir: str, env: dict[str, str], log: str) -> dict:
        """Every engine appends to the pool's log; no pause between engines (ipyparallel waits 0.1 s; a
        fork takes milliseconds); our entry point starts importing torch before the engine registers.

        >>> from workbench.config import PoolConfig
        >>> Local(PoolConfig()).traits(2, work_dir="/tmp/x", env={}, log="/l")["pool_log"]
        '/l'
        """
        return {**({"pool_log": log} if log else {}), "delay": 0, "engine_cmd": list(ENGINE_MAIN)}

    def signal(self, ranks: list, sig: int, agents: Callable[[list, int], None]) -> None:
        """By pid: the engines are this machine's processes."""
        for r in ranks:
            try:
                os.kill(r.pid, sig)
            except ProcessLookupError:
                pass

    @property
    def via(self) -> str:
        return ""

    def why_slow(self, pool: Pool) -> str:
        """What this machine was doing meanwhile: engine processes running, and the load on its cores."""
        running = sum(1 for el in pool.local_launchers() if el.pid > 0 and psutil.pid_exists(el.pid))
        load = os.getloadavg()[0]
        cores = os.cpu_count() or 1
        busy = " (too busy for every engine to answer the controller's heartbeat in time)" \
            if load > cores else ""
        return f" ({running} engine processes running; load average {load:.1f} on {cores} cores{busy})"
