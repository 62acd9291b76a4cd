"""Every thread's stack on this rank, taken from any thread (the agent's), also while the main thread
is blocked in a collective; native frames from py-spy where it can attach.

Python frames come from ``sys._current_frames()``: the agent thread reads them itself, so nothing
waits for the engine's main thread. A frame of a cell (IPython compiles each cell to a file named
``.../ipykernel_<pid>/<hash>.py``) is shown as ``cell line N``, with the line's text.

Native frames (inside gloo/NCCL, a C++ kernel, ``time.sleep``) need ``py-spy dump --native``, which
attaches with ptrace. Where Yama's ``ptrace_scope`` is 1 only an ancestor, or a tracer this process
names with ``prctl(PR_SET_PTRACER, pid)``, may attach: so this process starts py-spy itself, held
until it is named, then lets it go. Where py-spy is missing or cannot attach, :func:`native` says why
and the Python stacks stand alone.

Imports no torch (the kernel imports nothing of it either, but the agent may run before torch).

>>> stacks = python_stacks()
>>> any(t["main"] for t in stacks)
True
>>> cell_line("/tmp/ipykernel_12/3849628188.py")
True
"""

from __future__ import annotations

import ctypes
import json
import linecache
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from workbench import wire

MAX_FRAMES = 40  # innermost frames kept per thread: the engine's own event loop lies below the cell
MAX_TEXT = 120  # characters of a source line
PYSPY_TIMEOUT_S = wire.NATIVE_STACKS_TIMEOUT_S
MAX_CHILDREN = 4  # child processes dumped with native frames (DataLoader workers)
PR_SET_PTRACER = 0x59616D61  # "Yama"


def cell_line(filename: str) -> bool:
    """Whether ``filename`` is one IPython compiled a cell to (on an engine or in a kernel)."""
    return "ipykernel_" in filename or filename.startswith("<ipython-input-")


def short_path(filename: str) -> str:
    """``filename`` relative to the import path entry it lies under (``torch/distributed/...``).

    >>> short_path(sys.path[-1] + "/pkg/mod.py") if sys.path[-1] else "pkg/mod.py"
    'pkg/mod.py'
    """
    best = ""
    for entry in sys.path:
        if entry and filename.startswith(entry.rstrip("/") + "/") and len(entry) > len(best):
            best = entry.rstrip("/")
    return filename[len(best) + 1:] if best else filename


def _frame(filename: str, line: int, name: str) -> dict:
    text = linecache.getline(filename, line).strip()[:MAX_TEXT] if line else ""
    where = f"cell line {line}" if cell_line(filename) else f"{short_path(filename)}:{line}"
    return {"name": name, "where": where, "text": text}


