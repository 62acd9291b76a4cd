"""Pool state files in the Jupyter runtime directory.

One JSON file per running pool, written by the process that owns the pool. The
lease process, the server extension and other kernels read them. They never hold
the ipyparallel key: only the path of ipyparallel's own cluster file.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import psutil

from workbench.config import PoolConfig

# Logs of pools that no longer run that are kept, newest first: a failed start names its log.
KEEP_LOGS = 20


def state_dir() -> Path:
    """``<jupyter runtime dir>/workbench``, created on first use, readable by its owner only."""
    from jupyter_core.paths import jupyter_runtime_dir

    path = Path(os.environ.get("WORKBENCH_STATE_DIR") or Path(jupyter_runtime_dir()) / "workbench")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def state_path(pool_id: str) -> Path:
    return state_dir() / f"pool-{pool_id}.json"


def log_path(pool_id: str) -> Path:
    """The pool's log: the output of its controller, engines and launcher."""
    return state_dir() / f"pool-{pool_id}.log"


def store_dir(pool_id: str, create: bool = True) -> Path:
    """Where a local pool's ranks meet (:mod:`workbench.engine.stores`): ``stores-<id>`` in the state
    folder, 0700; it goes when the pool stops (its state lists it under ``dirs``)."""
    path = state_dir() / f"stores-{pool_id}"
    if create:
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    return path


def old_group_stores(folder: str, generation: int) -> list[Path]:
    """The rendezvous files in ``folder`` of the groups before ``generation``.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> for name in ("group-1", "group-2", "standby-7"): (d / name).touch()
    >>> [p.name for p in old_group_stores(str(d), 2)]
    ['group-1']
    """
    old = []
    for path in Path(folder).glob("group-*"):
        number = path.name.removeprefix("group-")
        if number.isdigit() and int(number) < generation:
            old.append(path)
    return sorted(old)


