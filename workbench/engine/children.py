"""The processes a rank started (multiprocessing, DataLoader workers, a framework's own spawn): the pool's.

Listed in every beacon (:func:`descendants`, read from ``/proc/<pid>/task/<tid>/children``: a few small
reads, no scan of every process), so ``%dist status`` and ``%dist stacks`` name them; a cell that fails (its
own error, the abort after another rank's failure, the interrupt of a timeout or a Ctrl-C) ends the ones it
started (:func:`end_started`), and says how many. The engine's own helpers (py-spy for native stacks, torch's
compile workers, which torch keeps for the next compile) are never counted.

>>> descendants() == [] or all(isinstance(pid, int) for pid, _ in descendants())
True
"""

from __future__ import annotations

import os
import signal
import sys
import time

# A process whose command line holds one of these is the engine's machinery, not the user's.
MACHINERY = ("py-spy", "read go && exec", "compile_worker")
FORK = "a fork of the rank's process"  # what a forked child (no exec) is called
TERM_WAIT_S = 2.0  # after SIGTERM, how long the children have before SIGKILL
_TICKS = os.sysconf("SC_CLK_TCK")
_READABLE = {"children": os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")}


def _direct(pid: int) -> list[int]:
    """``pid``'s children, from every one of its threads (a thread's fork is that thread's child)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _psutil_children() -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []


def descendants() -> list[tuple[int, str]]:
    """Every process below this one that is not the engine's machinery: ``[(pid, command line)]``."""
    if _READABLE["children"]:
        pids, todo = [], _direct(os.getpid())
        while todo:
            pid = todo.pop(0)
            pids.append(pid)
            todo += _direct(pid)
    else:  # a kernel without CONFIG_PROC_CHILDREN
        pids = _psutil_children()
    out, own = [], _cmdline(os.getpid())
    for pid in pids:
        line = _cmdline(pid)
        if line and not any(m in line for m in MACHINERY):  # "": a zombie, or gone meanwhile
            out.append((pid, FORK if line == own else line))  # a fork (multiprocessing) has our command line
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def end(pids: list[int], wait: float = TERM_WAIT_S) -> int:
    """SIGTERM ``pids``, SIGKILL the ones still there after ``wait`` seconds; how many were alive.

    Never ``waitpid``: the objects that started them (``multiprocessing.Process``, ``subprocess.Popen``)
    collect their exit status, and would see a wrong one if this did; a zombie holds no memory."""
    alive = [p for p in pids if _alive(p)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    while any(_alive(p) for p in alive) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in alive:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return len(alive)


def now() -> float:
    """The clock a process's start is told in (seconds since boot): what :func:`end_started` compares."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since boot (``/proc/<pid>/stat``'s starttime), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19]) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


def end_started(since: float | None, rank, why: str, starter: str = "this cell") -> int:
    """End the processes started at ``since`` (:func:`now`) or later (None: all of them) and say so on this
    rank's stderr; how many. Only the failure pays for the look (a cell's start only reads the clock)."""
    tick = 1.0 / _TICKS  # starttime counts whole ticks
    new = [pid for pid, _ in descendants()
           if since is None or (_started_at(pid) or 0.0) >= since - tick]
    if not new:
        return 0
    count = end(new)
    if count:
        print(f"workbench: rank {rank}: ended {count} process{'es' * (count != 1)} {starter} had started "
              f"({why}): pid {', '.join(map(str, new))}", file=sys.stderr, flush=True)
    return count
