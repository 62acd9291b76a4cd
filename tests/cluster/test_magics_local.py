"""`%dist scale` and `%dist check` on a real local pool, and the start options' usage errors (which must
start nothing)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from tests.conftest import alive
from workbench import session
from workbench.pool.records import state as pool_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def run(ip, cell):
    with capture_output() as cap:
        result = ip.run_cell(cell)
    return result, cap.stdout + cap.stderr


@pytest.mark.parametrize("line, message", [
    ("%dist start --launcher ssh", "needs the hosts"),
    ("%dist start --launcher ssh --hosts n1,n2", "cannot reach this kernel on loopback"),
    ("%dist start --launcher slurm --nodes 2", "cannot reach this kernel on loopback"),
    ("%dist start --interface nope0", "no network interface 'nope0'"),
    ("%dist start --launcher slurm --time soon --interface lo", "not a Slurm time limit"),
])
def test_start_mistakes_start_nothing(ipshell, line, message):
    before = {s.id for s in pool_state.list_states()}
    with pytest.raises(UsageError, match=message):
        ipshell.run_line_magic("dist", line.removeprefix("%dist "))
    assert {s.id for s in pool_state.list_states()} == before
    assert session.current_or_none() is None


def test_check_and_scale_local_pool(ipshell):
    result, shown = run(ipshell, "%dist start -n 2 --timeout 90")
    assert result.success, shown
    s = session.current()
    first_pids = s.pids()
    try:
        result, shown = run(ipshell, "%dist check --size-mb 1")
        assert result.success, shown
        lines = shown.splitlines()
        assert lines[0].split()[:4] == ["rank", "host", "device", "device"]
        assert "all_reduce over 2 ranks on 1 node" in shown and "all checks passed." in shown
        assert "versions: the same on every rank" in shown

        result, shown = run(ipshell, "%dist scale 3")
        assert result.success, shown
        assert "scaled from 2 to 3 ranks" in shown and s.world_size == 3
        assert "the outputs above this line come from the world of 2 ranks" in shown
        result, shown = run(ipshell, "%%distributed\nimport torch\nt = torch.ones(1)\ndist.all_reduce(t)")
        assert result.success, shown
        assert [t.item() for t in s.pull("t")] == [3.0, 3.0, 3.0]
        grown_pids = s.pids()

        result, shown = run(ipshell, "%dist scale 1")
        assert result.success, shown
        assert s.world_size == 1 and [r["rank"] for r in s.status()] == [0]
        result, shown = run(ipshell, "%%distributed\nt = torch.ones(1) * 5\ndist.all_reduce(t)")
        assert result.success, shown
        assert s.pull("t")[0].item() == 5.0, "rank 0 kept its Python state (torch is imported)"
    finally:
        all_pids = set(first_pids) | set(locals().get("grown_pids", []))
        result, shown = run(ipshell, "%dist stop")
    assert result.success, shown
    assert alive(sorted(all_pids)) == []
