"""What runs on each engine to join the process group.

The kernel calls these through ipyparallel: ``describe`` on every engine, then
``open_store`` on rank 0, then ``join`` on every rank at once.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from workbench.engine import agent, guard

# Objects that must outlive one call: rank 0's store (its listening socket) and the rank's facts.
_state: dict = {}


def describe() -> dict:
    """Host, pid and visible GPU count of this engine."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "gpus": torch.cuda.device_count()}


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


def join(*, rank: int, local_rank: int, world_size: int, address: str, port: int,
         backend: str, device: str, timeout_s: float, threads: int, ifname: str | None,
         channel: dict | None = None, generation: int = 0) -> dict:
    """Join the process group and put ``rank``, ``world_size``, ``device``... into the user namespace."""
    env = {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world_size,
           "MASTER_ADDR": address, "MASTER_PORT": port}
    os.environ.update({k: str(v) for k, v in env.items()})
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", ifname)
    torch.set_num_threads(threads)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend == "auto":
        backend = "cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    agent.stop()  # first: a command still on its way for the old group must not reach the new one
    guard.abort()  # what is left of an earlier group: abort, never destroy (that can block)
    store = _state.get("store") if rank == 0 else None
    if store is None:
        store = dist.TCPStore(address, port, is_master=False, timeout=timeout)
        _state["store"] = store
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                            device_id=dev if dev.type == "cuda" else None)
    _state.update(rank=rank, local_rank=local_rank, world_size=world_size, device=dev, generation=generation)
    guard.track_collectives()
    if channel:  # beacons up, commands down: the pool's side channel
        agent.start(channel, rank, generation)
    _user_namespace().update(rank=rank, local_rank=local_rank, world_size=world_size, device=dev, dist=dist)
    store_port = port if rank == 0 else None
    return {"rank": rank, "backend": dist.get_backend(),
            "gloo_ports": guard.listening_ports(exclude={store_port} if store_port else set())}


def identity() -> dict:
    """This engine's rank and device in the current group (rank 0 on the CPU before any join)."""
    return {"rank": _state.get("rank", 0), "device": _state.get("device", "cpu")}


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
