"""Find and end every process a pool started, orphans included.

Every process a pool launches (the controller, engines, mpiexec, sbatch, ssh) gets
``WORKBENCH_POOL=<pool id>`` in its environment, and its own children inherit it: the controller's
schedulers, an engine's nanny, whatever mpiexec or user code starts. So the pool's processes are
known from the moment they exist, also when their parent died and they were reparented to PPID 1,
and no Ctrl-C or SIGKILL between a spawn and a bookkeeping step can hide one.
"""

from __future__ import annotations

import os

import psutil

from workbench.pool.records.state import PoolState, cancel_jobs, end, process_alive, remove_files

MARKER = "WORKBENCH_POOL"


def tag(pool_id: str) -> dict[str, str]:
    """The environment entry that marks a process as the pool's.

    >>> tag("1a2b3c4d")
    {'WORKBENCH_POOL': '1a2b3c4d'}
    """
    return {MARKER: pool_id}


def tagged(pool_id: str) -> list[psutil.Process]:
    """Every process on this machine whose environment names ``pool_id`` (never this process)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(MARKER) == pool_id:
                found.append(proc)
        except psutil.Error:  # gone meanwhile, a zombie, or another user's
            pass
    return found


def pool_processes(pool_id: str | None, records: list[dict]) -> list[psutil.Process]:
    """The tagged processes, the recorded ones still alive, and all their descendants."""
    procs = {p.pid: p for p in tagged(pool_id)} if pool_id else {}
    for rec in records:
        if process_alive(rec) and rec["pid"] not in procs and rec["pid"] != os.getpid():
            try:
                procs[rec["pid"]] = psutil.Process(rec["pid"])
            except psutil.NoSuchProcess:  # it ended since the look (seen in a 16-rank `%dist stop`)
                pass
    for proc in list(procs.values()):
        try:
            procs.update((c.pid, c) for c in proc.children(recursive=True))
        except psutil.Error:
            pass
    procs.pop(os.getpid(), None)
    return list(procs.values())


def end_pool(pool_id: str | None, records: list[dict] = (), grace: float = 1.0) -> None:
    """End every process of the pool: SIGTERM, SIGKILL after ``grace`` s (0: at once).

    The recorded processes and their children go first (no look at the rest of the machine); then
    the tagged ones still running, until a look finds none: orphans, and a process forked while a
    round ran (an engine starting its nanny).

    >>> end_pool("no-such-pool")
    """
    end(pool_processes(None, list(records)), grace)
    for _ in range(5):
        procs = pool_processes(pool_id, [])
        if not procs:
            return
        end(procs, grace)


def clean_up(state: PoolState, grace: float = 1.0) -> None:
    """Everything a pool's state file names, ended: what stop does, and the lease when the owner died.

    Batch jobs and remote engines are cancelled, every process of the pool on this machine ended,
    ipyparallel's files and the pool's scratch folder removed (its log stays).
    """
    cancel_jobs(state.jobs + state.remote)
    end_pool(state.id or None, state.processes, grace)
    remove_files(state)
