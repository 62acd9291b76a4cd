"""Training throughput (DDP, 2 CPU ranks) driven from ``%%distributed`` vs ``torchrun``; all_reduce
bandwidth through the workbench vs raw gloo; engine memory. (The live dashboard: ``dashboard_overhead``.)

Everything in rounds that alternate the sides (and their order), on one pool started here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import BENCH, ROOT, reap, shell, summary

TORCHRUN = Path(sys.executable).with_name("torchrun")
RANK_ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "BENCH_THREADS": "1"}
SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 26]  # 1 KiB .. 64 MiB


class Pool:
    """A 2-rank pool driven through ``%%distributed`` in an IPython shell; ``bench/`` on the ranks' path."""

    def __init__(self):
        from IPython.utils.capture import capture_output

        from workbench import session as session_mod

        self.capture, self._sessions = capture_output, session_mod
        self.ip = shell()
        session_mod.use(None)  # a pool that another Pool drives stays its own: this one is new
        self.cell("%dist start -n 2")
        self.s = session_mod.current()
        self.cell(f"%%distributed\nimport sys\nsys.path.insert(0, {str(BENCH)!r})\nimport loop")

    def cell(self, code: str, check: bool = True) -> float:
        """Run a cell through the magic on this pool; its wall time in the kernel."""
        if getattr(self, "s", None) is not None:
            self._sessions.use(self.s)  # another Session started since (recovery) took the magics over
        with self.capture() as cap:
            t0 = time.perf_counter()
            result = self.ip.run_cell(code if code.startswith("%") else f"%%distributed\n{code}")
            seconds = time.perf_counter() - t0
        if check and not result.success:
            raise RuntimeError(f"cell failed: {code[:80]!r}: {result.error_in_exec}\n{cap.stdout[-1500:]}")
        return seconds

    def stop(self) -> None:
        self.s.stop()


def _torchrun(args: list[str], timeout: float = 300, nproc: int = 2, env: dict | None = None) -> dict:
    out = Path(tempfile.mkdtemp(prefix="wb-bench-")) / "out.json"
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc), str(BENCH / "rank_main.py"), *args]
    return _launch([[*cmd, str(out)]], out, timeout, [env or {}])


