"""A host's hub and the kernel's side of it, their pure parts (issue 42): what goes up per host, not per rank.

- a busy rank's beacon that says nothing new goes up as "heard" (its rank and publisher), whole at most once a
  second; a beacon that says something new goes whole at once;
- device samples alone wait for the host's other ranks' (one batch a second); a step or an event goes soon;
- the kernel's :class:`HostCell` answers "done?" and "which ranks raised?" without visiting every rank, and
  still names each rank's own error.
"""

from __future__ import annotations

import pytest

from workbench.pool.processes import host_hub
from workbench.pool.processes.host_hub import BeaconTable, MetricsBatch
from workbench.pool.rankmap import RankInfo
from workbench.remote.host_replies import HostCell

pytestmark = pytest.mark.timeout(30)


def _beat(rank: int, seq: int, t: float, where: str = "cell line 1", busy: bool = True) -> dict:
    return {"rank": rank, "pub": f"p{rank}", "seq": seq, "t": t, "busy": busy, "where": where}


def test_a_busy_beacon_that_says_nothing_new_goes_as_heard_and_whole_once_a_second():
    table = BeaconTable("h0")
    for rank in (0, 1):
        table.take(_beat(rank, 1, 0.0), now=0.0)
    first = table.table(now=0.0)
    assert [b["rank"] for b in first["beats"]] == [0, 1]  # new: whole
    for rank in (0, 1):
        table.take(_beat(rank, 2, 0.25), now=0.25)
    second = table.table(now=0.25)
    # busy: a table at the busy pace, the ranks heard (their silence clocks move), no beacon parsed again
    assert second is not None and second["beats"] == [] and second["heard"] == [[0, "p0"], [1, "p1"]]
    table.take(_beat(0, 3, 0.5, where="cell line 2"), now=0.5)  # rank 0 moved: whole at once
    table.take(_beat(1, 3, 0.5), now=0.5)
    third = table.table(now=0.5)
    assert [b["rank"] for b in third["beats"]] == [0] and third["beats"][0]["where"] == "cell line 2"
    # a second after its last whole beacon, a busy rank's goes whole again (its time, its sequence)
    table.take(_beat(1, 4, 1.0), now=host_hub.FULL_BEAT_S)
    fourth = table.table(now=host_hub.FULL_BEAT_S)
    assert [(b["rank"], b["seq"]) for b in fourth["beats"]] == [(1, 4)]


def test_device_samples_wait_for_the_hosts_other_ranks_and_a_step_goes_soon():
    batch = MetricsBatch()
    for rank in range(8):  # one sample of each rank of the host, spread over most of a second
        batch.take(b'{"pub":"a","rank":%d,"host":"h","device":[[0,1.0]]}' % rank, now=rank * 0.1)
        assert not batch.due(now=rank * 0.1)
    assert batch.due(now=host_hub.DEVICE_METRICS_S)
    [one] = batch.parts(max_bytes=100_000)  # the eight samples: one message up
    assert one.count(b"\n") == 7 and batch.bodies == []
    batch.take(b'{"pub":"a","rank":0,"host":"h","device":[[1,1.0]]}', now=2.0)
    batch.take(b'{"pub":"a","rank":0,"host":"h","step":[[0,1.0]]}', now=2.05)
    assert not batch.due(now=2.1) and batch.due(now=2.05 + host_hub.METRICS_S)
    parts = batch.parts(max_bytes=60)  # split where a message would pass the size, none lost
    assert len(parts) == 2 and b"device" in parts[0] and b"step" in parts[1]


def _ranks(n: int) -> list[RankInfo]:
    return [RankInfo(r, r, 0, "vm", 10 + r, "cpu", 100 + r, hub=f"h{r // 2}") for r in range(n)]


def test_host_cell_says_done_and_who_raised_from_the_hosts_ends():
    ranks = _ranks(4)
    cell = HostCell("c", ranks)
    ok = {"status": "ok", "completed": 1.0}
    cell.take({"cell": "c", "hub": "h0", "done": [{"rank": 0, **ok}, {"rank": 1, **ok}]})
    assert not cell.done() and cell.waiting() == {2, 3} and cell.errored == []
    cell.take({"cell": "c", "hub": "h1", "done": [
        {"rank": 3, "status": "error", "ename": "ValueError", "evalue": "bad 3", "traceback": ["tb 3"]}]})
    assert cell.waiting() == {2}
    [child] = cell.errored
    error = child.output.metadata["error"]
    assert child is cell._children[3] and error.ename == "ValueError" and error.evalue == "bad 3"
    assert error.engine_info["engine_id"] == ranks[3].engine_id  # the engine of rank 3, not another's
    # the same end again (asked of the rank after its hub's): neither counted twice nor listed twice
    cell.take({"cell": "c", "hub": "", "done": [
        {"rank": 3, "status": "error", "ename": "ValueError", "evalue": "bad 3", "traceback": ["tb 3"]}]})
    assert len(cell.errored) == 1 and not cell.done()
    finished = []
    cell.add_done_callback(finished.append)
    cell.take({"cell": "c", "hub": "h1", "done": [{"rank": 2, **ok}]})
    assert cell.done() and finished == [cell]
    assert all(c.done() for c in cell._children)
