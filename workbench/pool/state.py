"""Pool state files in the Jupyter runtime directory.

One JSON file per running pool, written by the process that owns the pool. The
lease process, the server extension and other kernels read them. They never hold
the ipyparallel key: only the path of ipyparallel's own cluster file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import psutil


def state_dir() -> Path:
    """``<jupyter runtime dir>/workbench``, created on first use."""
    from jupyter_core.paths import jupyter_runtime_dir

    path = Path(os.environ.get("WORKBENCH_STATE_DIR") or Path(jupyter_runtime_dir()) / "workbench")
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_path(pool_id: str) -> Path:
    return state_dir() / f"pool-{pool_id}.json"


def write_state(pool_id: str, state: dict) -> Path:
    """Write atomically (rename), so a reader never sees half a file."""
    path = state_path(pool_id)
    tmp = path.with_suffix(".tmp")
    # 0600 from the start: the file holds the pool's side-channel key
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(state, indent=1))
    os.replace(tmp, path)
    return path


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
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


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
