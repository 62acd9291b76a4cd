"""The scale sweep: what a pool costs at N = 2, 4, 8, 16, 32 ranks, next to ipyparallel's ``%%px``.

Each N runs in a fresh process (an IPython shell, as :mod:`bench.cells`), started cold
(``WORKBENCH_PREWARM=0``: no spare zygote) with ``--oversubscribe``:

- ``ready_s``: ``%dist start -n N`` until every rank is in the group;
- first cells: the 10 trivial cells (``x = 1``) right after the start, and the pool's CPU meanwhile;
- idle: the pool's CPU (zygote, controller and its children, engines; ``/proc`` counters) over a settled
  idle stretch, and by thread name (``idle_threads``: what wakes an idle pool, from each thread's
  ``/proc/<pid>/task/<tid>/schedstat``);
- settled cells, in alternating blocks on the same engines: ``%%distributed`` vs ``%%px`` for
  ``x = 1`` and for ``print(rank)``, ``Session.pull`` vs ``DirectView.pull``; wall time per cell (median),
  the kernel's CPU per cell (``getrusage``) and the pool's CPU per cell, per block;
- the kernel's resident memory at the end;
- then, in the same process, a bare ``ipyparallel.Cluster(n=N)`` (what a user of ``%%px`` starts): its
  ready time (every engine registered; it forms no process group), its first 10 ``%%px`` cells and its
  idle CPU (``IPP_SETTLE_S`` after its start), beside ours (``ipp_ready_s``, ``ipp_first_cells_ms``,
  ``ipp_idle_pool_cpu_pct``).

64 ranks run only where the machine has the memory (``MEMORY_PER_RANK_MIB`` a rank, one pool at a time).

    python -m bench.scale                       # N = 2, 4, 8, 16, 32, 64
    python -m bench.scale --n 2,8,32 --out /tmp/scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import psutil

from bench.common import ROOT, cell, load_now, print_json, run_json, summary, without_spare

SIZES = (2, 4, 8, 16, 32, 64)
MEMORY_PER_RANK_MIB = 150  # a rank's share of its pool (PSS 142 MiB with its zygote); the bare ipyparallel
# engines (~60 MiB each) start only after our pool stopped
FIRST_CELLS = 10
SETTLE_S = 30.0  # "settled": this long after the start (the measure)
IDLE_S = 6.0
IPP_SETTLE_S = 10.0  # ipyparallel's engines do no deferred work after registering: settled sooner


def _cpu(pids: list[int]) -> float:
    """utime + stime of ``pids`` in seconds (children already reaped not counted)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def _threads(pids) -> dict[tuple[int, int], tuple[str, float]]:
    """(pid, tid) -> (thread name, seconds on a CPU) for every thread of ``pids`` (nanoseconds from
    ``schedstat``: a tick of ``stat`` is too coarse for a thread that wakes for 30 us). A process's main
    thread is named ``"<name> main"``: Python's threads carry the process's name."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    name = f"{name} main" if int(tid) == pid else name  # its other threads share its name
                    out[(pid, int(tid))] = (name, int(f.read().split()[0]) / 1e9)
            except (OSError, IndexError, ValueError):
                pass  # the thread ended
    return out


def by_thread(before: dict, after: dict, seconds: float, top: int = 6) -> dict[str, dict]:
    """CPU between two :func:`_threads` samples as % of a core per thread name, busiest first; the rest
    summed as ``"other"``.

    >>> by_thread({(1, 1): ("gloo", 1.0), (1, 2): ("zmq", 0.5)},
    ...           {(1, 1): ("gloo", 1.06), (1, 2): ("zmq", 0.51), (2, 2): ("gloo", 0.04)}, 10.0, top=1)
    {'gloo': {'threads': 2, 'pct': 1.0}, 'other': {'threads': 1, 'pct': 0.1}}
    """
    used: dict[str, list] = {}
    for key, (name, cpu) in after.items():
        entry = used.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += cpu - before.get(key, (name, 0.0))[1]
    ranked = sorted(used.items(), key=lambda kv: -kv[1][1])
    out = {name: {"threads": n, "pct": round(cpu / seconds * 100, 2)} for name, (n, cpu) in ranked[:top]}
    if rest := ranked[top:]:
        out["other"] = {"threads": sum(n for _, (n, _) in rest),
                        "pct": round(sum(cpu for _, (_, cpu) in rest) / seconds * 100, 2)}
    return out


def _idle_pct(before: dict, after: dict, seconds: float) -> float:
    """The CPU of every thread between two :func:`_threads` samples, as % of a core."""
    used = sum(cpu - before.get(key, (name, 0.0))[1] for key, (name, cpu) in after.items())
    return round(used / seconds * 100, 2)


def _kernel_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _with_descendants(pids) -> list[int]:
    """``pids`` and their child processes (the controller's schedulers and heart monitor are its children)."""
    out = []
    for pid in pids:
        out.append(pid)
        try:
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return sorted(set(out))


def _block(fn, n: int, pool: list[int]) -> dict:
    """Run ``fn`` ``n`` times: wall time of each, kernel and pool CPU per call over the block."""
    walls = []
    k0, p0 = _kernel_cpu(), _cpu(pool)
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return {"walls": walls, "kernel": (_kernel_cpu() - k0) / n, "pool": (_cpu(pool) - p0) / n}


@without_spare()
def one(n: int, rounds: int, block: int, settle_s: float = SETTLE_S) -> dict:
    """Measure one pool of ``n`` ranks in this process (settled: ``settle_s`` after its start)."""
    from workbench import session as session_mod

    out: dict = {"n": n, "load_start": load_now()}
    t0 = time.perf_counter()
    cell(f"%dist start -n {n} --oversubscribe")()
    out["ready_s"] = round(time.perf_counter() - t0, 3)
    started = time.monotonic()
    s = session_mod.current()
    try:
        pool = _with_descendants(p for p in s.pids() if p != getattr(s.pool._lease, "pid", None))
        ours = cell("%%distributed\nx = 1")
        first = _block(ours, FIRST_CELLS, pool)
        out["first_cells_ms"] = summary(first["walls"], 1e3, 1)
        out["first_cells_pool_cpu_ms"] = round(first["pool"] * 1e3, 1)
        out["first_cells_kernel_cpu_ms"] = round(first["kernel"] * 1e3, 1)
        view = s.client[[r.engine_id for r in s.ranks]]
        view.block = True
        view.activate()
        while time.monotonic() - started < settle_s:
            time.sleep(0.5)
        k0, t0, w0 = _kernel_cpu(), _threads(pool), time.monotonic()
        time.sleep(IDLE_S)
        t1, idle_s = _threads(pool), time.monotonic() - w0
        out["idle_pool_cpu_pct"] = _idle_pct(t0, t1, idle_s)
        out["idle_kernel_cpu_pct"] = round((_kernel_cpu() - k0) / idle_s * 100, 2)
        out["idle_threads"] = by_thread(t0, t1, idle_s)
        variants = {
            "trivial": (ours, cell("%%px\nx = 1")),
            "print": (cell("%%distributed\nprint(rank)"), cell("%%px\nprint(1)")),
            "pull": (lambda: s.pull("x"), lambda: view.pull("x", block=True)),
        }
        for fn_ours, fn_px in variants.values():  # warm-up
            fn_ours()
            fn_px()
        got = {k: {"ours": [], "ipp": []} for k in variants}
        for _ in range(rounds):
            for name, (fn_ours, fn_px) in variants.items():
                got[name]["ours"].append(_block(fn_ours, block, pool))
                got[name]["ipp"].append(_block(fn_px, block, pool))
        for name, sides in got.items():
            for side, blocks in sides.items():
                out[f"{name}_{side}"] = {
                    "ms": summary([w for b in blocks for w in b["walls"]], 1e3, 2),
                    "kernel_cpu_ms": round(statistics.median(b["kernel"] for b in blocks) * 1e3, 2),
                    "pool_cpu_ms": round(statistics.median(b["pool"] for b in blocks) * 1e3, 2),
                }
        out["kernel_rss_mib"] = round(_rss() / 2**20, 1)
        out["kernel_maxrss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    finally:
        cell("%dist stop")()
    out.update(_bare_ipyparallel(n))
    out["load_end"] = load_now()
    return out


def _bare_ipyparallel(n: int) -> dict:
    """A plain ``ipyparallel.Cluster`` of ``n`` engines: ready, then its first cells through ``%%px``."""
    import ipyparallel as ipp

    t0 = time.perf_counter()
    # ipyparallel's own wait is 60 s whatever N: at 64 engines on 2 loaded cores that is not enough
    cluster = ipp.Cluster(n=n, engine_timeout=120 + 4 * n)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        rc = cluster.start_and_connect_sync()
        ready = time.perf_counter() - t0
        view = rc[:]
        view.block = True
        view.activate()
        first = _block(cell("%%px\nx = 1"), FIRST_CELLS, [])
        pool = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
        time.sleep(max(0.0, t0 + IPP_SETTLE_S - time.perf_counter()))
        before_idle, w0 = _threads(pool), time.monotonic()
        time.sleep(IDLE_S)
        idle = _idle_pct(before_idle, _threads(pool), time.monotonic() - w0)
        rc.close()
    except Exception as exc:  # the anchor failed: our side's figures stand, the table says why
        return {"ipp_error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        cluster.stop_cluster_sync()
        psutil.wait_procs(started, timeout=30)  # ipyparallel's stop signals them; they end meanwhile
    return {"ipp_ready_s": round(ready, 3), "ipp_first_cells_ms": summary(first["walls"], 1e3, 1),
            "ipp_first_cells_kernel_cpu_ms": round(first["kernel"] * 1e3, 1),
            "ipp_idle_pool_cpu_pct": idle}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(sizes=SIZES, rounds: int = 3, block: int = 10, settle_s: float = SETTLE_S) -> dict:
    """Every size in a fresh process, smallest first (``settle_s``: a smoke test's shorter settling)."""
    out = {}
    for n in sizes:
        need = n * MEMORY_PER_RANK_MIB * 2**20
        if n >= 64 and psutil.virtual_memory().available < need:
            out[str(n)] = {"skipped": f"{psutil.virtual_memory().available / 2**30:.1f} GiB available, "
                                      f"{need / 2**30:.1f} GiB wanted"}
            continue
        print(f"   scale: {n} ranks", flush=True)
        out[str(n)] = run_json(
            [sys.executable, "-m", "bench.scale", "--one", str(n), "--rounds", str(rounds),
             "--block", str(block), "--settle", str(settle_s)],
            timeout=300 + 10 * n,
            env={"GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))})
    return {"sizes": out, "unit": "ms"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default=",".join(map(str, SIZES)), help="comma-separated pool sizes")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one size, in this process
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--settle", type=float, default=SETTLE_S, help="seconds after the start: settled")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.rounds, args.block, args.settle)), flush=True)
        return 0
    data = run([int(x) for x in args.n.split(",")], args.rounds, args.block, args.settle)
    print_json(data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
