"""A real one-node Slurm: a 2-engine pool through `%dist start --launcher slurm`, an all_reduce across it,
the preflight table, and `%dist stop` releasing the job (squeue empty)."""

from __future__ import annotations

import pytest

from tests.cluster import infra

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_pool_through_slurm(slurm_box, workdir):
    box, ns = slurm_box
    result = infra.run_driver(ns, "slurm", {}, timeout=200, env=box.env, workdir=workdir)
    print(f"Slurm: pool of 2 ready {result['start_s']:.1f} s after %dist start; job released "
          f"{result['release_s']:.1f} s after %dist stop")
    assert len(result["jobs"]) == 1
    job = result["jobs"][0]
    assert f"{job} RUNNING" in result["squeue_running"]
    where = result["where"]
    assert [w["sum"] for w in where] == [3.0, 3.0]
    assert {w["slurm_job"] for w in where} == {job}, "the engines run inside the Slurm job"
    assert sorted(w["slurm_procid"] for w in where) == ["0", "1"]
    assert "all checks passed." in result["check"]
    assert result["squeue_after_stop"] == "", "stop must release the Slurm job"
    assert result["left"] == []
    assert box.squeue() == []
