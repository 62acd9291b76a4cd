"""Engine-side fault support: collective tracking, this rank's state for its beacon, the abort.

The agent (:mod:`workbench.engine.agent`) sends :func:`snapshot` four times a second, so the kernel
can see a rank that is stuck inside a collective, or sleeping, while the engine's main thread is
busy: which collective is in flight, the last one completed, and the line the main thread is on.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

TRACKED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
           "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "reduce", "gather",
           "scatter", "all_to_all", "all_to_all_single", "send", "recv")

_track = {"done": 0, "done_name": None, "inflight": None, "since": None}


def _tracked(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _track["inflight"], _track["since"] = name, time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            _track["inflight"] = None
            _track["done"] += 1
            _track["done_name"] = name

    wrapper.__wrapped_by_workbench__ = True
    return wrapper


def track_collectives() -> None:
    """Count the collectives user code calls through ``torch.distributed`` (once per process)."""
    for name in TRACKED:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "__wrapped_by_workbench__", False):
            setattr(dist, name, _tracked(name, fn))


# Functions of IPython that format an error: a main thread inside one has left the user's code and is
# reporting how it ended (which can take a second the first time: it parses the files it shows).
REPORTING = frozenset({"showtraceback", "_showtraceback", "structured_traceback",
                       "format_exception_as_a_whole"})


def snapshot(rank: int) -> dict:
    """This rank's state as the kernel's watchdog wants it."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    where, reporting = None, False
    while frame is not None:
        code = frame.f_code
        if where is None and "workbench/engine/guard" not in code.co_filename:
            # the innermost frame of user code or a library, not ours
            cell = "ipykernel_" in code.co_filename and code.co_name == "<module>"
            where = f"cell line {frame.f_lineno}" if cell else \
                f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        reporting = reporting or code.co_name in REPORTING
        frame = frame.f_back
    return {"rank": rank, "pid": os.getpid(), "t": time.time(), "done": _track["done"],
            "done_name": _track["done_name"], "inflight": _track["inflight"], "since": _track["since"],
            "group": dist.is_initialized(), "where": where, "reporting": reporting}


def listening_ports(exclude: set[int] = frozenset()) -> list[int]:
    """The TCP ports this process listens on (after joining: gloo's, plus rank 0's store)."""
    import psutil

    return sorted({c.laddr.port for c in psutil.Process().net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN} - set(exclude))


def abort(gloo_ports: list[int] = ()) -> int | None:
    """Abort this rank's process group so peers blocked in a collective with it fail at once.

    gloo's abort alone leaves its connections open while anything still references the
    group (importing FSDP or pipelining does), so the peers would wait for the
    collective timeout. We also shut down every connection to or from a gloo port:
    each blocked peer then fails at once with "Connection closed by peer".
    Never ``destroy_process_group``: on the error path that can block. Returns how many
    connections were cut (None: there was no group to abort).
    """
    if not dist.is_initialized():
        return None
    c10d._abort_process_group()
    return _sever(set(gloo_ports))


def _sever(ports: set[int]) -> int:
    import socket

    import psutil

    try:
        conns = psutil.Process().net_connections("tcp")
    except OSError:  # a socket closed while psutil read /proc: once more
        conns = psutil.Process().net_connections("tcp")
    cut = 0
    for conn in conns:
        if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and (
                conn.laddr.port in ports or conn.raddr.port in ports):
            try:
                sock = socket.socket(fileno=os.dup(conn.fd))
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
                cut += 1
            except OSError:
                pass  # closed meanwhile
    return cut


def group_ok() -> bool:
    return dist.is_initialized()
