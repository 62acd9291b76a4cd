"""Fan-out per host on a real local pool (issue 42): four engines as two hosts of two
(``WORKBENCH_HOST_SIZE``), each with its hub. A cell leaves the kernel as one request, and comes back as one
message per host; a rank's output, value and error still name that rank; with ``WORKBENCH_FANOUT=0`` the same
pool has no hubs and a cell is one request per rank, as before."""

from __future__ import annotations

import os
import re

import pytest
from ipyparallel.error import CompositeError

from tests.conftest import alive, until
from workbench import RankError, Session
from workbench.remote.host_replies import HostCell

pytestmark = pytest.mark.timeout(240)

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _ipython_header(ename: str, traceback: str) -> bool:
    """Whether ``traceback`` is IPython's (its header: the exception's name, then "Traceback (most recent call
    last)" on one line; Python's own has neither on the line of the other)."""
    header = rf"^{ename} +Traceback \(most recent call last\)"
    return re.search(header, ANSI.sub("", traceback), re.M) is not None


def _raise_in(pid: int, text: str) -> int:
    """On a rank: ``ValueError(text)`` in the engine ``pid``, the engine's pid elsewhere."""
    if os.getpid() == pid:
        raise ValueError(text)
    return os.getpid()


def _cell(s: Session, code: str):
    """Run ``code`` on every rank; the cell run (its ``replies``: what the door started) and its result."""
    out: list = []
    cell = s._cell(None, 60, lambda who, kind, payload: out.append((who, kind, payload)))
    return cell, cell.rooms.run_cell(cell, code), out


def test_a_cell_goes_once_and_comes_back_once_per_host(monkeypatch):
    monkeypatch.setenv("WORKBENCH_FANOUT", "1")
    monkeypatch.setenv("WORKBENCH_HOST_SIZE", "2")
    monkeypatch.setenv("WORKBENCH_HUB_DONE_HOLD_S", "30")  # the ends of a host wait for each other: counted
    s = Session(n=4, timeout=90).start()
    pids = s.pids()
    try:
        assert s.hubs() == {"h0": (0, 1), "h1": (2, 3)}
        # the ranks' beacons and metrics come through their hubs: the hosts' tables and batches, read as the
        # ranks' own (every rank's beacon kept, every rank's device samples in the collector)
        beacons = s.rooms.beacons
        assert until(lambda: beacons.tables > 0 and set(beacons.latest) == {0, 1, 2, 3}, 30), beacons.latest
        assert until(lambda: set(s.metrics.devices) == {0, 1, 2, 3}, 30), (s.metrics.devices, s.metrics.stats)
        sent = len(s.client.history)
        cell, result, _ = _cell(s, "x = rank * 10")
        assert isinstance(cell.replies, HostCell)
        # the cell is one request for the four ranks; with the one call on every rank that follows a cell, two
        assert len(cell.replies.ar.msg_ids) == 1 and len(s.client.history) - sent == 2
        assert s.rooms.door.cell_counts(cell.replies) == {"h0": 1, "h1": 1}  # one message per host
        assert s.pull("x") == [0, 10, 20, 30]

        cell, result, out = _cell(s, "print('same'); print(f'rank {rank} here')")
        assert [r.stdout for r in result.ranks] == [f"same\nrank {r} here\n" for r in range(4)]
        hubs = {who for who, kind, _ in out if kind == "lines"}
        assert hubs == {"h0", "h1"}  # the lines came merged per host

        with pytest.raises(RankError) as raised:
            _cell(s, "if rank == 3:\n    raise ValueError(f'bad {rank}')")
        assert raised.value.rank == 3 and "ValueError" in str(raised.value) and "bad 3" in str(raised.value)
        err = raised.value.failures[0][1]
        # IPython's traceback of rank 3 (its header, and the cell's frame as IPython names it), not Python's
        assert _ipython_header("ValueError", err.traceback), err.traceback
        assert "Cell In[" in ANSI.sub("", err.traceback) and "bad 3" in err.traceback, err.traceback

        # a call on every rank (one broadcast request): the failing rank's error with IPython's traceback
        with pytest.raises(CompositeError) as raised:
            s.apply(_raise_in, s.ranks[2].pid, "bad call")
        [(ename, evalue, traceback, info)] = raised.value.elist
        assert (ename, evalue, info["engine_id"]) == ("ValueError", "bad call", s.ranks[2].engine_id)
        assert _ipython_header("ValueError", traceback), traceback
        assert "in _raise_in(pid, text)" in ANSI.sub("", traceback), traceback

        _, result, _ = _cell(s, "rank + 100")
        assert [r.result["text/plain"] for r in result.ranks] == ["100", "101", "102", "103"]
    finally:
        s.stop()
    assert alive(pids) == []


