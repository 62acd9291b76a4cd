"""The server's worker threads never hold its exit, and the controller is never asked without a bound
(issue 40, point 2: a worker in ipyparallel's ``queue_status`` kept a Jupyter server alive after SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from workbench.pool.watch.queues import NoAnswer, rank_states

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("executor", ["workbench.server.threads.DaemonExecutor"])
def test_a_worker_stuck_for_ever_does_not_hold_the_exit(executor):
    module, _, name = executor.rpartition(".")
    code = (f"import threading\nfrom {module} import {name}\npool = {name}(2)\n"
            "pool.submit(threading.Event().wait)\nprint('exiting', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr


def test_a_controller_that_never_answers_is_given_up_after_the_bound():
    class Silent:  # the controller's books never come: queue_status waits for ever
        ids, results = [0, 1], {}

        def queue_status(self, targets, verbose):
            time.sleep(3600)

    t0 = time.monotonic()
    with pytest.raises(NoAnswer, match="did not answer within 0.2 s"):
        rank_states(Silent(), {0: 0, 1: 1}, timeout=0.2)
    assert time.monotonic() - t0 < 30  # a hang guard: the bound is the point, not the figure
