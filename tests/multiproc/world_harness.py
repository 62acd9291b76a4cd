"""Run a function on every rank of a small gloo world of forked processes.

Forking (not spawning) keeps a world cheap on 2 cores: torch is already imported. The
parent never runs torch ops of its own, so no thread pool is forked mid-use. Every
process is joined or killed before ``run_world`` returns.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, fn, args, results):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=30))
        torch.manual_seed(0)
        results.put((rank, "ok", fn(rank, world_size, *args)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(fn, world_size: int, *args, timeout: float = 60.0) -> list:
    """``fn(rank, world_size, *args)`` on each rank; the return values in rank order."""
    ctx = mp.get_context("fork")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    out: dict[int, tuple] = {}
    try:
        while len(out) < world_size and time.monotonic() < deadline:
            while not results.empty():
                rank, kind, value = results.get()
                out[rank] = (kind, value)
            errors = [(r, v) for r, (k, v) in sorted(out.items()) if k == "error"]
            if errors:
                raise AssertionError(f"rank {errors[0][0]} failed:\n{errors[0][1]}")
            if len(out) < world_size and any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                time.sleep(0.2)
                if results.empty():
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                    raise AssertionError(f"rank(s) {dead} died without a result (exit codes "
                                         f"{[procs[r].exitcode for r in dead]}).")
            time.sleep(0.02)
        if len(out) < world_size:
            missing = sorted(set(range(world_size)) - set(out))
            raise AssertionError(f"ranks {missing} did not finish within {timeout:g} s (hang?).")
        for p in procs:
            p.join(5)
        return [out[r][1] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
