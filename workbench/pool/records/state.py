"""Pool state files in the Jupyter runtime directory, and the pool's processes they record.

One JSON file per running pool, written by the process that owns the pool (and the sessions' part of it by
any session driving the pool). The lease process, the server extension, the command line and other kernels
read them. They never hold the ipyparallel key: only the path of ipyparallel's own cluster file. The file is
a :class:`PoolState`: this module is the only code that reads or writes its JSON (:func:`write_state`,
:func:`read_state`, :func:`list_states`); everyone else reads its attributes.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import select
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import psutil

from workbench.config import PoolConfig

log = logging.getLogger("workbench.pool")

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
    """The rendezvous files in ``folder`` of the groups before ``generation`` (a sub-mesh's group meets in
    ``group-<generation>-<name>``).

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> for name in ("group-1", "group-2", "standby-7", "group-1-a", "group-2-b"): (d / name).touch()
    >>> [p.name for p in old_group_stores(str(d), 2)]
    ['group-1', 'group-1-a']
    """
    old = []
    for path in Path(folder).glob("group-*"):
        number = path.name.removeprefix("group-").split("-")[0]
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


class StateFileError(ValueError):
    """A pool state file that is not one (not JSON, not an object, a field of the wrong type). The file is
    left as it is: nothing reads it as something else, and nothing writes over it."""


@dataclass(frozen=True, kw_only=True)
class PoolState:
    """What a pool's state file says: who owns the pool, how it was started, its processes and files (the
    owner's :class:`~workbench.pool.cluster.EnginePool` writes these), and its ranks and process group (the
    sessions driving it write these, through ``EnginePool.update_state``). Changed by
    ``dataclasses.replace``: a misspelt field is a TypeError, never a key nobody reads.

    >>> state = PoolState(id="1a2b3c4d", n=2, config=PoolConfig(n=2, launcher="mpi"))
    >>> state.launcher, PoolState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    ('mpi', True)
    """

    # -- the owner's (EnginePool._record)
    id: str = ""
    name: str | None = None
    owner: dict = field(default_factory=dict)  # the owner's process record: the lease waits on it
    n: int = 0  # engines now (a scale changes it)
    config: PoolConfig = field(default_factory=PoolConfig)  # how it was started: a restart starts it so again
    jobs: list[dict] = field(default_factory=list)  # batch jobs: {"id", "cancel": argv} (the lease runs it)
    remote: list[dict] = field(default_factory=list)  # engines started over ssh, the same way
    dirs: list[str] = field(default_factory=list)  # the scratch folder, a local pool's store folder
    cluster_file: str | None = None  # ipyparallel's cluster file (attach reads it)
    processes: list[dict] = field(default_factory=list)  # process records on this machine
    controller: dict | None = None  # the controller's record: without it no rank can be reached
    channel: dict | None = None  # the side channel: {"up": url, "out": url, "key": hex}
    files: list[str] = field(default_factory=list)  # ipyparallel's files a SIGKILLed controller leaves
    log: str | None = None  # the pool's log
    places: dict[str, str] = field(default_factory=dict)  # host -> the machine it is on (a pod: its node)
    created: float = 0.0
    # the Slurm job its engines run in ({job, nodes, gpus, tasks, inside}: the kernel's own allocation, or the
    # pool's own job), and when its time limit ends it (epoch seconds; None: no job, or no limit)
    allocation: dict | None = None
    ends: float | None = None
    # -- the sessions' (Shared.publish)
    ranks: list[dict] = field(default_factory=list)  # RankInfo fields, one dict per rank
    backend: str | None = None
    backend_requested: str | None = None
    generation: int = 0  # the process group's
    endpoints: dict[int, list] = field(default_factory=dict)  # rank -> its gloo listeners
    group_ok: bool = True  # False: a fault aborted the group, the next cell re-forms it
    # a split pool's sub-meshes (docs/submeshes.md): name -> {"ranks": pool ranks, "generation": its group's,
    # "ok": False once a fault aborted its group}; empty: one group of all
    meshes: dict[str, dict] = field(default_factory=dict)
    # keys this version does not know (a newer one wrote them): kept, so a write here loses nothing
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def launcher(self) -> str:
        return self.config.launcher

    @property
    def address(self) -> str:
        return self.config.address

    def to_dict(self) -> dict[str, Any]:
        """The JSON of the state file: every field (the config as :meth:`PoolConfig.to_dict` writes it),
        ``launcher`` and ``address`` beside it as before, and the keys another version wrote."""
        out: dict[str, Any] = {**self.unknown}
        for f in fields(self):
            if f.name != "unknown":
                out[f.name] = getattr(self, f.name)
        out["config"] = self.config.to_dict()
        out["launcher"], out["address"] = self.launcher, self.address
        out["endpoints"] = {str(rank): eps for rank, eps in self.endpoints.items()}
        return out

    @classmethod
    def from_dict(cls, data: Any) -> PoolState:
        """The state :meth:`to_dict` wrote; a ValueError naming the field for anything else. A field left
        out takes its default (a record written before the field existed).

        >>> PoolState.from_dict({"id": "1a2b3c4d", "n": "two"})
        Traceback (most recent call last):
        ...
        ValueError: n must be int, not str ('two')
        """
        if not isinstance(data, dict):
            raise ValueError(f"a pool state is a JSON object, not {type(data).__name__}")
        rest = dict(data)  # what is left once every field took its own: kept as it is
        hints = _hints()
        known = hints.keys() - {"unknown"}
        values: dict[str, Any] = {}
        for name in known & data.keys():
            value = rest.pop(name)
            if name == "config":
                values[name] = _config(value, data)
                continue
            _check(name, value, hints[name])
            values[name] = value
        if "config" not in values:  # a record from before the state carried its config
            values["config"] = _config({}, data)
        values["endpoints"] = {int(rank): eps for rank, eps in values.get("endpoints", {}).items()}
        for derived in ("launcher", "address"):  # the config's: written beside it for older readers
            rest.pop(derived, None)
        return cls(**values, unknown=rest)


@functools.cache
def _hints() -> dict[str, Any]:
    """Each field of :class:`PoolState` with its type (read once: the server lists the pools every second)."""
    return get_type_hints(PoolState)


def _config(value: Any, data: dict) -> PoolConfig:
    """The config of a state: its ``config`` object, else (a record from before it had one) what the record
    says of it."""
    if not isinstance(value, dict):
        raise ValueError(f"config must be an object, not {type(value).__name__}")
    if not value:
        value = {"launcher": data.get("launcher", "local"), "address": data.get("address", "127.0.0.1"),
                 "backend": data.get("backend_requested") or "auto", "name": data.get("name")}
    try:
        return PoolConfig.from_dict(value)
    except TypeError as exc:  # a field of the wrong type that PoolConfig's checks compare
        raise ValueError(f"config: {exc}") from None


def _check(name: str, value: Any, hint: Any) -> None:
    """A ValueError unless ``value`` is of the field's type (its outer type: ``list[dict]`` is a list).

    >>> _check("created", 3, float)
    >>> _check("owner", [], dict | None)
    Traceback (most recent call last):
    ...
    ValueError: owner must be dict or None, not list ([])
    """
    options = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    kinds = tuple(get_origin(o) or o for o in options)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        names = " or ".join("None" if k is NoneType else k.__name__ for k in kinds)
        raise ValueError(f"{name} must be {names}, not {type(value).__name__} ({value!r:.40})")


# -- the Slurm job a pool runs in, as people read it (``workbench pools``, the card, ``%dist status``) --


def time_left(ends: float | None, now: float | None = None) -> str:
    """The time left until ``ends``, as a person says it ('' for no limit).

    >>> time_left(1000.0, now=1000.0 - 5000), time_left(100.0, now=130.0), time_left(None)
    ('1 h 23 min left', 'time limit reached', '')
    """
    if ends is None:
        return ""
    left = ends - (time.time() if now is None else now)
    if left <= 0:
        return "time limit reached"
    minutes = int(left // 60)
    if minutes < 1:
        return f"{int(left)} s left"
    if minutes < 60:
        return f"{minutes} min left"
    return f"{minutes // 60} h {minutes % 60} min left"


def allocation_words(record: dict | None, ends: float | None = None, now: float | None = None) -> str:
    """A pool's Slurm job and its time left, from its state (``allocation``, ``ends``), as ``%dist status``,
    the card and ``workbench pools`` say it ('' for a pool in no Slurm job).

    >>> job = {"job": "12", "nodes": ["n1", "n2"], "gpus": 8, "tasks": 8, "inside": True}
    >>> allocation_words(job, 5000.0, now=0.0)
    'inside Slurm job 12 (2 nodes, 8 GPUs) · 1 h 23 min left'
    >>> allocation_words({"job": "13", "nodes": ["n1"], "gpus": 0, "tasks": 2, "inside": False}, None)
    'in Slurm job 13 (1 node, 2 tasks, no GPU)'
    """
    if not record:
        return ""
    count = len(record.get("nodes") or [])
    nodes = f"{count} node{'s' if count != 1 else ''}"
    gpus, tasks = int(record.get("gpus") or 0), int(record.get("tasks") or 0)
    what = f"{gpus} GPU{'s' * (gpus != 1)}" if gpus else f"{tasks} task{'s' * (tasks != 1)}, no GPU"
    where = "inside" if record.get("inside") else "in"
    said = f"{where} Slurm job {record.get('job', '?')} ({nodes}, {what})"
    left = time_left(ends, now)
    return f"{said} · {left}" if left else said


def write_state(pool_id: str, state: PoolState) -> Path:
    """Write atomically (rename), so a reader never sees half a file; 0600. Each writer writes its own
    temporary file: cells on a split pool's sub-meshes (threads, other notebooks) may write at once."""
    path = state_path(pool_id)
    tmp = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")
    with private_file(tmp, "w") as f:  # the file holds the pool's side-channel key
        f.write(json.dumps(state.to_dict(), indent=1))
    os.replace(tmp, path)
    return path


