"""The engine half of the preflight check (``%dist check``): what every rank measures, at once.

:func:`probe` runs on every rank inside the process group (a collective: the kernel calls it in a watched
cell through :func:`workbench.remote.preflight_probe`); the kernel half, :mod:`workbench.preflight`,
turns the answers into the table. Imports torch only where it runs.
"""

from __future__ import annotations

import statistics
import time


def _time_all_reduce(tensor, iters: int, group=None) -> float:
    """Seconds per all_reduce of ``tensor`` (median of ``iters``, after a warm-up), in step on all ranks."""
    import torch
    import torch.distributed as dist

    for _ in range(2):
        dist.all_reduce(tensor, group=group)
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        t0 = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """all_reduce bus bandwidth in GB/s (the nccl-tests convention: ``algbw * 2 (n - 1) / n``).

    >>> round(bus_bandwidth(1_000_000_000, 1.0, 2), 3)
    1.0
    >>> bus_bandwidth(100, 0.0, 1)
    0.0
    """
    if world < 2 or seconds <= 0:
        return 0.0
    return nbytes / seconds / 1e9 * 2 * (world - 1) / world


def versions() -> dict:
    """The versions this process runs, for the skew check (engine side: imports torch)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda or "-", "nccl": "-"}
    if torch.cuda.is_available():
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    for name in ("ipyparallel", "numpy"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            out[name] = "-"
    try:
        out["workbench"] = version("distributed-workbench")
    except PackageNotFoundError:  # run from a source tree that was never installed
        out["workbench"] = "-"
    return out


def probe(device, size_mb: float = 4.0, iters: int = 10) -> dict:
    """Engine side, on every rank at once (inside the process group): device, all_reduce, timings.

    Collective: every rank must call it together (``%dist check`` does).
    """
    import socket

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(device)
    out: dict = {"rank": rank, "host": socket.gethostname(), "device": str(dev), "versions": versions()}
    try:
        if dev.type == "cuda":
            ok = torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()
            out["device_name"] = torch.cuda.get_device_name(dev) if ok else "not visible"
        else:
            ok = True
            out["device_name"] = "cpu"
        (torch.ones(2, device=dev) * 2).sum().item()  # the device really runs work
        out["device_ok"] = bool(ok)
    except Exception as exc:  # a device that is listed but broken
        out["device_ok"], out["device_error"] = False, f"{type(exc).__name__}: {exc}"
    # Every rank must run the collectives on the same kind of device (a CPU tensor on gloo and a CUDA tensor
    # on NCCL never meet: both would hang), so the ranks first agree, over the group's CPU backend.
    every_ok = torch.tensor([float(out["device_ok"])])
    dist.all_reduce(every_ok, op=dist.ReduceOp.MIN)
    if not every_ok.item():
        dev = torch.device("cpu")  # some rank's device is broken: every rank measures on the CPU
    out["collective_device"] = str(dev)

    t = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    out["all_reduce_ok"] = bool(torch.allclose(t.cpu(), torch.full((4,), expected)))

    small = torch.ones(1, device=dev)
    out["latency_s"] = _time_all_reduce(small, iters)
    numel = max(1, int(size_mb * 2**20) // 4)
    big = torch.ones(numel, dtype=torch.float32, device=dev)
    seconds = _time_all_reduce(big, max(3, iters // 2))
    out["bytes"], out["bandwidth_s"] = numel * 4, seconds
    out["busbw_gbps"] = bus_bandwidth(numel * 4, seconds, world)

    # Between nodes: one rank per host, so the figure is the network's, not shared memory's.
    hosts: list = [None] * world
    dist.all_gather_object(hosts, out["host"])
    leaders = sorted({hosts.index(h) for h in hosts})
    out["nodes"] = len(leaders)
    if len(leaders) > 1:
        group = dist.new_group(ranks=leaders)  # every rank takes part in creating it
        if rank in leaders:
            s_lat = _time_all_reduce(torch.ones(1, device=dev), iters, group=group)
            s_bw = _time_all_reduce(big, max(3, iters // 2), group=group)
            out["internode"] = {"ranks": leaders, "latency_s": s_lat,
                                "busbw_gbps": bus_bandwidth(numel * 4, s_bw, len(leaders))}
        dist.barrier()
        dist.destroy_process_group(group)
    return out
