"""Sub-meshes (issue 43, docs/submeshes.md): what a split and a join cost, beside a re-form of the group (the
abort and form a cell does after a fault), and how two cells on disjoint sub-meshes overlap.

On one 4-rank local pool (gloo), in alternating rounds: ``Session.split([2, 2])``, ``Session.join()``,
``Rooms.reform()`` and ``Session.split([1, 1, 1, 1])``; then, split 2 + 2, a cell of ``steps`` steps (an
``all_reduce`` and a sleep of ``sleep_s``: steps that do not compete for the cores) on one sub-mesh alone,
and the same cell on both sub-meshes at once. The ratio both/alone is about 1 where they run side by side and
about 2 where they queue.
"""

from __future__ import annotations

import time

from bench.common import summary

STEPS = """
import time, torch
for _ in range({steps}):
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep({sleep_s})
"""


def run(reps: int = 5, steps: int = 100, sleep_s: float = 0.02) -> dict:
    from workbench import Session

    timed: dict[str, list[float]] = {"split_2_2_s": [], "join_s": [], "reform_s": [], "split_1_1_1_1_s": []}
    alone, both = [], []
    s = Session(n=4, timeout=60, backend="gloo").start()
    try:
        s.run("import torch")
        for _ in range(reps):
            rounds = (("split_2_2_s", lambda: s.split([2, 2])), ("join_s", s.join),
                      ("reform_s", s.rooms.reform), ("split_1_1_1_1_s", lambda: s.split([1, 1, 1, 1])),
                      (None, s.join))
            for name, step in rounds:
                t0 = time.perf_counter()
                step()
                if name is not None:
                    timed[name].append(time.perf_counter() - t0)
        s.split([2, 2], names=["a", "b"])
        cell = STEPS.format(steps=steps, sleep_s=sleep_s)
        for _ in range(reps):
            t0 = time.perf_counter()
            s.run(cell, on="a")
            alone.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for handle in [s.submit(cell, on=mesh) for mesh in ("a", "b")]:
                handle.wait(300)
            both.append(time.perf_counter() - t0)
        s.join()
    finally:
        s.stop()
    ratios = [b / a for a, b in zip(alone, both, strict=True)]
    return {**{k: summary(v, 1, 3) for k, v in timed.items()}, "alone_s": summary(alone, 1, 2),
            "both_s": summary(both, 1, 2), "ratio": summary(ratios, 1, 2), "steps": steps, "sleep_s": sleep_s}
