"""Time to ready (nothing -> a 2-rank group whose all_reduce is verified) and time to stop.

``workbench`` starts cold (a fresh process: nothing loaded, nothing running); ``workbench, spare ready``
starts a pool in a shell where ``%load_ext workbench`` ran earlier (its spare zygote has loaded torch).

Each trial is a fresh process; the tools take turns, round after round. Every process a trial
leaves behind is ended by pid and counted (``leftover``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ANCHORS_PY, BENCH, reap, run_json, summary
from bench.training import RANK_ENV, TORCHRUN

ENV = {"GLOO_SOCKET_IFNAME": "lo"}


def _torchrun_trial() -> dict:
    import subprocess

    import psutil

    out = Path(tempfile.mkdtemp(prefix="wb-bench-")) / "ready.json"
    t0 = time.time()
    proc = subprocess.Popen(
        [
            str(TORCHRUN),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(BENCH / "rank_main.py"),
            "ready",
            str(out),
        ],
        env={**os.environ, **RANK_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    tree = {}
    while proc.poll() is None and time.time() - t0 < 180:
        try:
            for c in psutil.Process(proc.pid).children(recursive=True):
                tree.setdefault(c.pid, c)
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.02)
    t_exit = time.time()
    leftover = reap([*tree.values()] + ([psutil.Process(proc.pid)] if proc.poll() is None else []))
    if not out.exists():
        return {"error": f"torchrun wrote nothing: {proc.stderr.read()[-800:]}", "leftover": leftover}
    got = json.loads(out.read_text())
    out.unlink()
    out.parent.rmdir()
    return {"ready_s": got["t_ready"] - t0, "stop_s": t_exit - got["t_ready"], "leftover": leftover}


def _tools(anchors: bool) -> dict:
    me = [sys.executable, str(BENCH / "ready_trial.py")]
    tools = {
        "workbench": lambda: run_json([*me, "workbench"], timeout=240, env=ENV),
        "workbench, spare ready": lambda: run_json([*me, "workbench-warm"], timeout=240, env=ENV),
        "ipyparallel + hand-written rendezvous": lambda: run_json([*me, "ipyparallel"], timeout=240, env=ENV),
        "torchrun": _torchrun_trial,
    }
    if anchors:
        path = {"PATH": f"{ANCHORS_PY.parent}{os.pathsep}{os.environ.get('PATH', '')}", **ENV}
        side = [str(ANCHORS_PY), str(BENCH / "anchors_side.py")]
        tools["nbdistributed %dist_init"] = lambda: run_json(
            [*side, "ready-nbdistributed"], timeout=240, env=path
        )
        tools["accelerate notebook_launcher"] = lambda: run_json(
            [*side, "ready-accelerate"], timeout=240, env=path
        )
    return tools


def run(reps: int = 3, anchors: bool = True, only: tuple[str, ...] | None = None) -> dict:
    """``reps`` trials of every tool (``only``: just these), a different tool first each round."""
    tools = {k: v for k, v in _tools(anchors).items() if only is None or k in only}
    trials: dict[str, list[dict]] = {k: [] for k in tools}
    names = list(tools)
    for i in range(reps):
        for name in (
            names[i % len(names) :] + names[: i % len(names)]
        ):  # a different tool goes first each round
            trials[name].append(tools[name]())
    out = {}
    for name, ts in trials.items():
        ok = [t for t in ts if "error" not in t]
        row = {
            "ready_s": summary([t["ready_s"] for t in ok], 1, 2),
            "stop_s": summary([t["stop_s"] for t in ok], 1, 2),
            "leftover_processes": sum(t.get("leftover", 0) for t in ts),
        }
        if ok and "import_s" in ok[0]:
            row["import_s"] = summary([t["import_s"] for t in ok], 1, 2)
        errors = [t["error"] for t in ts if "error" in t]
        if errors:
            row["errors"] = errors
        if name.startswith("workbench") and ok:
            row["marks"] = ok[len(ok) // 2]["marks"]  # where one (median-ish) start spent its time
        out[name] = row
    return out