def python_stacks() -> list[dict]:
    """Every Python thread of this process, innermost frame first: ``[{"name", "tid", "main", "frames"}]``.

    ``tid`` is the thread's native id (what py-spy names it by); a fork (the zygote's) leaves
    ``threading``'s record of the main thread's id stale, so the main thread's is this pid.
    """
    by_ident = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, top in sys._current_frames().items():
        thread = by_ident.get(ident)
        frames, frame = [], top
        while frame is not None and len(frames) < MAX_FRAMES:
            frames.append(_frame(frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
            frame = frame.f_back
        depth = len(frames)
        while frame is not None:
            depth, frame = depth + 1, frame.f_back
        out.append({"name": thread.name if thread else f"thread {ident}", "main": ident == main,
                    "tid": os.getpid() if ident == main else getattr(thread, "native_id", None),
                    "frames": frames, "cut": depth - len(frames)})
    out.sort(key=lambda t: (not t["main"], t["name"]))
    return out


def pyspy_path() -> str | None:
    """py-spy next to this Python (a venv's bin), on PATH, or where ``WORKBENCH_PYSPY`` says."""
    named = os.environ.get("WORKBENCH_PYSPY")
    if named:
        return named if os.access(named, os.X_OK) else None
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


def ptrace_scope() -> int | None:
    """Yama's ptrace_scope (None: no Yama, ordinary ptrace rules)."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return None


def _name_tracer(pid: int) -> None:
    """Let ``pid`` attach to this process where Yama restricts ptrace to ancestors."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PTRACER) failed")


def _dump(exe: str, pid: int, scope: int | None, timeout: float) -> list | str:
    """py-spy's JSON dump of ``pid`` (a list of threads), or why there is none."""
    # held on stdin until named as our tracer (only for ourselves: a child names no one); exec keeps the pid
    cmd = ["/bin/sh", "-c", 'read go && exec "$0" "$@"', exe, "dump", "--pid", str(pid), "--native", "--json"]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    except OSError as exc:
        return f"py-spy did not start: {exc}"
    try:
        if scope in (1, 2) and pid == os.getpid():
            _name_tracer(proc.pid)
        out, err = proc.communicate("go\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"py-spy took over {timeout:g} s"
    except OSError as exc:
        proc.kill()
        proc.communicate()
        return f"could not name py-spy as this process's tracer: {exc}"
    if proc.returncode != 0:
        why = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        hint = f" (kernel.yama.ptrace_scope = {scope})" if scope else ""
        return f"py-spy could not attach: {why}{hint}"
    try:
        return json.loads(out)
    except ValueError:
        return "py-spy's output was not JSON"


def _python_children() -> list[int]:
    """This process's Python children (DataLoader workers), a few at most."""
    import psutil

    found = []
    for child in psutil.Process().children():
        try:
            if "python" in os.path.basename(child.exe()):  # a forked worker has our name (wb-engine)
                found.append(child.pid)
        except psutil.Error:
            continue
    return found[:MAX_CHILDREN]


def native(timeout: float = PYSPY_TIMEOUT_S) -> dict:
    """``{"threads": {tid: [frame, ...]}, "children": [thread, ...]}`` from ``py-spy dump --native`` of
    this process and of its Python children (innermost first, native frames named ``fn (lib.so)``), or
    ``{"error": why}`` when py-spy cannot give them."""
    exe = pyspy_path()
    if exe is None:
        return {"error": "py-spy is not installed on this rank (pip install py-spy)"}
    scope = ptrace_scope()
    if scope == 3:
        return {"error": "ptrace is disabled on this host (kernel.yama.ptrace_scope = 3)"}
    dumped = _dump(exe, os.getpid(), scope, timeout)
    if isinstance(dumped, str):
        return {"error": dumped}
    threads = {str(t.get("os_thread_id")): _merged(t.get("frames", [])) for t in dumped}
    children = []
    for pid in _python_children():  # a DataLoader's workers: their threads come after ours
        found = _dump(exe, pid, scope, timeout)
        if isinstance(found, str):
            children.append({"name": f"subprocess {pid}", "main": False, "tid": pid, "cut": 0,
                             "frames": [{"name": found, "where": "py-spy", "text": "", "native": True}]})
            continue
        children += [{"name": f"subprocess {pid}: {t.get('thread_name') or '?'}", "main": False,
                      "tid": t.get("os_thread_id"), "frames": _merged(t.get("frames", [])), "cut": 0,
                      "native": True} for t in found]
    return {"threads": threads, "children": children}


def _merged(dumped: list[dict]) -> list[dict]:
    """py-spy's frames of one thread, innermost first, without unnamed native frames (bare addresses,
    which differ from process to process) and without the native frames below its outermost Python one."""
    frames = []
    for f in dumped[:MAX_FRAMES]:
        line, filename = f.get("line") or 0, f.get("filename") or ""
        if line and (filename.endswith(".py") or cell_line(filename)):
            frames.append(_frame(filename, line, f["name"]))
        elif line:  # a native frame with debug information: file and line of the C source
            frames.append({"name": f["name"], "where": f"{os.path.basename(filename)}:{line}", "text": "",
                           "native": True})
        elif not f["name"].startswith("0x"):
            name = f["name"] if len(f["name"]) <= MAX_TEXT else f["name"][:MAX_TEXT] + "…"
            frames.append({"name": name, "where": f.get("short_filename") or "?", "text": "", "native": True})
    python = [i for i, f in enumerate(frames) if not f.get("native")]
    return frames[:python[-1] + 1] if python else frames


def take(native_frames: bool = False) -> dict:
    """This rank's stacks: every Python thread, and with ``native_frames`` py-spy's merged stacks
    (native and Python) in place of those it could read."""
    from workbench.engine import children

    threads = python_stacks()
    result = {"pid": os.getpid(), "threads": threads, "native": None,
              "children": [[pid, line[:120]] for pid, line in children.descendants()]}
    if native_frames:
        found = native()
        if "error" in found:
            result["native"] = found["error"]
        else:
            result["native"] = "ok"
            for t in threads:
                merged = found["threads"].get(str(t["tid"]))
                if merged:
                    t["frames"], t["cut"], t["native"] = merged, 0, True
            threads += found["children"]
    return result