def test_without_fanout_a_cell_is_a_request_per_rank(monkeypatch):
    monkeypatch.setenv("WORKBENCH_FANOUT", "0")
    s = Session(n=2, timeout=90).start()
    pids = s.pids()
    try:
        assert s.hubs() is None
        sent = len(s.client.history)
        cell, result, _ = _cell(s, "x = rank")
        # the cell and the call that follows it, each once a rank
        assert not isinstance(cell.replies, HostCell) and len(s.client.history) - sent == 2 * 2
        assert s.pull("x") == [0, 1]
        with pytest.raises(CompositeError) as raised:  # ipyparallel's own apply: IPython's traceback as well
            s.apply(_raise_in, s.ranks[1].pid, "bad call")
        [(ename, _, traceback, _)] = raised.value.elist
        assert ename == "ValueError" and _ipython_header("ValueError", traceback), traceback
    finally:
        s.stop()
    assert alive(pids) == []


HELD = """\
import io
if rank == 2:
    io.open({go!r}).read()
"""


def test_with_hubs_a_ranks_stacks_error_post_mortem_and_death_name_that_rank(monkeypatch, tmp_path):
    """What comes back merged per host still says which rank it is: the stacks of a held rank (from its own
    pid), a rank's error and its post-mortem frames (evaluated on that rank), a rank that died (the fault and
    the cell's outcome)."""
    monkeypatch.setenv("WORKBENCH_FANOUT", "1")
    monkeypatch.setenv("WORKBENCH_HOST_SIZE", "2")
    s = Session(n=4, timeout=90).start()
    pids = s.pids()
    try:
        assert s.hubs() == {"h0": (0, 1), "h1": (2, 3)}
        go = tmp_path / "go"
        os.mkfifo(go)
        handle = s.submit(HELD.format(go=str(go)))
        try:
            def held():  # rank 2 waits in io.open at cell line 3, named first; the others finished the cell
                found = s.stacks()
                return [g.ranks for g in found.groups] == [[2], [0, 1, 3]] and \
                    found.groups[0].headline == "<module> at cell line 3" and found
            found = until(held, 30, every=0.2) and held()
            assert found, s.stacks().format()
            assert found.missing == []
            # each answer came from its rank's own process
            assert {r: found.answers[r]["pid"] for r in range(4)} == {r.rank: r.pid for r in s.ranks}
        finally:
            try:  # lets rank 2 go (ENXIO: it was not waiting yet)
                os.close(os.open(go, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            result = handle.wait(30)
        assert [r.outcome for r in result.ranks] == ["ok"] * 4

        with pytest.raises(RankError) as raised:
            _cell(s, "def f(here):\n    raise ValueError(f'bad {rank}')\nif rank == 1:\n    f(rank * 7)")
        assert raised.value.rank == 1 and "bad 1" in str(raised.value)
        post = s.debug(1)
        assert post.rank == 1 and "bad 1" in str(post.error)
        assert s.debug(1, expr="(rank, here)") == "(1, 7)"  # the frames are rank 1's own

        with pytest.raises(RankError) as raised:
            _cell(s, "import os, time\nif rank == 3:\n    os._exit(3)\ntime.sleep(0.5)")
        result = raised.value.result
        assert raised.value.rank == 3 and result.fault is not None and result.fault.rank == 3, result
        outcomes = [r.outcome for r in result.ranks]
        assert outcomes[3] == "died" and "died" not in outcomes[:3], outcomes
    finally:
        s.stop()
    assert alive(pids) == []
