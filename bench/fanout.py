"""Fan-out per host before and after, side by side in one run (issue 42): the kernel's CPU per cell at N ranks
with requests once a rank and replies per rank (``WORKBENCH_FANOUT=0``: as before issue 42) and with hubs
(requests once, replies merged per host).

Each (N, side) runs in a fresh IPython shell (as :mod:`bench.scale`), sides alternating per N; the cells are
``%%distributed x = 1``, ``%%distributed print(rank)`` and ``Session.pull("x")``, ``block`` of each in a row,
``rounds`` times; the kernel's CPU (``getrusage``) per cell and the wall time per cell, medians.

    python -m bench.fanout --n 8,32,128 --out /tmp/fanout.json

``--compare DIR``: instead of hubs off and on, hubs on in the tree at DIR (a checkout of an earlier commit:
``git worktree add DIR <commit>``) and in this tree, alternating per N: a change's before and after.

    python -m bench.fanout --n 8,128 --compare /tmp/base --out /tmp/fanout.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import psutil

from bench.common import ROOT, cell, load_now, print_json, run_json, without_spare
from bench.scale import _block

SIDES = {"before": "0", "after": "1"}  # WORKBENCH_FANOUT
SIZES = (8, 32, 128)
MEMORY_PER_RANK_MIB = 64  # 128 ranks took about 6 GB here (forked engines share their pages)


@without_spare()
def one(n: int, rounds: int, block: int, settle_s: float) -> dict:
    from workbench import session as session_mod

    out: dict = {"n": n, "fanout": os.environ.get("WORKBENCH_FANOUT", "1"), "load_start": load_now()}
    t0 = time.perf_counter()
    cell(f"%dist start -n {n} --oversubscribe")()
    out["ready_s"] = round(time.perf_counter() - t0, 3)
    s = session_mod.current()
    try:
        out["hubs"] = len(s.hubs() or {})
        variants = {"trivial": cell("%%distributed\nx = 1"), "print": cell("%%distributed\nprint(rank)"),
                    "pull": lambda: s.pull("x")}
        time.sleep(settle_s)
        for fn in variants.values():  # warm-up
            fn()
        got: dict[str, list] = {k: [] for k in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                got[name].append(_block(fn, block, []))
        for name, blocks in got.items():
            walls = [w for b in blocks for w in b["walls"]]
            out[name] = {"wall_ms": round(statistics.median(walls) * 1e3, 2),
                         "kernel_cpu_ms": round(statistics.median(b["kernel"] for b in blocks) * 1e3, 2)}
            out[name]["kernel_cpu_us_per_rank"] = round(out[name]["kernel_cpu_ms"] * 1e3 / n, 1)
    finally:
        cell("%dist stop")()
    out["load_end"] = load_now()
    return out


def run(sizes, rounds: int, block: int, settle_s: float, compare: str | None = None) -> dict:
    results = []
    sides = {"before": ("1", compare), "after": ("1", str(ROOT))} if compare else \
        {side: (flag, str(ROOT)) for side, flag in SIDES.items()}
    for n in sizes:
        need = n * MEMORY_PER_RANK_MIB * 2**20
        if psutil.virtual_memory().available < need:
            have = psutil.virtual_memory().available
            why = f"{have / 2**30:.1f} GiB available, {need / 2**30:.1f} GiB wanted"
            results += [{"n": n, "side": side, "skipped": why} for side in sides]
            continue
        for side, (flag, tree) in sides.items():
            env = {**os.environ, "WORKBENCH_FANOUT": flag, "PYTHONPATH": tree}
            got = run_json([sys.executable, "-m", "bench.fanout", "--one", str(n), "--rounds", str(rounds),
                            "--block", str(block), "--settle", str(settle_s)], timeout=900, env=env, cwd=tree)
            got["side"] = side
            results.append(got)
            print(table([got]), file=sys.stderr, flush=True)
    return {"runs": results, "table": table(results)}


def table(runs: list[dict]) -> str:
    """A row per (N, side); then, per side, the kernel's CPU per cell at the largest N against the smallest
    (the issue's measure: at most 2x)."""
    rows = ["| N | side | hubs | ready s | trivial wall / kernel CPU ms | print(rank) | pull | "
            "kernel CPU us/rank (trivial) | load |", "|---" * 9 + "|"]
    for r in runs:
        if "skipped" in r:
            rows.append(f"| {r.get('n')} | {r.get('side')} | skipped: {r['skipped']} |")
            continue
        if "trivial" not in r:
            rows.append(f"| {r.get('n')} | {r.get('side')} | error: {str(r)[:200]} |")
            continue
        cells = " | ".join(f"{r[k]['wall_ms']} / {r[k]['kernel_cpu_ms']}"
                           for k in ("trivial", "print", "pull"))
        load = f"{r['load_start'][0]:.1f}-{r['load_end'][0]:.1f}"
        rows.append(f"| {r['n']} | {r['side']} | {r['hubs']} | {r['ready_s']} | {cells} | "
                    f"{r['trivial']['kernel_cpu_us_per_rank']} | {load} |")
    return "\n".join(rows + flatness(runs))


def flatness(runs: list[dict]) -> list[str]:
    """Per side: the kernel's CPU per cell at the largest N measured over that at the smallest."""
    out = []
    for side in dict.fromkeys(r.get("side") for r in runs):
        done = sorted((r for r in runs if r.get("side") == side and "trivial" in r), key=lambda r: r["n"])
        if len(done) < 2:
            continue
        small, large = done[0], done[-1]
        ratios = ", ".join(f"{k} {large[k]['kernel_cpu_ms'] / small[k]['kernel_cpu_ms']:.1f}x"
                           for k in ("trivial", "print", "pull") if small[k]["kernel_cpu_ms"])
        out.append(f"\n{side}: kernel CPU per cell at {large['n']} ranks / at {small['n']}: {ratios}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default=",".join(map(str, SIZES)))
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--compare", help="a checkout of an earlier commit: its hubs against this tree's")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.one:
        import json

        print(json.dumps(one(args.one, args.rounds, args.block, args.settle)), flush=True)
        return 0
    data = run([int(x) for x in args.n.split(",")], args.rounds, args.block, args.settle, args.compare)
    print(data["table"])
    print_json(data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
