"""Run the benchmarks side by side and write ``bench/results/*.json``, ``bench/results/RESULTS.md`` and the
Performance page's table (:mod:`bench.summary`; only a full run into ``bench/results``).

    make bench                                  # sets up .venv and bench/.venv-anchors, then this
    .venv/bin/python -m bench.run               # everything (about 10 minutes on 2 busy cores)
    .venv/bin/python -m bench.run --only cells,ready --quick --out /tmp/wb-bench

Numbers are medians with min and max; every comparison runs in the same process tree, in
alternating rounds, so a busy machine slows both sides alike. The load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench.common import ANCHOR_PINS, ANCHORS_PY, RESULTS, load_now, machine, versions

SECTIONS = ("cells", "ready", "training", "dashboard", "allreduce", "memory", "recovery", "elastic", "scale",
            "faults", "submesh", "goodput")
FULL = {
    "cells_runs": 200,
    "ready_reps": 3,
    "train_rounds": 3,
    "train_steps": {"mlp": 80, "gpt": 15},
    "per_cell_steps": 5,
    "dash_rounds": 6,  # a shared 2-core machine is noisy: more rounds, longer ones
    "dash_steps": 120,
    "ar_rounds": 3,
    "recovery_reps": 2,
    "elastic_reps": 3,
    "scale_sizes": (2, 4, 8, 16, 32, 64),
    "scale_rounds": 3,
    "scale_settle_s": 30.0,
    "fanout_sizes": (8, 32, 128),  # issue 42: hubs off (before) and on (after), alternating per size
    "fanout_rounds": 3,
    "fanout_settle_s": 10.0,
    "faults_ranks": 32,
    "faults_reps": 3,
    "faults_elastic_reps": 2,
    "submesh_reps": 5,
    "goodput_steps": 1500,  # about a minute without a fault, 4 ranks on 2 cores
    "goodput_every": (5.0, 2.0),
    "goodput_faults": 10_000,  # a kill every N s until 95 % of the steps
    "goodput_ranks": 4,
    "goodput_rounds": 2,  # a shared machine's load changes: each round its own fault-free run
}
QUICK = {
    "cells_runs": 4,
    "ready_reps": 1,
    "train_rounds": 1,
    "train_steps": {"mlp": 5, "gpt": 2},
    "per_cell_steps": 2,
    "dash_rounds": 2,
    "dash_steps": 5,
    "ar_rounds": 1,
    "recovery_reps": 1,
    "elastic_reps": 1,
    "scale_sizes": (2,),
    "scale_rounds": 1,
    "scale_settle_s": 2.0,
    "fanout_sizes": (2,),
    "fanout_rounds": 1,
    "fanout_settle_s": 1.0,
    "faults_ranks": 4,
    "faults_reps": 1,
    "faults_elastic_reps": 0,
    "submesh_reps": 1,
    "goodput_steps": 200,
    "goodput_every": (2.0,),
    "goodput_faults": 1,
    "goodput_ranks": 2,
    "goodput_rounds": 1,
}


def anchors_status() -> tuple[bool, str]:
    """Whether the anchors' environment can run, and why not."""
    if not ANCHORS_PY.exists():
        return False, f"not installed: {ANCHORS_PY.parent.parent} is missing (`make bench` creates it)"
    done = subprocess.run(
        [str(ANCHORS_PY), "-c", "import nbdistributed, accelerate, ipykernel"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        return False, "not installed: " + (done.stderr.strip().splitlines() or ["import failed"])[-1]
    return True, "ok"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated: {', '.join(SECTIONS)}")
    ap.add_argument("--quick", action="store_true", help="a few iterations of each (the smoke test)")
    ap.add_argument("--no-anchors", action="store_true", help="skip nbdistributed and accelerate")
    ap.add_argument("--no-kernels", action="store_true", help="skip the real-ipykernel cell path")
    ap.add_argument("--no-browser", action="store_true", help="skip the dashboard in JupyterLab + Chromium")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section {bad[0]!r}: choose from {', '.join(SECTIONS)}")
    p = QUICK if args.quick else FULL
    anchors, why = (False, "skipped (--no-anchors)") if args.no_anchors else anchors_status()
    print(f"anchors (nbdistributed, accelerate): {why}", flush=True)
    env = {
        "machine": machine(),
        "versions": {
            "workbench env": versions(),
            "anchors env": versions(ANCHORS_PY, ("torch", *ANCHOR_PINS, "ipykernel")) if anchors else why,
        },
        "anchors": why,
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []

    def section(name, fn):
        if name not in only:
            return
        print(f"== {name}", flush=True)
        t0 = time.time()
        load0 = load_now()
        try:
            data = fn()
        except Exception:
            traceback.print_exc()
            data = {"error": traceback.format_exc(limit=3)}
            failed.append(name)
        record = {
            "benchmark": name,
            **env,
            "load_average": {"start": load0, "end": load_now()},
            "seconds": round(time.time() - t0, 1),
            "params": {k: v for k, v in p.items()},
            "data": data,
        }
        (args.out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"   {time.time() - t0:.0f} s", flush=True)

    from bench import (
        cells,
        dashboard_overhead,
        elastic,
        fanout,
        faults_at_scale,
        goodput,
        ready,
        recovery,
        scale,
        submesh,
        training,
    )

    section(
        "cells",
        lambda: cells.run(
            runs=p["cells_runs"], block=min(25, p["cells_runs"]), anchors=anchors, kernels=not args.no_kernels
        ),
    )
    section("ready", lambda: ready.run(reps=p["ready_reps"], anchors=anchors))
    pool_sections = [s for s in ("training", "dashboard", "allreduce", "memory") if s in only]
    if pool_sections:
        pool = training.Pool()
        try:
            section("memory", lambda: training.memory(pool))
            section("allreduce", lambda: training.allreduce(pool, p["ar_rounds"]))
            section(
                "training",
                lambda: training.throughput(pool, p["train_rounds"], p["train_steps"], p["per_cell_steps"]),
            )
            section("dashboard", lambda: dashboard_overhead.run(pool, p["dash_rounds"], p["dash_steps"],
                                                                browser=not args.no_browser))
        finally:
            pool.stop()
    section("recovery", lambda: recovery.run(reps=p["recovery_reps"]))
    section("elastic", lambda: elastic.run(reps=p["elastic_reps"]))
    section("scale", lambda: {
        **scale.run(p["scale_sizes"], rounds=p["scale_rounds"], settle_s=p["scale_settle_s"]),
        "fanout": fanout.run(p["fanout_sizes"], rounds=p["fanout_rounds"], block=10,
                             settle_s=p["fanout_settle_s"]),
    })
    section("faults",
            lambda: faults_at_scale.run(p["faults_ranks"], p["faults_reps"], p["faults_elastic_reps"]))
    section("submesh", lambda: submesh.run(reps=p["submesh_reps"]))
    section("goodput", lambda: goodput.run(steps=p["goodput_steps"], every=p["goodput_every"],
                                           ranks=p["goodput_ranks"], faults=p["goodput_faults"],
                                           rounds=p["goodput_rounds"]))
    from bench.table import render

    table = render(args.out)
    (args.out / "RESULTS.md").write_text(table)
    print(table)
    if not args.quick and args.out.resolve() == RESULTS.resolve():
        from bench import summary

        if not summary.write_page(summary.render(args.out)):
            print(f"{summary.PAGE} has no bench:summary markers: its Performance table was not updated",
                  file=sys.stderr)
    if "scale" in only and args.out.resolve() == RESULTS.resolve():  # the sweep's tables, also from --only
        from bench import summary
        from bench.table import load, scale_table

        # under the Performance page's own heading
        tables = "\n".join(scale_table(load(args.out)["scale"])[2:])
        if not summary.write_page(tables, markers=summary.SCALE_MARKERS):
            print(f"{summary.PAGE} has no bench:scale markers: its scale tables were not updated",
                  file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
