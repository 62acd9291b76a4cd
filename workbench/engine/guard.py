"""Engine-side fault support: collective tracking, a status beacon, and the process-group abort.

The beacon is a daemon thread that pushes this rank's state to the kernel four times a
second over its own ZMQ socket, so the kernel can see a rank that is stuck inside a
collective, or sleeping, while the engine's main thread is busy: which collective is in
flight, the last one completed, and the line the main thread is on.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

BEACON_PERIOD_S = 0.25
TRACKED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
           "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "reduce", "gather",
           "scatter", "all_to_all", "all_to_all_single", "send", "recv")

_track = {"done": 0, "done_name": None, "inflight": None, "since": None}
_beacon: dict = {}


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


def snapshot(rank: int) -> dict:
    """This rank's state as the kernel's watchdog wants it."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    where = None
    while frame is not None:  # the innermost frame of user code or a library, not ours
        code = frame.f_code
        if "workbench/engine/guard" not in code.co_filename:
            cell = "ipykernel_" in code.co_filename and code.co_name == "<module>"
            where = f"cell line {frame.f_lineno}" if cell else f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
            break
        frame = frame.f_back
    return {"rank": rank, "pid": os.getpid(), "t": time.time(), "done": _track["done"],
            "done_name": _track["done_name"], "inflight": _track["inflight"], "since": _track["since"],
            "group": dist.is_initialized(), "where": where}


def start_beacon(address: str, rank: int) -> None:
    """Push :func:`snapshot` to the kernel's ``address`` until :func:`stop_beacon`."""
    import zmq

    stop_beacon()
    stop = threading.Event()
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 8)  # a slow kernel drops old beats, never blocks us
    sock.connect(address)

    def beat():
        while True:  # the first beat at once, then one a period
            try:
                sock.send(json.dumps(snapshot(_beacon["rank"])).encode(), zmq.NOBLOCK)
            except zmq.Again:
                pass
            if stop.wait(BEACON_PERIOD_S):
                break
        sock.close()

    _beacon.update(rank=rank, stop=stop, thread=threading.Thread(target=beat, name="workbench-beacon",
                                                                  daemon=True))
    _beacon["thread"].start()


def stop_beacon() -> None:
    if _beacon.get("stop") is not None:
        _beacon["stop"].set()
        _beacon["thread"].join(2)
    _beacon.clear()


def listening_ports(exclude: set[int] = frozenset()) -> list[int]:
    """The TCP ports this process listens on (after joining: gloo's, plus rank 0's store)."""
    import psutil

    return sorted({c.laddr.port for c in psutil.Process().net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN} - set(exclude))


def abort(gloo_ports: list[int] = ()) -> bool:
    """Abort this rank's process group so peers blocked in a collective with it fail at once.

    gloo's abort alone leaves its connections open while anything still references the
    group (importing FSDP or pipelining does), so the peers would wait for the
    collective timeout. We also shut down every connection to or from a gloo port:
    each blocked peer then fails at once with "Connection closed by peer".
    Never ``destroy_process_group``: on the error path that can block. Returns whether
    there was a group to abort.
    """
    if not dist.is_initialized():
        return False
    c10d._abort_process_group()
    _sever(set(gloo_ports))
    return True


def _sever(ports: set[int]) -> None:
    import socket

    import psutil

    try:
        conns = psutil.Process().net_connections("tcp")
    except OSError:  # a socket closed while psutil read /proc: once more
        conns = psutil.Process().net_connections("tcp")
    for conn in conns:
        if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and (
                conn.laddr.port in ports or conn.raddr.port in ports):
            try:
                sock = socket.socket(fileno=os.dup(conn.fd))
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass  # closed meanwhile


def group_ok() -> bool:
    return dist.is_initialized()
