"""`--launcher mpi`: engines under Debian's Open MPI `mpiexec`, on a machine of their own (a namespace with
loopback only); a rank that holds the interpreter for 5 s (no beacons) is not taken for lost; then the
idle release: a warning in the notebook first, then the pool stops by itself."""

from __future__ import annotations

import pytest

from tests.cluster import infra
from tests.cluster.conftest import need

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_pool_through_mpiexec_released_when_idle(lo_host, workdir):
    need("mpiexec")
    result = infra.run_driver(lo_host, "mpi", {"idle": 6}, timeout=150, workdir=workdir)
    print(f"mpi: pool of 2 ready {result['start_s']:.1f} s after %dist start")
    assert "mpiexec" in " ".join(result["process_names"]) or "orterun" in " ".join(result["process_names"])
    where = result["where"]
    assert [w["sum"] for w in where] == [3.0, 3.0]
    assert sorted(w["mpi_rank"] for w in where) == ["0", "1"], "the engines are mpiexec's ranks"
    # a rank silent for 5 s while it holds the interpreter is up (its gloo port answers), not lost
    assert result["held_ranks"] == [0, 1], result["held_output"]
    assert result["faults"] == [], result["faults"]
    assert "has been idle; it stops in" in result["idle_output"]
    assert "stopped the idle pool (2 ranks)" in result["idle_output"]
    assert not result["running_after_idle"]
    assert result["left"] == []
    assert lo_host.wait_empty() == [], "nothing of the pool is left on the host"
