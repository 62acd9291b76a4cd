"""How long a SIGKILLed kernel's pool lives on: from the kill to the last process of the pool gone.

    .venv/bin/python -m bench.lease --reps 5

Each round starts a real kernel (jupyter_client), a 2-rank pool in it, SIGKILLs the kernel and polls
every 10 ms until no process of the pool runs (its lease ends them). Prints median (min-max) and the
load average.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time

import psutil
from jupyter_client.manager import start_new_kernel

from workbench.pool.records.state import wait_gone

START = """
%load_ext workbench
%dist start -n 2 --timeout 120
import json, workbench
print("PIDS", json.dumps(workbench.current().pids()))
"""


def one_round() -> float:
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        out = []
        reply = kc.execute_interactive(START, timeout=180,
                                       output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", "".join(out)
        procs = [psutil.Process(pid) for pid in json.loads("".join(out).split("PIDS", 1)[1].splitlines()[0])]
        kc.stop_channels()
        t0 = time.monotonic()
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        left = wait_gone(procs, 60)  # polls every 10 ms
        seconds = time.monotonic() - t0
        for proc in left:  # never leave them running, also when the lease failed
            proc.kill()
        assert not left, f"the pool outlived its kernel by 60 s: {left}"
        return seconds
    finally:
        km.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    times = [one_round() for _ in range(args.reps)]
    print(f"kernel SIGKILL -> pool gone: median {statistics.median(times):.2f} s "
          f"({min(times):.2f}-{max(times):.2f}), {args.reps} rounds, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
