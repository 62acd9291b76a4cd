"""ipyparallel's launchers, made to stop between two engines and to share the pool's one log file.

Every launcher here writes its process's output to the pool's log and never removes it (ipyparallel
removes a launcher's output file when its process ends: here that file is the log a failed start names).

ipyparallel starts an engine set in one loop (``n`` engines, 0.1 s apart), inside its own thread when
the kernel's event loop runs: a Ctrl-C reaches the kernel's main thread and the loop goes on spawning.
Here each engine's start first looks whether its pool was cancelled (:func:`cancel`), and raises
:class:`LaunchCancelled` instead of spawning; a spawn in flight holds a lock that :func:`cancel` waits
for, so once it returns no engine of the pool starts any more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from ipyparallel.cluster.launcher import (
    LocalControllerLauncher,
    LocalEngineLauncher,
    LocalEngineSetLauncher,
    MPIEngineSetLauncher,
    SlurmEngineSetLauncher,
    SSHEngineLauncher,
    SSHEngineSetLauncher,
)
from traitlets import List, Unicode

from workbench.pool.processes.zygote import Zygote

# cluster ids whose launch was cancelled: kept for good (a few bytes a pool), since ipyparallel's thread
# may reach its next engine only after the pool's stop has returned
_cancelled: set[str] = set()
_spawning = threading.Lock()  # held while one engine is spawned
# cluster id -> the zygote of that (local) pool, while it runs
zygotes: dict[str, Zygote] = {}
SPAWN_WAIT_S = 5.0  # an ssh start can take seconds; a local spawn takes milliseconds


class LaunchCancelled(RuntimeError):
    """The pool was stopped while its engines were being started."""


def allow(cluster_id: str) -> None:
    """A pool starts (again) under ``cluster_id``: a cancel of an earlier pool with that id is over."""
    _cancelled.discard(cluster_id)


def cancel(cluster_id: str) -> None:
    """No engine of ``cluster_id`` starts after this returns (bar an ssh start stuck past 5 s)."""
    _cancelled.add(cluster_id)
    if _spawning.acquire(timeout=SPAWN_WAIT_S):
        _spawning.release()


class _KeepsLog:
    def get_output(self, remove=False):
        return super().get_output(remove=False)  # the pool's log outlives each of its processes


class _Forked:
    """A local process forked from the pool's zygote if it has one, else started as ipyparallel does."""

    role = ""

    def child_args(self) -> list[str]:
        raise NotImplementedError

    def start(self, *args, **kwargs):
        zygote = zygotes.get(self.cluster_id)
        if zygote is None:
            return super().start(*args, **kwargs)
        import psutil

        env = {**os.environ, **self.get_env()}
        extra = {}
        if self.role == "engine" and "IPP_CONNECTION_INFO" not in env:  # the controller may still be starting
            extra["connection_file"] = self.connection_files["engine"]
        self.pid = zygote.fork(self.role, self.child_args(), env=env, cwd=os.path.abspath(self.work_dir),
                               log=self.output_file, **extra)
        self.process = psutil.Process(self.pid)
        self.notify_start(self.pid)
        self._start_waiting()


class PoolControllerLauncher(_KeepsLog, _Forked, LocalControllerLauncher):
    """The controller, on this machine, writing to the pool's log (not forked: through our entry point, whose
    sessions do not warn that signing is off: the controller speaks CurveZMQ)."""

    entrypoint_name = "workbench.pool.launch.spawn.PoolControllerLauncher"
    role = "controller"
    controller_cmd = List([sys.executable, "-m", "workbench.pool.processes.controller_main"], config=True)

    def child_args(self) -> list[str]:
        return [*self.cluster_args, *self.controller_args]


class PoolMPIEngineSetLauncher(_KeepsLog, MPIEngineSetLauncher):
    """``mpiexec -n N`` (one launch for the whole set), writing to the pool's log."""

    entrypoint_name = "workbench.pool.launch.spawn.PoolMPIEngineSetLauncher"


