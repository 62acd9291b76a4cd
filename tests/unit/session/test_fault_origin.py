"""A failure is a root cause or an echo by where it came from, not by its type or text (issue 15)."""

from types import SimpleNamespace

import pytest

from workbench import faults
from workbench.engine.guard import failure_origin
from workbench.pool.rankmap import RankInfo
from workbench.session.results import CellResult, RankResult

pytestmark = pytest.mark.timeout(10)


def _failed(rank, ename, evalue, completed, origin):
    info = RankInfo(rank, rank, 0, "h", 100 + rank, f"cuda:{rank}", rank)
    return RankResult(info, error=SimpleNamespace(ename=ename, evalue=evalue),
                      completed=SimpleNamespace(timestamp=lambda: completed), origin=origin)


def test_an_nccl_error_after_a_cuda_oom_is_the_root_cause_not_an_echo():
    # rank 1 ran out of memory inside NCCL (its backend reports COMM_ERROR); rank 0 was aborted because of it
    # and failed first on the clock
    echo = _failed(0, "DistBackendError", "NCCL communicator was aborted", 1.0, "aborted")
    root = _failed(1, "DistBackendError", "NCCL error: unhandled cuda error (out of memory)", 2.0, "local")
    assert [r.rank.rank for r in CellResult([echo, root], 3.0).failures()] == [1, 0]
    assert not faults.is_secondary(root.error.ename, root.error.evalue, root.origin)


def test_the_origin_a_rank_reports():
    timeout = RuntimeError("watchdog")
    assert failure_origin(timeout, aborted=False, backend_errors=["TIMEOUT"]) == "peer"
    assert failure_origin(timeout, aborted=True, backend_errors=["COMM_ERROR"]) == "aborted"
    assert failure_origin(timeout, aborted=False, backend_errors=[]) is None  # unknown: type and text decide
    beat = {"aborted_at": None, "failure": {"t": 5.0, "origin": "local"}}
    assert faults.origin_of(beat, since=4.0) == "local"
    assert faults.origin_of(None, since=4.0) is None


def test_the_abort_that_answered_a_root_cause_does_not_make_it_an_echo():
    # rank 1 raised at t=10.2; the kernel then aborted its group at t=10.5 to release the others
    beat = {"aborted_at": 10.5, "failure": None}
    assert faults.origin_of(beat, since=10.0, failed_at=10.2) is None
    assert not faults.is_secondary("ValueError", "bad batch", faults.origin_of(beat, 10.0, 10.2))
    assert faults.origin_of(beat, since=10.0, failed_at=10.9) == "aborted"  # failed after its abort: an echo
