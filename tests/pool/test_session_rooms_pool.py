"""The composition root on a real 2-engine pool: the rooms are built once when the pool runs, handed whole to
the cell, its elastic watch and recovery, kept through a restart, and closed with the pool; ``%dist check``
goes through the door (its probe in a watched cell, the clocks asked one rank at a time) and leaves nothing
on the ranks."""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import alive, until
from workbench import Session
from workbench.errors import NoPoolError
from workbench.preflight import run_check

pytestmark = pytest.mark.timeout(180)


def test_the_rooms_are_built_once_handed_whole_and_closed_with_the_pool():
    s = Session(n=2, timeout=60).start()
    pids = s.pids()
    try:
        rooms = s.rooms
        assert rooms.group.door is rooms.door and rooms.folders.door is rooms.door
        assert rooms.recovery.rooms is rooms and rooms.health.beacons is rooms.beacons
        assert s.metrics is rooms.metrics
        handle = s.submit("x = rank")
        assert handle.cell.rooms is rooms and handle.cell.elastic.rooms is rooms
        handle.wait(60)
        assert rooms.transcript.items[-1] == ("cell", "x = rank")  # ran on every rank: a new engine's setup
        s.push({"y": 2})
        assert rooms.transcript.items[-1] == ("push", {"y": 2})

        report = run_check(s, size_mb=0.01, iters=2)
        assert report.ok, report.format()
        assert [row["rank"] for row in report.rows] == [0, 1]
        s.run("left_over = sorted(name for name in dir() if name.startswith('_wb_'))")
        assert s.pull("left_over") == [[], []]  # the probe and its result were taken off the ranks

        os.kill(s.ranks[1].pid, signal.SIGKILL)
        assert until(lambda: 1 in s.dead_ranks(), timeout=30)
        assert s.restart() == [1]
        assert s.rooms is rooms and s.pull("x", rank=0) == 0  # the same rooms; the survivor kept its state
        pids += s.pids()
    finally:
        s.stop()
    assert rooms.closed and s.metrics is None
    with pytest.raises(NoPoolError):
        s.rooms  # noqa: B018 (the property is the check)
    assert alive(pids) == []
