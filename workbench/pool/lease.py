"""The lease: a small process that ends a pool whose owner died.

``atexit`` does not run when a kernel is SIGKILLed, and orphaned ipyparallel
engines only notice after minutes of missed heartbeats. This process watches the
owner named in the pool's state file; when the owner is gone it stops every
process recorded there, cancels the pool's batch jobs (engines on other nodes)
and removes the files. When the file goes away (the pool was
stopped normally) it exits.

Run as ``python -m workbench.pool.lease STATE_FILE``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from workbench.pool.state import cancel_jobs, process_alive, read_state, remove_files, terminate

POLL_SECONDS = 0.5


def watch(path: Path) -> None:
    while True:
        state = read_state(path)
        if state is None:  # stopped normally
            return
        if not process_alive(state["owner"]):
            cancel_jobs(state.get("jobs", []) + state.get("remote", []))
            # the pool records this lease among its processes: stopping ourselves first would leave
            # the rest running and the files behind
            terminate([rec for rec in state.get("processes", []) if rec.get("pid") != os.getpid()])
            remove_files(state)
            path.unlink(missing_ok=True)
            return
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    watch(Path(sys.argv[1]))
