"""The anchors' side of the benchmarks: runs in ``bench/.venv-anchors`` (nbdistributed, accelerate).

Never imports workbench. Three ways in:

    python bench/anchors_side.py ready-nbdistributed      # one time-to-ready trial, a JSON line out
    python bench/anchors_side.py ready-accelerate
    python bench/anchors_side.py serve                     # JSON commands on stdin (interleaved cells)

and, inside an ipykernel of this environment, ``nbd_start(get_ipython(), 2)`` / ``nbd_stop(...)``.

nbdistributed's own ``%dist_shutdown`` and ``%dist_reset`` run ``pkill -f`` over patterns that
match other people's processes (``python.*worker``, ``torch.*distributed``): we never call them, and
``nbd_start`` disarms them. ``nbd_stop`` ends exactly the worker processes nbdistributed started.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

T_START = time.time()
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
TRIVIAL = "%%distributed\nx = 1"
VERIFY = "%%distributed\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nprint(f'SUM={t.item()}')"


def _magic(ip):
    return ip.magics_manager.registry["DistributedMagic"]


def _refuse(*args, **kwargs):
    raise RuntimeError("the benchmark never runs nbdistributed's pkill-based shutdown")


def nbd_start(ip, n: int = 2) -> None:
    """``%load_ext nbdistributed`` and ``%dist_init -n N`` in the shell ``ip``; verified by an all_reduce.

    Auto mode (every plain cell sent to the workers) is turned off again, so that only explicit
    ``%%distributed`` cells go to the workers and the harness's own cells run here.
    """
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        ip.run_line_magic("load_ext", "nbdistributed")
        magic = _magic(ip)
        type(magic)._nuclear_shutdown = classmethod(_refuse)
        ip.run_line_magic("dist_init", f"-n {n} -a 127.0.0.1")
        magic._disable_distributed_mode()
        _wait_connected(magic, deadline=time.monotonic() + 120)
        ip.run_cell(VERIFY)
    if f"SUM={float(n * (n + 1) // 2)}" not in cap.stdout:
        raise RuntimeError(f"nbdistributed did not form a process group:\n{cap.stdout[-2000:]}")


def _wait_connected(magic, deadline: float) -> None:
    """Wait until every worker answers.

    ``%dist_init`` returns after a fixed 2 s sleep, whether or not the workers have finished
    importing torch and joined the process group; a message sent to a worker that has not
    connected yet is dropped by the coordinator's ROUTER socket, and the cell then waits out a
    30 s timeout. A user would re-run the cell; this polls instead (in nbdistributed's favour).
    """
    comm = magic._comm_manager
    if comm is None:
        raise RuntimeError("%dist_init did not start nbdistributed's workers")
    while True:
        try:
            comm.send_to_all("get_status", {}, timeout=0.25)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise


def nbd_pids(ip) -> list[int]:
    pm = _magic(ip)._process_manager
    return [p.pid for p in pm.processes] if pm else []


def nbd_stop(ip) -> None:
    """Stop the workers nbdistributed started (their shutdown message, then terminate/kill by pid)."""
    from IPython.utils.capture import capture_output

    magic = _magic(ip)
    with capture_output():
        if magic._comm_manager is not None:
            try:
                magic._comm_manager.send_to_all("shutdown", {}, timeout=2.0)
            except Exception:
                pass  # the workers do not answer a shutdown: they exit
            magic._comm_manager.shutdown()
        if magic._process_manager is not None:
            magic._process_manager.shutdown()  # terminate, wait, kill: by pid only
        magic._comm_manager = magic._process_manager = None


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


def ready_nbdistributed() -> dict:
    ip = _shell()
    t0 = time.time()
    import nbdistributed  # noqa: F401  (what %load_ext imports)

    t_import = time.time()
    nbd_start(ip, 2)
    t_ready = time.time()
    nbd_stop(ip)
    return {"ready_s": t_ready - t0, "import_s": t_import - t0, "stop_s": time.time() - t_ready}


def _accelerate_fn(path: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump({"t_ready": time.time(), "sum": t.item()}, f)
    dist.destroy_process_group()


def ready_accelerate() -> dict:
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="wb-bench-"), "ready.json")
    t0 = time.time()
    from accelerate import notebook_launcher

    t_import = time.time()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    notebook_launcher(_accelerate_fn, args=(path,), num_processes=2, use_port=str(port))
    t_end = time.time()
    with open(path) as f:
        got = json.load(f)
    os.unlink(path)
    os.rmdir(os.path.dirname(path))
    if got["sum"] != 2.0:
        raise RuntimeError(f"accelerate's all_reduce gave {got['sum']}")
    return {"ready_s": got["t_ready"] - t0, "import_s": t_import - t0, "stop_s": t_end - got["t_ready"]}


def serve() -> None:
    """Answer JSON commands, one per line: start, cells N, memory, stop. One JSON line per answer."""
    import psutil
    from IPython.utils.capture import capture_output

    ip = _shell()
    out = sys.stdout
    sys.stdout = sys.stderr  # only answers on the real stdout
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "start":
                t0 = time.perf_counter()
                nbd_start(ip, cmd.get("n", 2))
                answer = {"ready_s": time.perf_counter() - t0}
            elif cmd["cmd"] == "cells":
                times = []
                for _ in range(cmd["n"]):
                    with capture_output():
                        t0 = time.perf_counter()
                        ip.run_cell(cmd.get("code", TRIVIAL))
                        times.append(time.perf_counter() - t0)
                answer = {"times": times}
            elif cmd["cmd"] == "memory":
                answer = {"workers": [_mem(psutil.Process(pid)) for pid in nbd_pids(ip)]}
            elif cmd["cmd"] == "stop":
                t0 = time.perf_counter()
                nbd_stop(ip)
                answer = {"stop_s": time.perf_counter() - t0}
            else:
                answer = {"error": f"unknown command {cmd['cmd']!r}"}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
        if cmd["cmd"] == "stop":
            return


def _mem(p) -> dict:
    m = p.memory_full_info()
    return {"rss_mib": m.rss / 2**20, "uss_mib": m.uss / 2**20, "pss_mib": getattr(m, "pss", 0) / 2**20}


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "serve":
        serve()
    else:
        real = sys.stdout
        sys.stdout = sys.stderr
        result = {"ready-nbdistributed": ready_nbdistributed, "ready-accelerate": ready_accelerate}[what]()
        real.write(json.dumps(result) + "\n")
