"""The lease: a small process that ends a pool whose owner died.

``atexit`` does not run when a kernel is SIGKILLed, and orphaned ipyparallel engines only notice
after minutes of missed heartbeats. The lease starts before any other process of the pool and waits
on the owner named in the pool's state file (a pidfd: it wakes the moment the owner exits). When the
owner is gone it cancels the pool's batch jobs and remote engines, SIGKILLs every process of the pool
on this machine at once (their state died with the owner), also those a launch cut short had not
recorded yet (:mod:`workbench.pool.processes.reap` finds them by their tag), removes the files and leaves word
for any notebook still attached (:mod:`workbench.pool.records.sharing`). When the
state file goes away (the pool was stopped normally) it exits.

Run as ``python -m workbench.pool.processes.lease STATE_FILE``.
"""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path

from workbench.pool.processes.reap import clean_up
from workbench.pool.records import sharing
from workbench.pool.records.state import PoolState, StateFileError, process_alive, read_state

# How often the state file is looked at (a normal stop removes it); the owner's exit wakes us at once.
FILE_POLL_S = 0.5


def owner_exited(record: dict, timeout: float) -> bool:
    """Wait up to ``timeout`` s for the owner to exit; True once it has (a zombie has exited)."""
    if not process_alive(record):
        return True
    try:
        fd = os.pidfd_open(record["pid"])
    except (AttributeError, OSError):  # no pidfd here: look again after a short sleep
        time.sleep(min(timeout, 0.05))
        return not process_alive(record)
    try:
        if not process_alive(record):  # the pid was reused between the two looks
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(fd)


def watch(path: Path) -> None:
    state: PoolState | None = None  # the last state read
    said = False

    def read() -> PoolState | None:
        """The state now; None once the pool was stopped normally (its file removed). A file that is not a
        pool state (the owner writes it whole, by rename: it never is) leaves the last one read in force,
        said once in the pool's log: the lease keeps watching the owner it knows."""
        nonlocal said
        try:
            return read_state(path)
        except StateFileError as exc:
            if not said:
                print(f"workbench lease: {exc} Watching the owner it named before.", flush=True)
                said = True
            return state or PoolState()

    while True:
        state = read()
        if state is None:  # stopped normally
            return
        if not state.owner:  # no owner known yet: look again
            time.sleep(FILE_POLL_S)
            continue
        if owner_exited(state.owner, FILE_POLL_S):
            t0 = time.monotonic()
            state = read() or state  # the latest processes, if the owner wrote more meanwhile
            clean_up(state, grace=0.0)
            path.unlink(missing_ok=True)
            # a notebook still attached hears why, and nothing of the pool is left in the runtime folder
            if state.id:
                sharing.note_stopped(state.id, state.name, "its owner's exit")
                sharing.forget(state.id)
            # the lease's output goes to the pool's log
            print(f"workbench lease: the owner (pid {state.owner.get('pid')}) of pool {state.id or None} "
                  f"exited; the pool was ended in {time.monotonic() - t0:.2f} s", flush=True)
            return


if __name__ == "__main__":
    watch(Path(sys.argv[1]))
