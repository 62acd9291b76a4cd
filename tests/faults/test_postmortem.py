"""`%dist debug RANK`: a failed rank's frames and locals, on a real 2-engine pool, until its next cell."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from tests.conftest import until
from workbench import RankError, session

pytestmark = pytest.mark.timeout(90)

FAILS_ON_RANK_1 = """\
import torch
def inner(a):
    b = torch.arange(12.).reshape(3, 4) * a
    label = "x" * 1000
    raise ValueError(f"boom on rank {rank}")
def outer(n):
    scale = n + 1
    return inner(scale)
if rank == 1:
    outer(2)
"""


def _fail(pool) -> None:
    with pytest.raises(RankError):
        pool.run(FAILS_ON_RANK_1)


def test_debug_shows_the_failing_frames_of_a_nested_function_with_their_locals(pool):
    _fail(pool)
    pm = pool.debug(1)
    assert pm.error == "ValueError: boom on rank 1"
    assert [(f["where"], f["name"]) for f in pm.frames] == [
        ("cell line 10", "<module>"), ("cell line 8", "outer"), ("cell line 5", "inner")]
    outer, inner = pm.frames[1], pm.frames[2]
    assert outer["locals"] == {"n": "2", "scale": "3"}
    assert inner["locals"]["a"] == "3"
    assert inner["locals"]["b"] == "Tensor(shape=(3, 4), dtype=torch.float32, device=cpu) [0, 3, 6, 9, ...]"
    assert inner["locals"]["label"].endswith("…") and len(inner["locals"]["label"]) < 200  # long reprs cut
    assert pm.frames[0]["locals"] == {}  # the cell's own frame: the names it uses (only functions here)
    text = pm.format()
    assert text.startswith("rank 1 failed: ValueError: boom on rank 1\nframe 0: cell line 10 in <module>")
    # an expression in a frame, on that rank
    assert pool.debug(1, expr="b.sum().item()") == "198.0"  # the innermost frame by default
    assert pool.debug(1, frame=1, expr="scale * 10") == "30"
    assert pool.debug(1, frame=1, expr="b") == "rank 1, frame 1: NameError: name 'b' is not defined"
    with pytest.raises(ValueError, match="no frame 7: the failed cell has frames 0-2"):
        pool.debug(1, frame=7, expr="1")


def test_debug_of_a_rank_that_did_not_fail_and_after_the_next_cell(pool):
    _fail(pool)
    with pytest.raises(ValueError, match="rank 0 has no failed cell to look at"):
        pool.debug(0)
    assert pool.debug(1).frames  # kept...
    pool.run("x = 1")
    kept = "rank 1 has no failed cell to look at: a failed cell's frames are kept until the next cell on that"
    with pytest.raises(ValueError, match=kept):
        pool.debug(1)  # ...until the next cell on that rank
    with pytest.raises(ValueError, match="--frame picks the frame"):
        pool.debug(1, frame=0)


def test_dist_debug_magic(ipshell, pool):
    _fail(pool)
    session.use(pool)
    try:
        with capture_output() as cap:
            ipshell.run_line_magic("dist", "debug 1")
        assert cap.stdout.startswith("rank 1 failed: ValueError: boom on rank 1"), cap.stdout
        assert "    scale = 3" in cap.stdout
        with capture_output() as cap:
            ipshell.run_line_magic("dist", "debug 1 --frame 2 -e 'b.shape'")
        assert cap.stdout.strip() == "torch.Size([3, 4])"
        with pytest.raises(UsageError, match="rank 0 has no failed cell"):
            ipshell.run_line_magic("dist", "debug 0")
        with pytest.raises(UsageError, match="rank 4 is out of range"):
            ipshell.run_line_magic("dist", "debug 4")
        with pytest.raises(UsageError, match="invalid int value"):
            ipshell.run_line_magic("dist", "debug one")
    finally:
        session.use(None)


def test_debug_while_a_cell_runs_says_so(pool):
    """This session's own cell: refused at once; a cell the rank runs for someone else: no answer in time."""
    from workbench.remote.door import Door
    from workbench.session import postmortem_report

    handle = pool.submit("import time\ntime.sleep(4)")
    door = Door(pool.pool)  # as another notebook's session would ask: its own door, no cell of its own
    try:
        with pytest.raises(ValueError, match="a cell is running on the pool"):
            pool.debug(1)
        assert until(lambda: "cell line 2" in pool.stacks(ranks=[1]).groups[0].headline, 20, every=0.1)
        with pytest.raises(ValueError, match="rank 1 did not answer within 0.5 s: a cell .* running on it"):
            postmortem_report.fetch(door, pool.ranks[1], timeout=0.5)
    finally:
        handle.wait(30)
        door.close()
