"""Sub-meshes (issue 43, docs/submeshes.md): what a split and a join cost, beside a re-form of the group (the
abort and form a cell does after a fault), and how two cells on disjoint sub-meshes overlap.

On one 4-rank local pool (gloo), in alternating rounds: ``Session.split([2, 2])``, ``Session.join()``,
``Rooms.reform()`` and ``Session.split([1, 1, 1, 1])``; then, split 2 + 2, a cell of ``steps`` steps (an
``all_reduce`` and a sleep of ``sleep_s``: steps that do not compete for the cores) on one sub-mesh alone,
and the same cell on both sub-meshes at once. The ratio both/alone is about 1 where they run side by side and
about 2 where they queue. Last, ``wb.Sweep`` of four such trials on 2-rank sub-meshes (its own split and join
included): about 2 x alone where two trials run at a time, about 4 where they queue. Then, on the same pool,
the elastic regroup a split and a join are held against: an elastic Trainer (:mod:`bench.elastic`'s) trains on
all 4 ranks, one rank is killed (``kill -9``) once it is under way, and the ranks left regroup and train on:
the regroup itself (forming the group of 3 and syncing the state, timed by the ranks, the Trainer's regroup
event) and the kill to the next step; ``Session.restart()`` brings the rank back before the next round.
"""

from __future__ import annotations

import time

from bench import elastic
from bench.common import BENCH, summary

STEPS = """
import time, torch
for _ in range({steps}):
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep({sleep_s})
"""

TRIAL = """
import time, torch
def steps_trial(steps, sleep_s):
    for _ in range(steps):
        t = torch.ones(1)
        dist.all_reduce(t)
        time.sleep(sleep_s)
    return {"steps": steps}
"""


def run(reps: int = 5, steps: int = 100, sleep_s: float = 0.02, elastic_steps: int = 60) -> dict:
    from workbench import Session, Sweep
    from workbench.pool.watch.beacons import BeaconReceiver

    timed: dict[str, list[float]] = {"split_2_2_s": [], "join_s": [], "reform_s": [], "split_1_1_1_1_s": []}
    alone, both, swept = [], [], []
    regroup, kill_to_step, notes = [], [], []
    s = Session(n=4, timeout=60, backend="gloo").start()
    beacons = BeaconReceiver(s.pool.channel)
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
        s.run(TRIAL)
        for _ in range(reps):
            t0 = time.perf_counter()
            trials = Sweep("steps_trial", [{"steps": steps, "sleep_s": sleep_s}] * 4, ranks_per_trial=2,
                           session=s).run()
            swept.append(time.perf_counter() - t0)
            assert [t.status for t in trials] == ["done"] * 4, trials
        s.run(elastic.SETUP.format(bench=str(BENCH), ranks=4))
        for rep in range(reps):
            if s.world_size < 4:
                s.restart()  # the new engine replays the setup; the next run gives it the state
            killed = elastic.kill_in_run(s, beacons, (1, 2)[rep % 2], elastic_steps, notes)
            if killed is not None:
                t_kill, event, records = killed
                regroup.append(event["seconds"])
                after = elastic.first_step_after(event, records, t_kill)
                if after is not None:
                    kill_to_step.append(after)
    finally:
        beacons.close()
        s.stop()
    ratios = [b / a for a, b in zip(alone, both, strict=True)]
    sweep_ratios = [w / a for a, w in zip(alone, swept, strict=True)]
    return {**{k: summary(v, 1, 3) for k, v in timed.items()}, "alone_s": summary(alone, 1, 2),
            "both_s": summary(both, 1, 2), "ratio": summary(ratios, 1, 2), "steps": steps, "sleep_s": sleep_s,
            "sweep_4_s": summary(swept, 1, 2), "sweep_ratio": summary(sweep_ratios, 1, 2),
            "elastic_regroup_s": summary(regroup, 1, 3),
            "elastic_kill_to_step_s": summary(kill_to_step, 1, 3), "elastic_notes": notes}
