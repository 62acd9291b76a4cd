"""Engine-side fault support: collective tracking, this rank's state for its beacon, the abort.

The agent (:mod:`workbench.engine.agent`) sends :func:`snapshot` four times a second, so the kernel
can see a rank that is stuck inside a collective, or sleeping, while the engine's main thread is
busy: which collective is in flight (until it completed, not until it was enqueued: NCCL returns at
once), the last one completed, the line the main thread is on, where this rank's gloo listens, and,
after a failed collective, whether the failure came from here or from a peer.

:func:`abort` is safe to call from any thread, also while the main thread is blocked in a
collective: that is how the kernel releases a stuck rank without losing its Python state.
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

TRACKED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
           "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "reduce", "gather",
           "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv")
WILDCARD = ("0.0.0.0", "::")

# done: collectives completed; inflight/since: the oldest one not completed; failure: the last failed
# collective's origin; aborted_at: when this rank's group was last aborted.
_track: dict = {"done": 0, "done_name": None, "inflight": None, "since": None, "failure": None,
                "aborted_at": None}
_pending: collections.deque = collections.deque()  # (name, since, is_complete) in call order
_track_lock = threading.Lock()
_abort_lock = threading.Lock()
_not_gloo: set[int] = set()  # listening ports that are not gloo's: the store's, and what was there before
_listeners: dict = {}  # this rank's gloo endpoints, and for how many groups they were read


def _completion(result, args, kwargs) -> Callable[[], bool] | None:
    """How to tell that a collective that returned has completed; None: it has."""
    if isinstance(result, dist.Work):  # async_op=True, or isend/irecv
        return result.is_completed
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if any(t.is_cuda for t in tensors):  # NCCL returned once enqueued: done when the stream passes here
        event = torch.cuda.Event()
        event.record()
        return event.query
    return None


def _poll() -> None:
    """Count the collectives that completed since the last look, oldest first."""
    with _track_lock:
        while _pending and _pending[0][2]():
            name, _, _ = _pending.popleft()
            _track["done"] += 1
            _track["done_name"] = name


def _tracked(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        since = time.time()
        _track["inflight"], _track["since"] = name, since
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _track["inflight"] = None
            _note_failure(exc, name)
            raise
        _track["inflight"] = None
        waiter = _completion(result, args, kwargs)
        with _track_lock:
            _pending.append((name, since, waiter or (lambda: True)))
        _poll()
        return result

    wrapper.__wrapped_by_workbench__ = True
    return wrapper


def group_formed() -> None:
    """A new group: forget the failures, the abort and the collectives of the old one."""
    with _track_lock:
        _pending.clear()
    _track.update(inflight=None, since=None, failure=None, aborted_at=None)
    _listeners.clear()


def launched() -> int:
    """How many collectives this rank has started through ``torch.distributed`` (completed or not): a
    rank that is behind its peers has started fewer (see :mod:`workbench.session.cell_elastic`)."""
    return _track["done"] + len(_pending) + (_track["inflight"] is not None)


def track_collectives() -> None:
    """Count the collectives user code calls through ``torch.distributed`` (once per process)."""
    for name in TRACKED:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "__wrapped_by_workbench__", False):
            setattr(dist, name, _tracked(name, fn))
            if name in ("isend", "irecv"):  # P2POp (pipelining) accepts only c10d's own isend/irecv
                setattr(c10d, name, getattr(dist, name))


def in_flight() -> tuple[str | None, float | None]:
    """The collective this rank waits for (the call in progress, else the oldest not completed)."""
    if _track["inflight"] is not None:
        return _track["inflight"], _track["since"]
    with _track_lock:
        if _pending:
            return _pending[0][0], _pending[0][1]
    return None, None


# -- where a failure came from ------------------------------------------------------------------------------
def failure_origin(exc: BaseException, *, aborted: bool, backend_errors: Iterable[str] = ()) -> str | None:
    """``"aborted"`` (we aborted this rank's group), ``"peer"`` (another rank failed or stalled), ``"local"``
    (this rank's own backend failed, e.g. NCCL after a CUDA OOM) or None when nothing says.

    Decided by what happened and by the backend's own error type (``ErrorType``), never by message text.

    >>> failure_origin(RuntimeError("x"), aborted=False, backend_errors=["COMM_ERROR"])
    'local'
    >>> failure_origin(RuntimeError("x"), aborted=False, backend_errors=["REMOTE_ERROR"])
    'peer'
    """
    errors = set(backend_errors)
    if aborted:
        return "aborted"
    if errors & {"REMOTE_ERROR", "TIMEOUT"} or isinstance(exc, dist.DistNetworkError):
        return "peer"
    if "COMM_ERROR" in errors:
        return "local"
    return None


def _backend_errors() -> list[str]:
    """The error state of every CUDA backend of every group (NCCL reports one; gloo has none)."""
    found = []
    for pg in list(c10d._world.pg_map):
        try:
            error = pg._get_backend(torch.device("cuda")).get_error()
        except Exception:  # no CUDA backend in this group, or one that keeps no error state
            continue
        if error.name != "SUCCESS":
            found.append(error.name)
    return found


def _note_failure(exc: BaseException, name: str) -> None:
    if isinstance(exc, (KeyboardInterrupt, ValueError, TypeError)):
        return  # our own escalation's SIGINT, or a bad argument: nothing to do with the group
    origin = failure_origin(exc, aborted=_track["aborted_at"] is not None, backend_errors=_backend_errors())
    _track["failure"] = {"name": name, "t": time.time(), "ename": type(exc).__name__, "origin": origin}


# Functions of IPython that format an error: a main thread inside one has left the user's code and is
# reporting how it ended (which can take a second the first time: it parses the files it shows).
REPORTING = frozenset({"showtraceback", "_showtraceback", "structured_traceback",
                       "format_exception_as_a_whole"})
# The engine's handlers of a request from the kernel (ipykernel's execute, ipyparallel's apply): a main
# thread inside one is busy (the agent beacons every beat), else it waits between cells.
BUSY_FRAMES = frozenset({"execute_request", "apply_request", "do_execute", "do_apply"})


def snapshot(rank: int) -> dict:
    """This rank's state as the kernel's watchdog wants it."""
    _poll()
    inflight, since = in_flight()
    frame = sys._current_frames().get(threading.main_thread().ident)
    where, reporting, busy = None, False, False
    while frame is not None:
        code = frame.f_code
        busy = busy or code.co_name in BUSY_FRAMES
        if where is None and "workbench/engine/guard" not in code.co_filename:
            # the innermost frame of user code or a library, not ours
            cell = "ipykernel_" in code.co_filename and code.co_name == "<module>"
            where = f"cell line {frame.f_lineno}" if cell else \
                f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        reporting = reporting or code.co_name in REPORTING
        frame = frame.f_back
    return {"rank": rank, "pid": os.getpid(), "t": time.time(), "done": _track["done"],
            "done_name": _track["done_name"], "inflight": inflight, "since": since,
            "group": dist.is_initialized(), "where": where, "reporting": reporting, "busy": busy,
            "failure": _track["failure"], "aborted_at": _track["aborted_at"],
            "endpoints": _endpoints_if_changed(), "launched": launched()}


def _endpoints_if_changed() -> list | None:
    """This rank's gloo listeners, looked up again only when the number of groups changed (a new mesh)."""
    groups = len(c10d._world.pg_map)
    if _listeners.get("groups") != groups:
        _listeners.update(groups=groups, endpoints=gloo_endpoints() if groups else [])
    return _listeners["endpoints"]


# -- abort and severing --------------------------------------------------------------------------------
def _connections() -> list[tuple[int, str, tuple, tuple | None]]:
    """This process's TCP sockets, ``(fd, status, laddr, raddr)``: "LISTEN", "ESTABLISHED" or "NONE".

    Read from this process's own descriptors (a few syscalls each), not from the machine's
    ``/proc/net/tcp`` as psutil does: with N ranks on a host that table has ~N² gloo pairs, and every
    rank aborting at once parsed all of it twice (15 ms a time at 32 ranks, 1,650 lines).
    """
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # no /proc (not Linux): psutil's way
        return _psutil_connections()
    found = []
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
        except OSError:
            continue  # closed meanwhile (or the listing's own descriptor)
        conn = _describe(int(name))
        if conn is not None:
            found.append(conn)
    return found


def _describe(fd: int) -> tuple[int, str, tuple, tuple | None] | None:
    """``(fd, status, laddr, raddr)`` of the TCP socket ``fd`` (looked at through a duplicate); None if it is
    no TCP socket (any more)."""
    import socket

    try:
        copy = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return None
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return None
        laddr = tuple(sock.getsockname()[:2])
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return fd, "LISTEN", laddr, None
        try:
            return fd, "ESTABLISHED", laddr, tuple(sock.getpeername()[:2])
        except OSError:  # not connected
            return fd, "NONE", laddr, None
    except OSError:
        return None
    finally:
        sock.close()  # the duplicate only


def _psutil_connections() -> list[tuple[int, str, tuple, tuple | None]]:
    import psutil

    try:
        conns = psutil.Process().net_connections("tcp")
    except OSError:  # a socket closed while psutil read /proc: once more
        conns = psutil.Process().net_connections("tcp")
    return [(c.fd, c.status, tuple(c.laddr), tuple(c.raddr) if c.raddr else None) for c in conns]


def listening() -> list[tuple[str, int]]:
    """The (address, port) this process listens on."""
    return sorted({laddr for _, status, laddr, _ in _connections() if status == "LISTEN"})


def not_gloo(ports: Iterable[int]) -> None:
    """Mark listening ports that are not gloo's (rank 0's store; whatever listened before the first join)."""
    _not_gloo.update(ports)


def gloo_endpoints() -> list[list]:
    """Where this rank's gloo listens now, subgroups (meshes, ``new_group``) included: ``[[ip, port]]``."""
    return [[ip, port] for ip, port in listening() if port not in _not_gloo]


def _norm(endpoint) -> tuple[str, int]:
    ip, port = endpoint
    return str(ip).removeprefix("::ffff:"), int(port)


def to_sever(conns, own, peers) -> list[int]:
    """The fds among ``conns`` that are gloo pairs: accepted by one of our listeners ``own``, or connected
    to a peer's listener ``peers`` (``(ip, port)`` each, matched together: never a port alone, which
    another host may use for anything). ``conns``: ``(fd, status, laddr, raddr)`` as psutil gives them.

    >>> to_sever([(7, "ESTABLISHED", ("10.0.0.2", 5000), ("10.0.0.9", 40000))], [], [("10.0.0.3", 5000)])
    []
    >>> to_sever([(7, "ESTABLISHED", ("10.0.0.2", 5000), ("10.0.0.9", 40000))], [("0.0.0.0", 5000)], [])
    [7]
    """
    own_exact = {_norm(e) for e in own if _norm(e)[0] not in WILDCARD}
    own_any = {_norm(e)[1] for e in own if _norm(e)[0] in WILDCARD}
    peer_set = {_norm(e) for e in peers}
    fds = []
    for fd, status, laddr, raddr in conns:
        if status != "ESTABLISHED" or not raddr:
            continue
        local = _norm(laddr)
        if local in own_exact or local[1] in own_any or _norm(raddr) in peer_set:
            fds.append(fd)
    return fds


def abort(peers: Iterable = ()) -> int | None:
    """Abort this rank's process groups so peers blocked in a collective with it fail at once.

    Safe from a background thread while the main thread is blocked in a collective (the main thread
    then raises; its Python state stays). Every group is aborted, subgroups included: NCCL through
    ``ProcessGroupNCCL.abort()`` (the communicators, which also ends a kernel a CUDA sync waits on), gloo
    through its abort plus shutting down each gloo connection, since gloo's abort alone leaves them
    open while anything still references the group. A gloo connection is one accepted by this rank's
    gloo listeners (read now, so meshes made after the join count) or one to ``peers`` (the other
    ranks' listeners, ``[ip, port]`` each). The control plane (ipyparallel, the beacon, metrics) is
    never touched. Never ``destroy_process_group``: on the error path that can block. Returns how many
    connections were cut (None: there was no group to abort).
    """
    with _abort_lock:
        if not dist.is_initialized():
            return None
        _track["aborted_at"] = time.time()
        own = gloo_endpoints()  # before the abort: gloo may close its listeners
        c10d._abort_process_group()
        _listeners.clear()
        return _sever(own, list(peers))


def _sever(own, peers) -> int:
    import socket

    conns = _connections()
    where = {fd: (laddr, raddr) for fd, _, laddr, raddr in conns}
    cut = 0
    for fd in to_sever(conns, own, peers):
        try:
            copy = os.dup(fd)
        except OSError:
            continue  # closed meanwhile
        try:
            sock = socket.socket(fileno=copy)
        except OSError:  # the number names something other than a socket by now
            os.close(copy)
            continue
        try:
            # the number may name another socket by now (the abort closed the listed one and a new
            # connection, say to the next group's store, got its number): cut only what was listed
            laddr, raddr = where[fd]
            if sock.getsockname()[1] == laddr[1] and sock.getpeername()[1] == raddr[1]:
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
        except OSError:
            pass  # closed meanwhile
        finally:
            sock.close()
    return cut


def group_ok() -> bool:
    return dist.is_initialized()
