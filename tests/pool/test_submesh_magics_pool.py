"""Sub-meshes through the magics on a real 4-rank pool (issue 43, docs/submeshes.md): ``%dist split``,
``%%distributed --on``, ``--on`` with ``--async``, ``%dist status`` per sub-mesh, ``%dist join``, and the
mistakes a person makes, each a UsageError naming what would do."""

from __future__ import annotations

import pytest

from tests.conftest import pool_through_magics, run_cell
from workbench.session.cell_run import RunHandle

pytestmark = pytest.mark.timeout(180)

run = run_cell


@pytest.fixture(scope="module")
def pool(ipshell):
    yield from pool_through_magics(ipshell, "%dist start -n 4 --timeout 60 --backend gloo")


def test_split_run_on_a_sub_mesh_status_and_join(ipshell, pool):
    result, shown = run(ipshell, "%dist split 2 2 --names a,b")
    assert result.success, shown
    assert "split into a (ranks 0-1, world size 2), b (ranks 2-3, world size 2)" in shown
    try:
        result, shown = run(ipshell, "%%distributed --on b\nprint('sizes', rank, world_size, "
                                     "dist.get_world_size())")
        assert result.success, shown
        assert "[rank 2] sizes 0 2 2" in shown and "[rank 3] sizes 1 2 2" in shown  # pool ranks outside
        assert "[rank 0]" not in shown

        result, shown = run(ipshell, "%dist status")
        assert result.success, shown
        header = next(line for line in shown.splitlines() if line.split()[:2] == ["rank", "mesh"])
        assert header.split() == ["rank", "mesh", "host", "pid", "device", "state"]
        assert "sub-mesh a (ranks 0-1): formed (backend gloo, world size 2)" in shown

        ipshell.user_ns["lr"] = 0.01
        result, shown = run(ipshell, "%dist push lr --on b")
        assert result.success, shown
        assert pool.view([2, 3]).pull("lr") == [0.01, 0.01]
        result, shown = run(ipshell, "%%distributed --on a\nprint('has lr', 'lr' in dir())")
        assert "[ranks 0-1] has lr False" in shown, shown

        result, shown = run(ipshell, "%dist stacks --on b")
        assert result.success, shown
        assert "stacks of 2 ranks" in shown and "ranks 2-3: idle" in shown

        handles = []
        for mesh in ("a", "b"):
            result, shown = run(ipshell, f"%%distributed --on {mesh} --async\nimport os\nwhere = os.getpid()")
            assert result.success, shown
            assert isinstance(result.result, RunHandle)
            handles.append(result.result)
        for handle in handles:
            handle.wait(60)
        assert pool.pull("where") == [r.pid for r in pool.ranks]
        result, shown = run(ipshell, "%dist pull where --on b")  # that sub-mesh's ranks, in order
        assert result.success and result.result == [r.pid for r in pool.ranks[2:]], shown
        result, shown = run(ipshell, "%dist pull where --on b --rank 3")
        assert result.success and result.result == pool.ranks[3].pid, shown
        result, shown = run(ipshell, "%dist pull where --on b --rank 0")  # not in b: said, nothing pulled
        assert not result.success and "rank 0 is not in sub-mesh b (ranks 2-3)" in shown, shown
    finally:
        result, shown = run(ipshell, "%dist join")
    assert result.success, shown
    assert "joined: one process group of 4 ranks" in shown
    result, shown = run(ipshell, "%%distributed\nprint('world', world_size)")
    assert "[ranks 0-3] world 4" in shown, shown


@pytest.mark.parametrize(("line", "says"), [
    ("%dist split 3 2", "do not add up to the pool's 4 ranks"),
    ("%dist split 2 2 --names a,a", "'a' is given twice"),
    ("%dist split 4", "at least two sizes"),
    ("%%distributed --on a\npass", "the pool is not split"),
    ("%dist run x.py --on a", "the pool is not split"),
])
def test_mistakes_are_usage_errors(ipshell, pool, line, says):
    result, shown = run(ipshell, line)
    assert not result.success and type(result.error_in_exec).__name__ == "UsageError", shown
    assert says in str(result.error_in_exec)
