"""What runs on each engine to join the process group.

The kernel calls these through ipyparallel: ``describe`` on every engine, then
``open_store`` on rank 0, then ``join`` on every rank at once.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket

import torch
import torch.distributed as dist

from workbench.engine import agent, guard

log = logging.getLogger("workbench.engine")
# Objects that must outlive one call: rank 0's store (its listening socket) and the rank's facts.
_state: dict = {}


def describe() -> dict:
    """Host, pid, and the GPUs this engine sees (count and UUIDs, in its own CUDA order)."""
    gpus = torch.cuda.device_count()
    return {"host": socket.gethostname(), "pid": os.getpid(), "gpus": gpus,
            "gpu_uuids": [_gpu_uuid(i) for i in range(gpus)]}


def _gpu_uuid(index) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def open_store(address: str, timeout_s: float) -> int:
    """Rank 0: start the TCPStore on ``address`` and return its port.

    We bind the listening socket ourselves: given port 0, TCPStore listens on every
    interface, and a local pool must stay on loopback.
    """
    close()
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    _state["store"] = dist.TCPStore(
        address, port, is_master=True, master_listen_fd=sock.fileno(),
        timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
    )
    # The store owns the listening fd now and closes it when it is destroyed (an aborted group may keep
    # it alive a while): closing it here too would later close whatever socket reused the number.
    sock.detach()
    return port


def threads_for(own: set[int], others: list[set[int]]) -> int:
    """CPU threads for this rank: its own CPUs, split with the ranks here whose CPUs overlap them.

    >>> threads_for({0, 1, 2, 3}, [{0, 1, 2, 3}])   # two engines on the same 4 CPUs
    2
    >>> threads_for({0, 1}, [{2, 3}])               # Slurm bound each task to its own CPUs
    2
    """
    sharing = 1 + sum(bool(own & cpus) for cpus in others)
    return max(1, len(own) // sharing)


def _affinity(pid: int) -> set[int]:
    try:
        return set(os.sched_getaffinity(pid))
    except OSError:  # gone, or not ours to read: count it as sharing all of our CPUs
        return set(os.sched_getaffinity(0))


def collective_timeout(timeout_s: float) -> float:
    """The collective timeout for an interactive ``timeout_s``: the backstop behind the kernel's own hang
    detection, long enough for a slow first step (compiles, NCCL warm-up), never shorter than ``timeout_s``.

    >>> collective_timeout(60)
    900.0
    """
    return max(float(timeout_s), 900.0)


def join(*, rank: int, local_rank: int, world_size: int, address: str, port: int,
         backend: str, device: str, timeout_s: float, ifname: str | None, local_pids=(),
         collective_timeout_s: float | None = None, channel: dict | None = None, generation: int = 0) -> dict:
    """Join the process group and put ``rank``, ``world_size``, ``device``... into the user namespace.

    ``backend``: the same string on every rank (the kernel's ``group_backend``). ``timeout_s`` bounds the
    rendezvous; collectives wait up to ``collective_timeout_s`` (default :func:`collective_timeout`).
    ``local_pids``: the engines of the other ranks on this host, whose CPUs this rank's threads share.
    Returns rank, backend, threads, interface and where this rank's gloo listens (``endpoints``).
    """
    env = {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world_size,
           "MASTER_ADDR": address, "MASTER_PORT": port,
           # engines survive NCCL errors: the watchdog aborts the communicators (the next collective raises)
           # and never tears the process down; no heartbeat monitor that would kill a slow engine
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": 2, "TORCH_NCCL_ENABLE_MONITORING": 0}
    if ifname:  # set, not setdefault: a re-form on another network must not keep the old interface
        env.update(GLOO_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
    os.environ.update({k: str(v) for k, v in env.items()})
    own = set(os.sched_getaffinity(0))
    threads = threads_for(own, [_affinity(p) for p in local_pids if p != os.getpid()])
    torch.set_num_threads(threads)
    log.info("rank %d: %d threads, GLOO_SOCKET_IFNAME=%s NCCL_SOCKET_IFNAME=%s", rank, threads,
             os.environ.get("GLOO_SOCKET_IFNAME"), os.environ.get("NCCL_SOCKET_IFNAME"))
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend == "auto":  # a caller without a rank map (the kernel always passes the group's string)
        backend = "cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo"
    agent.stop()  # first: a command still on its way for the old group must not reach the new one
    guard.abort()  # what is left of an earlier group: abort, never destroy (that can block)
    if "baseline" not in _state:  # whatever listened before the first group is not gloo's
        _state["baseline"] = True
        guard.not_gloo(p for _, p in guard.listening())
    store = _state.get("store") if rank == 0 else None
    if store is None:
        store = dist.TCPStore(address, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        _state["store"] = store
    if rank == 0:
        guard.not_gloo([port])
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=dev if dev.type == "cuda" else None)
    backstop = datetime.timedelta(seconds=collective_timeout_s or collective_timeout(timeout_s))
    try:  # the rendezvous waited for ``timeout_s``; collectives get the longer backstop
        dist.group.WORLD.set_timeout(backstop)
    except RuntimeError as exc:  # a backend that cannot change it keeps the interactive timeout
        log.warning("rank %d: collective timeout unchanged (%s)", rank, exc)
    uuid = _gpu_uuid(dev) if dev.type == "cuda" else None
    _state.update(rank=rank, local_rank=local_rank, world_size=world_size, device=dev, gpu_uuid=uuid,
                  generation=generation)
    guard.group_formed()
    guard.track_collectives()
    if channel:  # beacons up, commands down: the pool's side channel
        agent.start(channel, rank, generation)
    _user_namespace().update(rank=rank, local_rank=local_rank, world_size=world_size, device=dev, dist=dist)
    return {"rank": rank, "backend": dist.get_backend(), "threads": threads, "gpu_uuid": uuid,
            "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "endpoints": guard.gloo_endpoints()}


def identity() -> dict:
    """This engine's rank, device and GPU UUID in the current group (rank 0 on the CPU before any join)."""
    return {"rank": _state.get("rank", 0), "device": _state.get("device", "cpu"),
            "gpu_uuid": _state.get("gpu_uuid")}


def generation() -> int:
    """Which process group this is: the kernel counts them, so every rank sees a re-formed one at once."""
    return _state.get("generation", 0)


def close() -> None:
    """Leave the process group and close the store (normal path only)."""
    agent.stop()
    if dist.is_initialized():
        dist.destroy_process_group()
    _state.pop("store", None)


def _user_namespace() -> dict:
    from IPython import get_ipython

    ip = get_ipython()
    return ip.user_ns if ip is not None else globals()
