"""Shared pieces of the benchmarks: statistics, the machine record, process clean-up, tables.

Runs in the project's own environment (``.venv``). Imports no torch and nothing of the anchors.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import psutil

from workbench.pool.records.state import end

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
ANCHORS_VENV = BENCH / ".venv-anchors"
ANCHORS_PY = ANCHORS_VENV / "bin" / "python"
# What the anchors' environment is built from (``make bench``); torch is installed first, pinned.
ANCHOR_PINS = {"nbdistributed": "0.1.0", "accelerate": "1.15.0"}


def summary(values: list[float], scale: float = 1.0, digits: int = 3) -> dict:
    """Median, min, max and count of ``values`` (times ``scale``), rounded."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    vs = [v * scale for v in values]
    return {
        "n": len(vs),
        "median": round(statistics.median(vs), digits),
        "min": round(min(vs), digits),
        "max": round(max(vs), digits),
    }


def versions(
    python: str | Path = sys.executable,
    packages=("torch", "ipyparallel", "ipykernel", "ipython", "pyzmq", "jupyter_client"),
) -> dict:
    """Installed versions of ``packages`` in the environment of ``python`` (None where missing)."""
    code = (
        "import json, importlib.metadata as m\nout = {}\n"
        f"for p in {list(packages)!r}:\n"
        "    try:\n        out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError:\n        out[p] = None\n"
        "print(json.dumps(out))"
    )
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
        return json.loads(done.stdout)
    except Exception as exc:  # an environment that cannot start reports that, not a crash
        return {"error": str(exc)}


def machine() -> dict:
    """What the numbers were measured on, and how busy it was."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def load_now() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def reap(procs: list[psutil.Process], grace: float = 3.0, patience: float = 2.0) -> int:
    """End the processes in ``procs`` still running after ``patience`` seconds (by pid: SIGTERM, then
    SIGKILL); returns how many had to be ended."""
    deadline = time.monotonic() + patience
    alive = _running(procs)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = _running(alive)
    end(alive, grace)
    return len(alive)


@contextmanager
def owned_children():
    """Ends, on exit, every process this process started (directly or not) that is still running.

    Yields a dict whose ``"leftover"`` is set to how many had to be ended.
    """
    before = {p.pid for p in descendants(os.getpid())}
    out = {"leftover": 0}
    seen: dict[int, psutil.Process] = {}

    def snapshot():
        for p in descendants(os.getpid()):
            if p.pid not in before:
                seen.setdefault(p.pid, p)

    out["snapshot"] = snapshot
    try:
        yield out
    finally:
        snapshot()
        out["leftover"] = reap(list(seen.values()))


def run_json(cmd: list[str], *, timeout: float, env: dict | None = None, cwd: Path = ROOT) -> dict:
    """Run ``cmd`` (a trial in a fresh process), return the JSON object on its last stdout line.

    Every process it leaves behind is ended (by pid) and counted in ``"leftover"``.
    """
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=str(cwd),
        start_new_session=True,
    )
    tree: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        for p in descendants(proc.pid):
            tree.setdefault(p.pid, p)
        time.sleep(0.05)
    timed_out = proc.poll() is None
    if timed_out:
        tree.setdefault(proc.pid, psutil.Process(proc.pid))
    leftover = reap(list(tree.values()))
    out, err = proc.communicate(timeout=10)
    last = next((ln for ln in reversed(out.strip().splitlines()) if ln.startswith("{")), None)
    if timed_out or last is None:
        tail = "\n".join((err or out).strip().splitlines()[-12:])
        return {
            "error": f"{'timed out' if timed_out else 'no result'} (exit {proc.returncode}): {tail}",
            "leftover": leftover,
        }
    result = json.loads(last)
    result["leftover"] = leftover
    return result


def shell():
    """The IPython shell of this process (started on first use), with ``%load_ext workbench`` done."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or get_ipython()
    if "distributed" not in ip.magics_manager.magics["cell"]:
        ip.run_line_magic("load_ext", "workbench")
    return ip


def without_spare():
    """The pools started in the block pay their own imports (no spare zygote: the cold start measured);
    the environment is as it was afterwards (the benches also run inside the test suite's process).
    A decorator too: ``@without_spare()``."""
    return mock.patch.dict(os.environ, {"WORKBENCH_PREWARM": "0"})


def cell(code: str):
    """A function that runs ``code`` as a cell of :func:`shell`, its output captured; a failed cell raises."""
    from IPython.utils.capture import capture_output

    ip = shell()

    def run():
        with capture_output():
            result = ip.run_cell(code)
        if not result.success:
            raise RuntimeError(f"cell failed: {result.error_in_exec or result.error_before_exec}")

    return run


def print_json(data: dict, out: str | None = None) -> None:
    """Print ``data`` as JSON (a benchmark's command line), and write it to ``out`` too if given."""
    text = json.dumps(data, indent=1)
    if out:
        Path(out).write_text(text + "\n")
    print(text)


def write_json(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


def fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        s = (
            f"{v:.0f}"
            if abs(v) >= 100
            else f"{v:.1f}"
            if abs(v) >= 10
            else f"{v:.2f}"
            if abs(v) >= 1
            else f"{v:.3f}"
        )
    else:
        s = str(v)
    return f"{s} {unit}".strip()


def ratio(ours, theirs) -> float | None:
    """``theirs / ours``: above 1 means ours is faster (for times) - the caller says which way."""
    if ours in (None, 0) or theirs is None:
        return None
    return round(theirs / ours, 2)
