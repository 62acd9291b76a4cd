"""Recovery: ``kill -9`` of rank 1 while the pool trains, to training resumed from the last checkpoint.

Phases, each timed in the kernel: the kill to the cell failing with the dead rank named (detected,
survivors stopped); ``Session.restart()`` (a new engine for rank 1, the group re-formed); rebuilding
the trainer, loading the checkpoint and the first step after it (resumed).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

from bench.common import BENCH, summary


def run(reps: int = 2, steps_before: int = 20, every: int = 10) -> dict:
    from workbench import RankError, Session

    ckpt = tempfile.mkdtemp(prefix="wb-bench-ckpt-")
    phases: dict[str, list[float]] = {"detected_s": [], "restart_s": [], "resume_s": [], "total_s": []}
    notes = []
    s = Session(n=2, timeout=120).start()
    setup = (
        f"import sys\nsys.path.insert(0, {str(BENCH)!r})\nimport loop\n"
        "from workbench.train.checkpoint import Checkpoint, resume\n"
        f"trainer = loop.build('mlp')\ntrainer.callbacks.append(Checkpoint({ckpt!r}, every={every}))"
    )
    try:
        s.run(setup)
        for _ in range(reps):
            s.run(f"trainer.run(steps={steps_before})")
            victim = s.ranks[1].pid
            handle = s.submit("trainer.run(steps=1_000_000)")
            time.sleep(1.0)  # well inside the run
            t_kill = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            try:
                handle.wait(60)
                notes.append("the cell ended without an error after the kill")
                continue
            except RankError as exc:
                t_detected = time.monotonic()
                if exc.rank != 1:
                    notes.append(f"the error named rank {exc.rank}, not 1")
            s.restart()
            t_restarted = time.monotonic()
            s.run(setup + "\nresumed_from = resume(" + repr(ckpt) + ", trainer)\ntrainer.run(steps=1)")
            t_resumed = time.monotonic()
            phases["detected_s"].append(t_detected - t_kill)
            phases["restart_s"].append(t_restarted - t_detected)
            phases["resume_s"].append(t_resumed - t_restarted)
            phases["total_s"].append(t_resumed - t_kill)
        resumed_from = s.pull("resumed_from", rank=0) if phases["total_s"] else None
    finally:
        s.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    return {
        "phases": {k: summary(v, 1, 2) for k, v in phases.items()},
        "checkpoint_every": every,
        "resumed_from_step": resumed_from,
        "notes": notes,
    }