def config_of(state: PoolState) -> PoolConfig:
    """The :class:`PoolConfig` a pool was started with, from its state file: what attach, a restart, the
    panel and the server start it again with. Its size is the pool's now (a scaled pool restarts at its
    new size), unless the cluster options fix the size.

    >>> config_of(PoolState(n=4, config=PoolConfig(n=2, launcher="mpi", name="team-a")))
    PoolConfig(n=4, launcher='mpi', backend='auto', timeout=60.0, address='127.0.0.1', interface=None, \
nodes=None, gpus_per_node=None, partition=None, time=None, account=None, hosts=(), namespace=None, \
image=None, gpus_per_pod=None, node_selector={}, pod_template=None, pods=None, idle_release=None, \
oversubscribe=False, name='team-a', collective_timeout=None, share_gpus=False, keep=False, new_job=False, \
walltime_warning=None, launcher_options={})
    """
    config = state.config
    if config.engines is None and state.n:
        config = PoolConfig.from_dict(config.to_dict(), n=state.n)
    return config


def prune_logs(keep: int = KEEP_LOGS) -> None:
    """Remove the logs of pools that no longer run, beyond the ``keep`` newest."""
    running = {s.id for s in list_states()}
    logs = sorted(state_dir().glob("pool-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for log in [p for p in logs if p.stem.removeprefix("pool-") not in running][keep:]:
        log.unlink(missing_ok=True)


def read_state(path: Path) -> PoolState | None:
    """The state in the file at ``path``; None when there is none (the pool stopped); a
    :class:`StateFileError` that names the file and what is wrong when it is not a pool state (the file
    stays as it is)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    try:
        return PoolState.from_dict(json.loads(text))
    except ValueError as exc:  # not JSON (json.JSONDecodeError is one), or not a pool state
        raise StateFileError(f"{path} is not a pool state file ({exc}); it was left as it is: remove it "
                             "once no process of that pool runs (`workbench pools` lists those that do)."
                             ) from None


_reported: set[tuple[str, float]] = set()  # broken state files already logged (a file and its mtime)


def list_states() -> list[PoolState]:
    """Every pool state file whose owner process is still alive. A file that is not a pool state is passed
    over (logged once): it must not hide the others."""
    states = []
    for path in sorted(state_dir().glob("pool-*.json")):
        try:
            state = read_state(path)
        except StateFileError as exc:
            with_time = (str(path), path.stat().st_mtime if path.exists() else 0.0)
            if with_time not in _reported:
                _reported.add(with_time)
                log.warning("%s", exc)
            continue
        if state and process_alive(state.owner):
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


def remove_files(state: PoolState) -> None:
    """Remove the files and scratch folders a pool recorded."""
    for extra in state.files:
        Path(extra).unlink(missing_ok=True)
    for folder in state.dirs:
        shutil.rmtree(folder, ignore_errors=True)
