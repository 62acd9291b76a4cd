"""Goodput under faults that keep coming (issue 38), shaped like the public fault-tolerance benchmarks.

One job, run several times in the same bench run, each on a fresh local pool of ``ranks`` gloo ranks: the
elastic Trainer of :func:`tests.faults.chaos.setup_code` (``ElasticConfig(replace=True)``, a small MLP in
float64, a short pause per step standing for its compute) for ``steps`` steps, first without a fault, then
with a ``kill -9`` of a random rank (seeded; never the last one holding the run's state) every ``every``
seconds by :func:`tests.faults.chaos.run_chaos`, until 95 % of the steps are done. Read from the ranks' own
step records (each rank writes its own file, so a killed rank's records survive it):

- goodput: steps per second over the run (first step to last) against the fault-free run's;
- kill -> next completed step: the first step after the kill completed by a group without the victim;
- kill -> back at full size: the first step after the kill completed again on ``ranks`` ranks (the
  replacement started, replayed the setup and joined);
- every committed step's samples taken once (:func:`tests.faults.chaos.check_once`), the largest size the
  rank map held, the faults injected and the fault records the session kept.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile

from bench.common import load_now, owned_children, summary
from tests.faults import chaos

UNTIL = 0.95  # no fault after this share of the steps (the run's end is not a fault's)

# What torchft and Monarch publish on the same measure, with the addresses they were read at (December
# 2026, through the project's search of stored public pages); nothing here is ours or estimated.
PUBLISHED = [
    "torchft (PyTorch blog \"Fault Tolerant Llama: training with 2000 synthetic failures every ~15 seconds "
    "and no checkpoints on Crusoe L40S\", read in its copies at "
    "https://thebeat.tech/articles/fault-tolerant-llama-training-with-2000-synthetic-failures-every-15-"
    "seconds-and-no-checkpoints-on-crusoe-l40s and https://gokawiil.com/?tag=torchft): torchtitan Llama "
    "with torchft's fault-tolerant HSDP, a synthetic failure every ~15 s, the loss stable across 1200 "
    "failures with no checkpoint. The text found gives no goodput, steps/s or recovery time.",
    "torchft measured by a third party (Clockwork, "
    "https://clockwork.io/blog/keeping-distributed-training-running-through-failures): 3000 steps of "
    "torchtitan Llama-4 Scout (109B) on 64 H200, a failure every 2700-4500 s: torchft 930 min, checkpoint "
    "restart 818 min, Clockwork's TorchPass 405 min; the fault-free baseline's time is not in the text "
    "found, so no goodput can be derived from it.",
    "Monarch: no published fault-tolerance figure (goodput, recovery time) was found.",
]


def run(steps: int = 2400, every: tuple[float, ...] = (5.0, 2.0), ranks: int = 4, seed: int = 38,
        faults: int = 10_000, pause: float = 0.02, rounds: int = 1) -> dict:
    """``rounds`` rounds of: the fault-free run, then one run per gap in ``every`` (seconds between kills, at
    most ``faults`` kills each), each run's goodput against its own round's fault-free run (a shared machine's
    load changes between rounds; it slows both sides of a round alike). Then, per gap, the goodputs of the
    rounds and the kills of every round pooled."""
    out: dict = {"ranks": ranks, "steps": steps, "pause_s": pause, "seed": seed, "rounds": []}
    for r in range(rounds):
        base = one(steps, None, seed, ranks, faults, pause)
        this = {"fault-free": base, "runs": {}}
        deadline = max(120.0, 4 * base["seconds"])  # a faulted run that stands still is given up
        for i, gap in enumerate(every):
            got = one(steps, gap, seed + 100 * r + i, ranks, faults, pause, deadline)
            if base.get("steps_per_s") and got.get("steps_per_s"):
                got["goodput"] = round(got["steps_per_s"] / base["steps_per_s"], 3)
            this["runs"][f"every {gap:g} s"] = got
        out["rounds"].append(this)
    out["summary"] = {"fault-free": {"steps_per_s": summary(
        [r["fault-free"]["steps_per_s"] for r in out["rounds"] if r["fault-free"].get("steps_per_s")], 1, 3)}}
    for name in out["rounds"][0]["runs"]:
        runs = [r["runs"][name] for r in out["rounds"]]
        out["summary"][name] = {
            "goodput": summary([g["goodput"] for g in runs if "goodput" in g], 1, 3),
            "kill_to_step_s": _spread([x for g in runs for x in g.get("kill_to_step_each_s", [])]),
            "kill_to_full_size_s": _spread([x for g in runs for x in g.get("kill_to_full_size_each_s", [])]),
            "kills_not_back_at_full_size_by_the_end": sum(g.get("kills_not_back_at_full_size_by_the_end", 0)
                                                          for g in runs),
            "faults_injected": sum(g.get("faults_injected", 0) for g in runs),
            "fault_records": sum(g.get("fault_records", 0) for g in runs),
            "each_sample_once": all(g.get("each_sample_once") for g in runs),
            "failed": [g["error"] for g in runs if "error" in g],
            "largest_size": max(g.get("largest_size", 0) for g in runs),
        }
    return out


def one(steps: int, every: float | None, seed: int, ranks: int, faults: int, pause: float,
        deadline_s: float | None = None) -> dict:
    """One run of the job on a fresh pool; ``every`` None: no fault. A run not done after ``deadline_s``
    seconds is given up: its error says so, and its figures are those of the steps it completed."""
    from workbench import Session

    folder = tempfile.mkdtemp(prefix="wb-bench-goodput-")
    load = load_now()
    try:
        with owned_children() as kids:
            s = Session(n=ranks, timeout=60).start()
            try:
                s.run(chaos.setup_code(folder, pause=pause))
                got = chaos.run_chaos(s, folder, seed, faults=faults if every else 0, steps=steps,
                                      gap=(every or 1.0,) * 2, size=ranks, kinds=("kill",), until=UNTIL,
                                      deadline_s=deadline_s)
                fault_records = len(s.faults) - got.faults_before
                kids["snapshot"]()
            finally:
                s.stop()
        by_pid = chaos.records_by_pid(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {**figures(got, by_pid, steps, ranks, fault_records, kids["leftover"]), "load_average": load}


def figures(run: chaos.Chaos, by_pid: dict[int, list], steps: int, ranks: int, fault_records: int,
            leftover: int) -> dict:
    """What :func:`one` reports of ``run`` (a :class:`tests.faults.chaos.Chaos`) and its step records."""
    out: dict = {"error": repr(run.error)[:500]} if run.error is not None else {}
    records = list(by_pid.values())
    last = max((r[0] for rs in records for r in rs), default=0)
    try:  # a run that failed: the steps it completed (every prefix holds the same promise)
        chaos.check_once(records, last if run.error is not None else steps)
        out["each_sample_once"] = True
    except AssertionError as exc:
        out["each_sample_once"] = False
        out["check"] = str(exc)[:300]
    times = sorted(r[5] for rs in records for r in rs)
    attempts = _attempts(by_pid)
    kills = [(run.started + at, int(did.split()[1])) for at, kind, did in run.schedule
             if kind == "kill" and did.startswith("kill ")]
    to_step, to_full, never_full = [], [], 0
    for t, victim in kills:
        done = _first(attempts, t, lambda a, v=victim: v not in a["pids"])
        if done is not None:
            to_step.append(done - t)
        full = _first(attempts, t, lambda a, v=victim: v not in a["pids"] and a["world"] == ranks)
        if full is None:
            never_full += 1
        else:
            to_full.append(full - t)
    span = times[-1] - times[0] if len(times) > 1 else None
    out.update({
        "seconds": round(run.seconds, 2),
        "steps_done": last,
        "steps_per_s": round((last - 1) / span, 3) if span else None,
        "faults_injected": len(kills),
        "fault_records": fault_records,
        "schedule": [[at, did] for at, _, did in run.schedule],
        "kill_to_step_s": _spread(to_step),
        "kill_to_full_size_s": _spread(to_full),
        "kill_to_step_each_s": [round(x, 3) for x in to_step],
        "kill_to_full_size_each_s": [round(x, 3) for x in to_full],
        "kills_not_back_at_full_size_by_the_end": never_full,
        "largest_size": run.largest,
        "leftover_processes": leftover,
    })
    return out


def _attempts(by_pid: dict[int, list]) -> list[dict]:
    """Each attempt of a step that every rank of its group completed: its group's pids, world size and the
    time its first rank completed it, in that order."""
    groups: dict[tuple, dict] = {}
    for pid, recs in by_pid.items():
        for step, position, size, world, _, t in recs:
            a = groups.setdefault((step, tuple(position), size, world), {"pids": set(), "times": []})
            a["pids"].add(pid)
            a["times"].append(t)
    whole = [{"pids": a["pids"], "world": key[3], "t": min(a["times"])} for key, a in groups.items()
             if len(a["pids"]) == key[3]]
    return sorted(whole, key=lambda a: a["t"])


def _first(attempts: list[dict], after: float, ok) -> float | None:
    return next((a["t"] for a in attempts if a["t"] > after and ok(a)), None)


def _spread(values: list[float]) -> dict:
    """Median, p90, min, max and count, in seconds."""
    out = summary(values, 1, 3)
    if values:
        out["p90"] = round(statistics.quantiles(values, n=10, method="inclusive")[-1], 3) \
            if len(values) > 1 else round(values[0], 3)
    return out