class PoolSlurmEngineSetLauncher(_KeepsLog, SlurmEngineSetLauncher):
    """One sbatch job for the whole set; its output file is the pool's log (shared file system)."""

    entrypoint_name = "workbench.pool.launch.spawn.PoolSlurmEngineSetLauncher"

    def _run_command(self, command, **kwargs):
        """sbatch/scancel with their stderr kept (ipyparallel lets it go to the kernel's stderr): a refused
        submission says why on the card (``CalledProcessError.output``) and in the pool's log."""
        kwargs.setdefault("stderr", subprocess.STDOUT)
        try:
            return super()._run_command(command, **kwargs)
        except subprocess.CalledProcessError as exc:
            log = getattr(self.parent, "pool_log", "")
            if log and exc.output:
                with open(log, "ab") as f:
                    f.write(exc.output if isinstance(exc.output, bytes) else exc.output.encode())
            raise


class PoolSrunEngineSetLauncher(_KeepsLog, MPIEngineSetLauncher):
    """One ``srun`` step of the Slurm job this kernel runs in, starting every engine of one node (its tasks),
    writing to the pool's log: ipyparallel's MPI engine-set launcher (one local process for the set: the
    ``srun``), with ``srun ... --ntasks=N`` instead of ``mpiexec -n N`` and no ``--mpi``.

    >>> launcher = PoolSrunEngineSetLauncher(mpi_cmd=["srun", "--jobid=12"], mpi_args=["--nodelist=n1"],
    ...                                      engine_cmd=["python", "-m", "e"], engine_args=["--x"])
    >>> launcher.n = 2
    >>> launcher.find_args()[:4], launcher.find_args()[-1]
    (['srun', '--jobid=12', '--ntasks=2', '--nodelist=n1'], '--x')
    """

    entrypoint_name = "workbench.pool.launch.spawn.PoolSrunEngineSetLauncher"

    @property
    def program(self):
        return list(self.engine_cmd)

    def find_args(self):
        return [*self.mpi_cmd, f"--ntasks={self.n}", *self.mpi_args, *self.program, *self.program_args]


class _StopsWhenCancelled(_KeepsLog):
    def start(self, *args, **kwargs):
        with _spawning:
            if self.cluster_id in _cancelled:
                raise LaunchCancelled(f"the start of {self.cluster_id} was cancelled")
            log = getattr(self.parent, "pool_log", "")
            if log:  # every engine appends to the pool's one log file, not to a file in the profile
                self.output_file = log
            return super().start(*args, **kwargs)


class CancellableEngineLauncher(_StopsWhenCancelled, _Forked, LocalEngineLauncher):
    """One local engine that does not start once its pool was cancelled."""

    role = "engine"

    def child_args(self) -> list[str]:
        return [*self.cluster_args, *self.engine_args]


class CancellableEngineSetLauncher(LocalEngineSetLauncher):
    """Local engines (``engines="local"``), started one by one until the pool is cancelled.

    >>> CancellableEngineSetLauncher.launcher_class.__name__
    'CancellableEngineLauncher'
    """

    entrypoint_name = "workbench.pool.launch.spawn.CancellableEngineSetLauncher"  # how ipyparallel saves it
    launcher_class = CancellableEngineLauncher
    pool_log = Unicode("", help="the file every engine's stdout and stderr go to").tag(to_dict=True)


class CancellableSSHEngineLauncher(_StopsWhenCancelled, SSHEngineLauncher):
    """One engine over ssh that does not start once its pool was cancelled.

    ipyparallel's thread that waits for the engine asks its host over ssh every few seconds; an ssh
    that fails (the pool stopping ends it; a host whose link is cut does not answer) raised in that
    thread (``Exception in thread wait(host=...)``, ssh exit status 255). A failure once the pool is
    stopping means the engine's end; before, the engine counts as running and is asked again later:
    whether it is lost is the health watcher's call (beacons), not this thread's.
    """

    def wait_one(self, timeout):
        import subprocess
        import time

        try:
            return super().wait_one(timeout)
        except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
            if self.cluster_id in _cancelled:
                return -1
            time.sleep(self.poll_seconds)
            raise TimeoutError(f"{self.location} did not answer ({exc})") from None


class CancellableSSHEngineSetLauncher(SSHEngineSetLauncher):
    """Engines over ssh, host after host, until the pool is cancelled."""

    entrypoint_name = "workbench.pool.launch.spawn.CancellableSSHEngineSetLauncher"
    launcher_class = CancellableSSHEngineLauncher
