"""Elastic training: ``kill -9`` of a rank while an elastic Trainer runs, to the next completed step.

Beside :mod:`bench.recovery` (the restart-and-resume path). Each repetition starts an elastic run of
the MLP on ``ranks`` ranks, kills one rank (not rank 0 first, then rank 0: the one hosting the next
group's store) once the run is well under way, and reads back from the ranks left: when the first
step after the regroup completed (the ranks' own clock, the same machine), and which samples of each
epoch the committed steps took, so that samples lost (never taken) and samples doubled are counted:
both must be 0. ``Session.restart()`` then brings the rank back (its setup replayed) for the next
repetition; that is timed too.
"""

from __future__ import annotations

import os
import random
import signal
import time

from bench.common import BENCH, summary

SETUP = """
import sys, time
sys.path.insert(0, {bench!r})
import loop
import workbench as wb

class Taken(wb.Callback):
    def __init__(self):
        self.steps = []
    def on_step_end(self, trainer, stats):
        s = trainer.elastic.last_step
        self.steps.append((trainer.step, time.time(), tuple(s["position"]), s["size"]))

taken = Taken()
trainer = loop.build("mlp", data_world={ranks}, elastic=True, callbacks=[taken])
"""


def run(reps: int = 2, ranks: int = 3, steps: int = 120, oversubscribe: bool = False) -> dict:
    """``oversubscribe``: more ranks than cores (the 32-rank run of :mod:`bench.faults_at_scale`)."""
    from workbench import Session
    from workbench.pool.watch.beacons import BeaconReceiver

    out: dict[str, list[float]] = {"kill_to_step_s": [], "restart_s": []}
    lost, doubled, notes = [], [], []
    s = Session(n=ranks, timeout=120 + 4 * ranks, oversubscribe=oversubscribe).start()
    beacons = BeaconReceiver(s.pool.channel)
    try:
        s.run(SETUP.format(bench=str(BENCH), ranks=ranks))
        for rep in range(reps):
            if s.world_size < ranks:
                t0 = time.monotonic()
                s.restart()  # the new engine replays SETUP, and the next run gives it the state
                out["restart_s"].append(time.monotonic() - t0)
            victim = (1, 0, 2)[rep % 3] % ranks  # rank 0 too: it hosts the store the ranks left meet at
            killed = kill_in_run(s, beacons, victim, steps, notes)
            if killed is None:
                continue
            t_kill, event, records = killed
            after = first_step_after(event, records, t_kill)
            if after is not None:
                out["kill_to_step_s"].append(after)
            gaps, twice = _coverage(records)
            lost.append(gaps)
            doubled.append(twice)
    finally:
        beacons.close()
        s.stop()
    return {
        "ranks": ranks,
        "kill_to_step_s": summary(out["kill_to_step_s"], 1, 3),
        "restart_s": summary(out["restart_s"], 1, 2),
        "samples_lost": sum(lost),
        "samples_doubled": sum(doubled),
        "reps": reps,
        "notes": notes,
    }


def kill_in_run(s, beacons, victim: int, steps: int, notes: list[str]) -> tuple[float, dict, list] | None:
    """One elastic run of ``steps`` (the trainer :data:`SETUP` built on every rank) with rank ``victim``
    killed (``kill -9``) once it is well under way: ``(the kill's time, rank 0's regroup event, every step
    record of the ranks left)``, the records then cleared; None where it went otherwise (said in ``notes``).
    Also :mod:`bench.submesh`'s elastic regroup, beside its split and join."""
    ranks = s.world_size
    handle = s.submit(f"trainer.run(steps={steps})")
    if not _under_way(s, beacons, random.randrange(5, 15)):
        notes.append("the run did not get going")
        handle.wait(300 + 10 * ranks)
        return None
    t_kill = time.time()
    os.kill(s.ranks[victim].pid, signal.SIGKILL)
    try:
        result = handle.wait(300 + 10 * ranks)
    except Exception as exc:
        notes.append(f"the cell failed after the kill: {str(exc)[:200]}")
        return None
    if sorted(r.outcome for r in result.ranks) != ["lost"] + ["ok"] * (ranks - 1):
        notes.append(f"outcomes {[r.outcome for r in result.ranks]}")
    event = s.pull("trainer.elastic.events[-1]", rank=0)
    records = [rec for rank_log in s.pull("taken.steps") for rec in rank_log]
    s.run("taken.steps.clear()")
    return t_kill, event, records


def first_step_after(event: dict, records: list, t_kill: float) -> float | None:
    """Seconds from the kill to the first step completed after the regroup (the ranks' own clock)."""
    after = [t for step, t, _, _ in records if step > event["step"] and t > t_kill]
    return min(after) - t_kill if after else None


def _coverage(records) -> tuple[int, int]:
    """Samples of the epochs the committed steps went through that no step took, and that two took."""
    slices = {}
    for step, _, (epoch, offset), size in records:
        slices[step] = (epoch, offset, size)  # every rank left logged the same step alike
    by_epoch: dict[int, list[tuple[int, int]]] = {}
    for epoch, offset, size in slices.values():
        by_epoch.setdefault(epoch, []).append((offset, size))
    gaps = twice = 0
    for parts in by_epoch.values():
        parts.sort()
        end = parts[0][0]
        for offset, size in parts:
            gaps += max(0, offset - end)
            twice += max(0, end - offset)
            end = max(end, offset + size)
    return gaps, twice


def _under_way(s, beacons, step: int, timeout: float = 120) -> bool:
    """Every rank's beacon shows the run past ``step`` (the engines are busy: only beacons can tell)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        trainers = [(beacons.latest.get(r.rank) or {}).get("trainer") or {} for r in s.ranks]
        if all(t.get("running") and t.get("step", 0) >= step for t in trainers):
            return True
        time.sleep(0.01)
    return False