def _raw_pair(args: list[str], timeout: float = 300) -> dict:
    """Two plain processes joined by gloo through a TCPStore: no launcher, no workbench."""
    out = Path(tempfile.mkdtemp(prefix="wb-bench-")) / "out.json"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmds = [[sys.executable, str(BENCH / "rank_main.py"), *args, str(out)] for _ in range(2)]
    envs = [
        {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        for r in range(2)
    ]
    return _launch(cmds, out, timeout, envs)


def _launch(cmds, out: Path, timeout: float, envs=None) -> dict:
    procs = [
        subprocess.Popen(
            c,
            env={**os.environ, **RANK_ENV, **(envs[i] if envs else {})},
            cwd=str(ROOT),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, c in enumerate(cmds)
    ]
    tree: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            for p in procs:
                try:
                    for c in psutil.Process(p.pid).children(recursive=True):
                        tree.setdefault(c.pid, c)
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.05)
    finally:
        for p in procs:
            try:
                tree.setdefault(p.pid, psutil.Process(p.pid))
            except psutil.NoSuchProcess:
                pass
        reap(list(tree.values()))
    if not out.exists():
        err = procs[0].stderr.read()[-1500:] if procs[0].stderr else ""
        raise RuntimeError(f"{cmds[0][:3]} wrote no result: {err}")
    data = json.loads(out.read_text())
    out.unlink()
    out.parent.rmdir()
    return data


def throughput(pool: Pool, rounds: int, steps: dict[str, int], per_cell_steps: int) -> dict:
    """Samples/s of the same loop: in one ``%%distributed`` cell, one step per cell, and under torchrun."""
    out: dict = {}
    for model, n in steps.items():
        pool.cell(f"trainer_{model} = loop.build({model!r})")
        rates: dict[str, list[float]] = {
            "workbench %%distributed (one cell)": [],
            "torchrun": [],
            "workbench, one step per cell (end to end)": [],
        }
        cell_rates = []
        for i in range(rounds):
            order = ["ours", "torchrun"] if i % 2 == 0 else ["torchrun", "ours"]
            for side in order:
                if side == "ours":
                    wall = pool.cell(f"r = loop.measure(trainer_{model}, steps={n})")
                    r = pool.s.pull("r", rank=0)
                    rates["workbench %%distributed (one cell)"].append(r["samples_per_s"])
                    cell_rates.append(r["samples_per_s"] * r["seconds"] / wall)  # includes cell overhead
                else:
                    rates["torchrun"].append(_torchrun(["train", model, str(n)])["samples_per_s"])
            # the interactive way: one step per cell, timed end to end in the kernel
            samples_per_step = pool.s.pull(f"trainer_{model}.history[-1].samples", rank=0)
            t0 = time.perf_counter()
            for _ in range(per_cell_steps):
                pool.cell(f"trainer_{model}.run(steps=1)")
            rates["workbench, one step per cell (end to end)"].append(
                per_cell_steps * samples_per_step / (time.perf_counter() - t0)
            )
        pool.cell(f"del trainer_{model}")
        res = {k: summary(v, 1, 1) for k, v in rates.items()}
        res["workbench %%distributed (one cell, end to end)"] = summary(cell_rates, 1, 1)
        tr = res["torchrun"]["median"]
        res["ratio_to_torchrun"] = {
            k: round(v["median"] / tr, 3)
            for k, v in res.items()
            if isinstance(v, dict) and "median" in v and tr
        }
        res["steps_per_round"] = n
        out[model] = res
    return out


def allreduce(pool: Pool, rounds: int) -> dict:
    """Algorithm bandwidth of all_reduce (bytes / seconds per op) from 1 KiB to 64 MiB."""
    per: dict[str, dict[int, list[float]]] = {
        "workbench": {n: [] for n in SIZES},
        "raw gloo": {n: [] for n in SIZES},
    }
    for i in range(rounds):
        for side in ["workbench", "raw gloo"] if i % 2 == 0 else ["raw gloo", "workbench"]:
            if side == "workbench":
                pool.cell(f"ar = loop.allreduce_sweep({SIZES!r})")
                got = {int(k): v for k, v in pool.s.pull("ar", rank=0).items()}
            else:
                got = {
                    int(k): v
                    for k, v in _raw_pair(["allreduce", ",".join(map(str, SIZES))])["seconds"].items()
                }
            for n in SIZES:
                per[side][n].append(got[n])
    out = {}
    for n in SIZES:
        # 6 digits: 1 KiB takes ~1 ms on a loaded machine, 0.001 GB/s, which 3 digits round to 0
        row = {side: summary([n / t / 1e9 for t in per[side][n]], 1, 6) for side in per}
        row["latency_us"] = {
            side: round(sorted(per[side][n])[len(per[side][n]) // 2] * 1e6, 1) for side in per
        }
        rg = row["raw gloo"]["median"]
        row["ratio_to_raw"] = round(row["workbench"]["median"] / rg, 3) if rg else None
        out[_size(n)] = row
    return {"unit": "GB/s (algorithm bandwidth)", "sizes": out}


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _mem(p: psutil.Process) -> dict:
    m = p.memory_full_info()
    return {
        "rss_mib": round(m.rss / 2**20, 1),
        "uss_mib": round(m.uss / 2**20, 1),
        "pss_mib": round(getattr(m, "pss", 0) / 2**20, 1),
    }


def memory(pool: Pool) -> dict:
    """Memory of each engine (torch loaded, group formed, metrics on), of what a pool runs besides them,
    and of a bare ``import torch`` and a torchrun worker, measured the same way.

    A forked engine shares the pages its zygote loaded (torch, the engine), which its USS leaves out: the
    honest figure per rank is the pool's PSS (engines and zygote, every shared page split between the
    processes that map it) over the ranks.
    """
    pool.cell("import torch\n_t = torch.ones(1)\ndist.all_reduce(_t)")
    engines = [psutil.Process(r.pid) for r in pool.s.ranks]
    zygote = pool.s.pool.zygote
    shared = [psutil.Process(zygote.pid)] if zygote is not None else []
    per_engine = [_mem(p) for p in engines]
    pss = sum(m["pss_mib"] for m in per_engine) + sum(_mem(p)["pss_mib"] for p in shared)
    code = (
        "import json, psutil, torch\nm = psutil.Process().memory_full_info()\n"
        "print(json.dumps({'rss_mib': round(m.rss / 2**20, 1), 'uss_mib': round(m.uss / 2**20, 1), "
        "'pss_mib': round(getattr(m, 'pss', 0) / 2**20, 1)}))"
    )
    bare = json.loads(
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **RANK_ENV},
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    return {
        "workbench engine (each rank)": per_engine,
        "helper processes per engine": max(len(p.children()) for p in engines),
        "zygote (one per pool)": _mem(shared[0]) if shared else None,
        "pool pss per rank": round(pss / len(engines), 1),
        "bare python + import torch": bare,
        "torchrun worker (rank 0)": _torchrun(["memory"]),
        "ratio_rss": round(per_engine[0]["rss_mib"] / bare["rss_mib"], 2),
    }
