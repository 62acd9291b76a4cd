"""How a dead rank reads in a cell's error and its tab (issue 40, point 5): once, in words, never an object's
repr."""

from __future__ import annotations

import re

import pytest

from workbench.errors import RankError
from workbench.faults import FaultEvent
from workbench.magics.rank_tabs import rank_tabs
from workbench.pool.rankmap import RankInfo
from workbench.session.results import CellResult, RankDied, RankResult

pytestmark = pytest.mark.timeout(30)


def _died_cell(fault: bool) -> RankError:
    infos = [RankInfo(r, r, 0, "vm", 7000 + r, "cpu", r) for r in range(2)]
    died = RankDied(infos[1], "exited")
    ranks = [RankResult(infos[0], outcome="stopped", where="cell line 4"),
             RankResult(infos[1], outcome="died", error=died)]
    event = FaultEvent(pool=None, kind="died", rank=1, host="vm", device="cpu", first_failure=str(died),
                       time=0.0, abort_s=0.9) \
        if fault else None
    return RankError([(infos[1], died)], CellResult(ranks, 1.0, fault=event))


@pytest.mark.parametrize("fault", [True, False])
def test_a_dead_rank_is_said_once_and_restart_is_offered_once(fault):
    err = _died_cell(fault)
    shown = "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", line) for line in err._render_traceback_())
    assert shown.splitlines()[0] == "rank 1 (vm, cpu) died: its engine process 7001 exited", shown
    assert shown.count("7001") == 1 and shown.count("exited") == 1, shown
    assert shown.count("%dist restart") == 1, shown
    assert "2 ranks · 1 died (rank 1) · 1 stopped" in shown, shown


def test_a_dead_ranks_tab_says_how_it_died_not_an_objects_repr():
    err = _died_cell(fault=True)
    page = rank_tabs(err.result, world_size=2)["text/html"]
    assert "object at 0x" not in page, page
    assert "died: its engine process 7001 exited" in page, page
