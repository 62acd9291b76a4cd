"""The kernel's CPU per trivial cell, thread by thread: ``%%distributed`` against ``%%px`` on one pool.

The scale sweep reads the kernel's CPU with ``getrusage`` over blocks of 10 cells: every thread of the
process, so whatever a background thread did meanwhile lands in a block, and the ratio swings between
sizes (1.07x at 16 ranks, 1.50x at 8 in one sweep). Here each thread's own clock
(``/proc/self/task/<tid>/schedstat``, nanoseconds) is read around blocks of ``block`` cells, the two sides
alternating ``rounds`` times on the same engines, ``settle`` s after the start: per thread the median ms
per cell, and the sum. The main thread is the cell path itself; ``Thread-1`` is ipyparallel's client I/O
loop, the same work on both sides.

    python -m bench.kernel_threads --n 8            # 8 ranks, 30 s settled, 4 rounds of 20 cells
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

from bench.common import cell, load_now, print_json, without_spare
from bench.scale import SETTLE_S, _threads

SIDES = {"ours": "%%distributed\nx = 1", "px": "%%px\nx = 1"}


@without_spare()
def run(n: int = 8, rounds: int = 4, block: int = 20, settle_s: float = SETTLE_S) -> dict:
    """Start an ``n``-rank pool in this process, measure, stop it."""
    from workbench import session as session_mod

    out: dict = {"n": n, "rounds": rounds, "block": block, "load_start": load_now()}
    cell(f"%dist start -n {n} --oversubscribe")()
    started = time.monotonic()
    try:
        s = session_mod.current()
        view = s.client[[r.engine_id for r in s.ranks]]
        view.block = True
        view.activate()
        sides = {name: cell(code) for name, code in SIDES.items()}
        for fn in sides.values():  # warm-up
            fn()
        time.sleep(max(0.0, started + settle_s - time.monotonic()))
        got: dict[str, list[dict]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, fn in sides.items():
                got[name].append(_block(fn, block))
        for name, blocks in got.items():
            out[name] = per_cell(blocks)
        ours, px = out["ours"]["total_ms"], out["px"]["total_ms"]
        out["ratio"] = round(ours / px, 2) if px else None
    finally:
        cell("%dist stop")()
    out["load_end"] = load_now()
    return out


def _block(fn, n: int) -> dict:
    """CPU ms per cell of each kernel thread (by its Python name) over ``n`` calls, and the wall ms."""
    me = os.getpid()
    t0, w0 = _threads([me]), time.perf_counter()
    for _ in range(n):
        fn()
    wall, t1 = time.perf_counter() - w0, _threads([me])
    names = {t.native_id: t.name for t in threading.enumerate()}
    used: dict[str, float] = {}
    for (_, tid), (comm, cpu) in t1.items():
        name = names.get(tid, comm)
        used[name] = used.get(name, 0.0) + (cpu - t0.get((me, tid), (comm, 0.0))[1]) / n * 1e3
    return {"wall_ms": wall / n * 1e3, "threads": used}


def per_cell(blocks: list[dict]) -> dict:
    """Medians over blocks: wall ms per cell, each thread's CPU ms per cell (busiest first), their sum.

    >>> per_cell([{"wall_ms": 20, "threads": {"MainThread": 2.0, "Thread-1": 4.0}},
    ...           {"wall_ms": 22, "threads": {"MainThread": 3.0}}])
    {'wall_ms': 21.0, 'threads': {'MainThread': 2.5, 'Thread-1': 2.0}, 'total_ms': 4.5}
    """
    names = {name for b in blocks for name in b["threads"]}
    threads = {name: round(statistics.median(b["threads"].get(name, 0.0) for b in blocks), 3)
               for name in names}
    threads = dict(sorted(((k, v) for k, v in threads.items() if v > 0), key=lambda kv: -kv[1]))
    return {"wall_ms": round(statistics.median(b["wall_ms"] for b in blocks), 2), "threads": threads,
            "total_ms": round(sum(threads.values()), 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--settle", type=float, default=SETTLE_S, help="seconds after the start: settled")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)
    print_json(run(args.n, args.rounds, args.block, args.settle), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
