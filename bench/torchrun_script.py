"""A torchrun script, unchanged: under ``torchrun --nproc-per-node 2`` and in a pool.

Times, each from the kernel: torchrun's whole run (start-up included, every time); "I have a script" to
"it runs in the pool" (a fresh ``Session.start()`` plus the first ``run_script``); a rerun in the warm pool.
The script is the nanoGPT-style loop of the tests (``tests/torchrun/scripts/nanogpt_style.py``).

    python -m bench.torchrun_script            # writes bench/results/torchrun_script.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, summary, write_json

SCRIPT = ROOT / "tests" / "torchrun" / "scripts" / "nanogpt_style.py"
ARGS = ["--max_iters=4"]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def torchrun_once(cwd: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_NUM_THREADS")}
    t0 = time.perf_counter()
    subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), *ARGS], cwd=cwd,
                   env=env, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - t0


def run(reps: int = 3) -> dict:
    from workbench import Session

    work = tempfile.mkdtemp(prefix="wb-bench-torchrun-")
    torchrun_s = [torchrun_once(work) for _ in range(reps)]
    t0 = time.perf_counter()
    s = Session(n=2, timeout=120).start()
    try:
        started = time.perf_counter()
        s.run_script(str(SCRIPT), ARGS)
        first = time.perf_counter()
        reruns = []
        for _ in range(reps):
            t = time.perf_counter()
            s.run_script(str(SCRIPT), ARGS)
            reruns.append(time.perf_counter() - t)
    finally:
        s.stop()
    return {
        "script": str(SCRIPT.relative_to(ROOT)), "args": ARGS,
        "torchrun_s": summary(torchrun_s, 1, 2),
        "pool_start_s": round(started - t0, 2),
        "script_to_running_in_pool_s": round(first - t0, 2),
        "first_run_in_pool_s": round(first - started, 2),
        "rerun_in_pool_s": summary(reruns, 1, 2),
        "load_average": os.getloadavg()[0],
    }


if __name__ == "__main__":
    result = run()
    path = write_json("torchrun_script", result)
    print(json.dumps(result, indent=1))
    print(f"written to {path}")