def private_file(path: Path, mode: str = "a"):
    """Open ``path`` for writing, created readable by its owner only (0600) like ipyparallel's key files.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "f"
    >>> with private_file(p) as f: _ = f.write("x")
    >>> oct(p.stat().st_mode & 0o777)
    '0o600'
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # also a file an older version created 0644
    return os.fdopen(fd, mode)


def write_state(pool_id: str, state: dict) -> Path:
    """Write atomically (rename), so a reader never sees half a file; 0600."""
    path = state_path(pool_id)
    tmp = path.with_suffix(".tmp")
    with private_file(tmp, "w") as f:  # the file holds the pool's side-channel key
        f.write(json.dumps(state, indent=1))
    os.replace(tmp, path)
    return path


def config_of(state: dict) -> PoolConfig:
    """The :class:`PoolConfig` a pool was started with, from its state file: what attach, a restart, the
    panel and the server start it again with. Its size is the pool's now (a scaled pool restarts at its
    new size), unless the cluster options fix the size.

    >>> config_of({"n": 4, "config": PoolConfig(n=2, launcher="mpi", name="team-a").to_dict()})
    PoolConfig(n=4, launcher='mpi', backend='auto', timeout=60.0, address='127.0.0.1', interface=None, \
nodes=None, gpus_per_node=None, partition=None, time=None, account=None, hosts=(), idle_release=None, \
oversubscribe=False, name='team-a', collective_timeout=None, share_gpus=False, keep=False, \
launcher_options={})
    """
    config = PoolConfig.from_dict(state.get("config") or {
        # a state file from before it carried the config: what it has
        "launcher": state["launcher"], "backend": state.get("backend_requested", "auto"),
        "address": state.get("address", "127.0.0.1"), "name": state.get("name")})
    if config.engines is None and state.get("n"):
        config = PoolConfig.from_dict(config.to_dict(), n=state["n"])
    return config


def prune_logs(keep: int = KEEP_LOGS) -> None:
    """Remove the logs of pools that no longer run, beyond the ``keep`` newest."""
    running = {s["id"] for s in list_states()}
    logs = sorted(state_dir().glob("pool-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for log in [p for p in logs if p.stem.removeprefix("pool-") not in running][keep:]:
        log.unlink(missing_ok=True)


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def list_states() -> list[dict]:
    """Every pool state file whose owner process is still alive."""
    states = []
    for path in sorted(state_dir().glob("pool-*.json")):
        state = read_state(path)
        if state and process_alive(state.get("owner", {})):
            states.append(state)
    return states


def process_record(pid: int) -> dict:
    """A pid with its start time, so a recycled pid is never taken for ours."""
    return {"pid": pid, "create_time": psutil.Process(pid).create_time()}


def process_alive(record: dict) -> bool:
    try:
        proc = psutil.Process(record["pid"])
        same = abs(proc.create_time() - record["create_time"]) < 0.01
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError):
        return False


def exit_handle(pid: int) -> int | psutil.Process:
    """A handle that tells when ``pid`` exits: a pidfd (readable from its exit on, a zombie included; it
    never follows a recycled pid), or a ``psutil.Process`` to poll where pidfds do not exist (Linux < 5.3,
    another OS). Raises ``psutil.NoSuchProcess`` when there is no such process. Close it with
    :func:`close_handle`; :func:`handle_exited` asks it.
    """
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise psutil.NoSuchProcess(pid) from None
    except (AttributeError, OSError):
        return psutil.Process(pid)


def handle_exited(handle: int | psutil.Process) -> bool:
    """Whether the process of an :func:`exit_handle` has exited (a zombie counts), without waiting."""
    if isinstance(handle, int):  # poll, not select: a kernel with many sockets has fds past FD_SETSIZE
        poller = select.poll()
        poller.register(handle, select.POLLIN)
        return bool(poller.poll(0))
    try:
        return handle.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def close_handle(handle: int | psutil.Process | None) -> None:
    if isinstance(handle, int):
        os.close(handle)


class ProcessWatch:
    """Whether one recorded process has exited, cheap enough to ask before every cell.

    The :func:`exit_handle` is opened once, while the record is still that process: one ``poll`` a
    question (where pidfds are missing, a ``/proc`` read as :func:`process_alive` does).

    >>> watch = ProcessWatch(process_record(os.getpid()))
    >>> watch.exited()
    False
    >>> watch.close()
    """

    def __init__(self, record: dict):
        self.record = record
        try:
            self._handle: int | psutil.Process | None = exit_handle(record["pid"])
        except (psutil.NoSuchProcess, KeyError, TypeError):
            self._handle = None
        if not process_alive(record):  # checked after the open: the handle is of the recorded process
            self.close()

    def exited(self) -> bool:
        if self._handle is None:
            return True
        if isinstance(self._handle, int):
            return handle_exited(self._handle)
        return not process_alive(self.record)  # a polled Process could be a recycled pid's

    def close(self) -> None:
        """Let the process go; from here on :meth:`exited` says True."""
        close_handle(self._handle)
        self._handle = None


def terminate(records: list[dict], grace: float = 3.0) -> None:
    """SIGTERM the recorded processes that are still ours, then SIGKILL what is left after ``grace``."""
    procs = []
    for rec in records:
        if process_alive(rec):
            try:
                procs.append(psutil.Process(rec["pid"]))
            except psutil.Error:
                pass
    end(procs, grace)


def end(procs: list[psutil.Process], grace: float = 3.0) -> None:
    """SIGTERM ``procs``, then SIGKILL those still running after ``grace`` seconds, and reap them."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    alive = wait_gone(procs, grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    wait_gone(alive, max(grace, 1.0))  # SIGKILL cannot be refused: this is short


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for ``procs`` to exit; return those still running.

    A zombie has exited (only its parent's wait is missing: an orphan's parent may never reap it),
    so it counts as gone; our own children are reaped.
    """
    deadline = time.monotonic() + timeout
    while True:
        _, alive = psutil.wait_procs(procs, timeout=0)  # reaps our own children
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        procs = alive
        time.sleep(0.01)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def cancel_jobs(jobs: list[dict]) -> None:
    """Cancel batch jobs recorded as ``{"id": "12", "cancel": ["scancel", "12"]}`` (engines on other nodes).

    >>> cancel_jobs([])
    """
    for job in jobs:
        try:
            subprocess.run(job["cancel"], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired, KeyError, TypeError):
            pass


def remove_files(state: dict) -> None:
    """Remove the files and scratch folders a pool recorded."""
    for extra in state.get("files", []):
        Path(extra).unlink(missing_ok=True)
    for folder in state.get("dirs", []):
        shutil.rmtree(folder, ignore_errors=True)
