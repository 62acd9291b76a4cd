"""A RankView on a real 2-engine pool: one object for a set of ranks that pushes, pulls, applies,
scatters and gathers; the Session's push/pull/apply forward to it; the ipyparallel view under it is made
once per set of engines."""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import alive, until
from workbench import Session
from workbench.errors import RankDiedError

pytestmark = pytest.mark.timeout(120)


def test_a_view_carries_push_pull_apply_scatter_gather_and_refuses_a_dead_rank():
    s = Session(n=2, timeout=60).start()
    pids = s.pids()
    try:
        one = s.view(1)
        assert one.targets == [1] and s.view("0-1").targets == [0, 1] and s.view().targets == [0, 1]
        one.push({"x": 7})
        assert one.pull("x") == [7] and s.pull("x", rank=1) == 7
        with pytest.raises(NameError, match="'x' is not defined on rank 0"):
            s.view(0).pull("x")
        assert s.view().apply(os.getpid) == [r.pid for r in s.ranks]
        assert s.view().scatter(list(range(5)), "part") == [3, 2]
        assert s.pull("part") == [[0, 1, 2], [3, 4]]
        assert s.view().gather("part") == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="rank 5 is out of range"):
            s.view([0, 5]).push({"y": 1})
        with pytest.raises(ValueError, match="cannot send"):
            s.view().push({"g": (i for i in range(2))})

        os.kill(s.ranks[1].pid, signal.SIGKILL)
        assert until(lambda: 1 in s.dead_ranks(), timeout=30)
        with pytest.raises(RankDiedError, match="rank 1 .*is dead"):
            one.pull("x")
        assert s.view(0).apply(os.getpid) == [s.ranks[0].pid]  # the living rank still answers
        # one DirectView per set of engines, made once (a new one per cell cost the kernel CPU); a
        # restarted rank's new engine gets a view of its own
        door = s.rooms.door  # the only holder of views
        before = door._view(s.ranks)
        assert door._view(s.ranks) is before and door._view(s.ranks[:1]) is door._view(s.ranks[:1])
        assert s.restart() == [1]
        after = door._view(s.ranks)
        assert after is not before and list(after.targets) == [r.engine_id for r in s.ranks]
        assert s.view().apply(os.getpid) == [r.pid for r in s.ranks]
        pids = s.pids()
    finally:
        s.stop()
    assert alive(pids) == []
