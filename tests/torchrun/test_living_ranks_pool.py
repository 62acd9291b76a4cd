"""After a rank dies, cells on the living ranks still run (with a warning), so that a user can save their
state before ``%dist restart``; a cell that includes the dead rank is refused as before."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.conftest import alive, until
from tests.torchrun.common import on_both_ranks, run
from workbench import session

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_cells_on_the_living_ranks_after_a_death(ipshell):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result, shown = run(ipshell, "%dist start -n 2 --timeout 60")
    assert result.success, shown
    s = session.current()
    pids = s.pids()
    try:
        result, shown = run(ipshell, "%%distributed\nstate = rank * 100")
        assert result.success, shown
        os.kill(s.ranks[1].pid, signal.SIGKILL)
        assert until(lambda: 1 in s.dead_ranks(), timeout=30), "the death was not seen"
        result, shown = run(ipshell, "%%distributed --ranks 0\nprint('saved', state)")
        assert result.success, shown
        assert "[rank 0] saved 0" in shown and "rank 1 is dead: this cell runs on rank 0 only" in shown, shown
        result, shown = run(ipshell, "%dist status")
        assert result.success and "process group: broken, rank 1 dead" in shown, shown
        result, shown = run(ipshell, "%%distributed\nprint('everyone')")
        assert not result.success and "rank 1 (" in shown and "is dead" in shown, shown
        result, shown = run(ipshell, "%dist restart")
        assert result.success, shown
        result, shown = run(ipshell, "%dist status")
        assert result.success and "process group: formed (backend gloo, world size 2)" in shown, shown
        cell = "%%distributed\nimport torch\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())"
        result, shown = run(ipshell, cell)
        assert result.success and on_both_ranks(shown, "sum 2.0"), shown
        assert s.pull("state", rank=0) == 0
        pids = s.pids()
    finally:
        result, shown = run(ipshell, "%dist stop")
    assert result.success, shown
    assert alive(pids) == []
    assert until(lambda: {p.pid for p in psutil.Process().children(recursive=True)} - before == set(),
                 timeout=10), "processes of the pool were left"
