"""How long ``%dist stacks`` takes: every rank's Python stacks, asked of all ranks at once.

Two moments: an idle pool, and a pool whose ranks wait in an all_reduce for one rank that holds back
(the main threads blocked in gloo: only the agents can answer). Median, min and max over ``--reps``.

    .venv/bin/python -m bench.stacks --ranks 32 --reps 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

HELD = """\
import os, time, torch
t = torch.ones(1)
while rank == 1 and not os.path.exists({go!r}):
    time.sleep(0.02)
dist.all_reduce(t)
"""


def _times(session, reps: int, expect_groups: int | None = None) -> dict:
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        found = session.stacks()
        seconds.append(time.perf_counter() - t0)
        assert not found.missing, found.format()[:2000]
        assert expect_groups is None or len(found.groups) == expect_groups, found.format()[:2000]
    return {"median_s": round(statistics.median(seconds), 4), "min_s": round(min(seconds), 4),
            "max_s": round(max(seconds), 4), "reps": reps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    from workbench import Session

    s = Session(n=args.ranks, timeout=300, oversubscribe=args.ranks > 8).start()
    go = os.path.join(tempfile.mkdtemp(prefix="wb-bench-stacks-"), "go")
    try:
        idle = _times(s, args.reps)
        handle = s.submit(HELD.format(go=go))
        deadline = time.monotonic() + 60
        while [g.ranks for g in s.stacks().groups][:1] != [[1]] and time.monotonic() < deadline:
            time.sleep(0.2)  # until the others wait in the all_reduce
        held = _times(s, args.reps, expect_groups=2)
        open(go, "w").close()
        handle.wait(60)
    finally:
        s.stop()
    print(json.dumps({"ranks": args.ranks, "idle": idle, "in_collective": held,
                      "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
