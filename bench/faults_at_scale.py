"""A rank killed at scale (issue 25): how fast it is named, the others released, and an elastic run goes on.

Each repetition runs a loop of all-reduces on every rank of one ``n``-rank pool (oversubscribed),
``kill -9``s one rank 2 s in, and reads the timeline, every time on the same machine's clock:

- ``named_s``: kill -> the health watcher has the rank dead (its listener is called);
- ``abort_sent_s``: kill -> the abort command left the kernel (one message for all ranks);
- ``aborted_s``: kill -> each other rank's agent aborted its group (its beacon's ``aborted_at``);
- ``released_s``: kill -> each other rank's reply (ipyparallel's ``completed``, the engine's clock);
  both as median and max;
- ``cell_s``: kill -> the cell raised in the kernel, with every outcome collected;
- ``one_rank_named``: the error's first line names the killed rank and no other, and no other rank
  counts as failed (the 31 others are "stopped").

The elastic part is :mod:`bench.elastic` at the same size: kill -> the next completed step.

    python -m bench.faults_at_scale                  # 32 ranks, 3 kills, elastic 2 kills
    python -m bench.faults_at_scale --n 16 --reps 1 --no-elastic
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time

from bench.common import ROOT, load_now, print_json, run_json, without_spare

LOOP = "for i in range(4000):\n    dist.all_reduce(torch.ones(1))\n    time.sleep(0.05)"


def _after(times: list[float]) -> dict:
    return {"median": round(statistics.median(times), 3), "max": round(max(times), 3)} if times else {}


@without_spare()
def one(n: int, reps: int) -> dict:
    """``reps`` kills in one ``n``-rank pool (each victim restarted before the next), in this process."""
    from workbench import Session

    s = Session(n=n, timeout=120 + 4 * n, oversubscribe=True)
    t0 = time.perf_counter()
    s.start()
    out: dict = {"n": n, "ready_s": round(time.perf_counter() - t0, 2), "load_start": load_now(), "kills": []}
    try:
        for rep in range(reps):
            # the group whole first: a cell after a fault re-forms it, and a kill landing in that (seconds
            # at 32 ranks) would time the re-form, not the abort
            s.run("import torch, time")
            out["kills"].append(kill_once(s, (n // 2 + 1 + rep) % n))
            s.restart()
    finally:
        s.stop()
    out["load_end"] = load_now()
    return out


def kill_once(s, victim: int) -> dict:
    """Kill ``victim`` 2 s into :data:`LOOP` on every rank of session ``s``; the timeline (see above)."""
    from workbench import RankError, faults

    marks: dict[str, float] = {}

    def named() -> None:
        marks.setdefault("named", time.time())

    def kill() -> None:
        marks.setdefault("kill", time.time())
        os.kill(pid, signal.SIGKILL)

    group = s.rooms.group
    send = group.command

    def timed(what, infos, **details):
        marks.setdefault(f"sent_{what}", time.time())
        return send(what, infos, **details)

    pid = s.ranks[victim].pid
    s.rooms.health.add_listener(named)
    group.command = timed
    timer = threading.Timer(2.0, kill)
    timer.start()
    err = None
    try:
        s.run(LOOP)
    except RankError as exc:
        err = exc
    ended = time.time()
    timer.join()
    group.command = send
    s.rooms.health.remove_listener(named)
    at = marks["kill"]
    if ended < at:  # the cell ended before the kill: nothing to time
        return {"victim": victim, "error": f"the cell ended before the kill: {str(err)[:300]}"}
    beats = s.rooms.beacons.latest
    others = [r for r in range(len(s.ranks)) if r != victim]
    aborted = [beats[r]["aborted_at"] - at for r in others if (beats.get(r) or {}).get("aborted_at")]
    ranks = err.result.ranks if err else []
    released = [faults.seconds(r.completed) - at for r in ranks
                if r.rank.rank != victim and faults.seconds(r.completed)]
    first = str(err).splitlines()[0] if err else ""
    failed = sorted(r.rank.rank for r in ranks if r.outcome in ("error", "died", "killed", "lost"))
    return {
        "victim": victim,
        "named_s": round(marks.get("named", float("nan")) - at, 3),
        "abort_sent_s": round(marks.get("sent_abort", float("nan")) - at, 3),
        "aborted_s": _after(aborted),
        "released_s": _after(released),
        "cell_s": round(ended - at, 3),
        "one_rank_named": failed == [victim] and f"rank {victim}" in first
        and not any(f"rank {r} " in first for r in others),
        "first_line": first[:160],
        "load": load_now(),
    }


def run(n: int = 32, reps: int = 3, elastic_reps: int = 2) -> dict:
    """The kills in a fresh process; then the elastic run at the same size (``elastic_reps`` = 0: none)."""
    print(f"   faults: {n} ranks, {reps} kills", flush=True)
    cmd = [sys.executable, "-m", "bench.faults_at_scale", "--one", str(n), "--reps", str(reps)]
    env = {"GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
    out = {"kill": run_json(cmd, timeout=300 + 20 * n * reps, env=env)}
    if elastic_reps:
        from bench import elastic

        print(f"   faults: elastic, {n} ranks, {elastic_reps} kills", flush=True)
        load0 = load_now()
        out["elastic"] = {**elastic.run(reps=elastic_reps, ranks=n, steps=200, oversubscribe=True),
                          "load": [load0, load_now()]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--elastic-reps", type=int, default=2)
    ap.add_argument("--no-elastic", action="store_true")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the kills, in this process
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.reps)), flush=True)
        return 0
    data = run(args.n, args.reps, 0 if args.no_elastic else args.elastic_reps)
    print_json(data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
