"""A lost rank back on a real one-node Slurm (issue 26): a new step of the pool's job on the rank's node.

A 2-rank pool through `%dist start --launcher slurm`; rank 1's engine is killed (SIGKILL) and
`%dist restart` starts its new engine as a step of the same job (`srun --jobid=J --overlap`): same rank,
host and device, an all_reduce over both ranks, rank 0's Python state kept. Then a third rank in a job of
its own, that job cancelled: the allocation no longer holds the node for that rank, and `%dist restart`
says so in one sentence (no traceback), offering the ranks left; `%dist scale 2` goes on with them.
With ``ElasticConfig(replace=True)`` a rank killed mid-run comes back by itself the same way and joins
at a step boundary. Every test: nothing of the pool left (processes in the box, squeue jobs and steps).
"""

from __future__ import annotations

import contextlib

import psutil
import pytest
import torch

from tests.cluster import infra
from tests.faults.test_elastic import check_every_sample_once, reference, setup_code

pytestmark = [pytest.mark.slow]


def left_in_box(box, ns) -> list[str]:
    """The processes in the box's namespace other than its Slurm daemons and slurmctld's own helper
    (``slurmscriptd``): none once the pool stopped."""
    keep = {p.pid for p in box.procs.values()}
    for pid in list(keep):
        with contextlib.suppress(psutil.Error):
            keep |= {c.pid for c in psutil.Process(pid).children() if c.name() == "slurmscriptd"}
    return ns.wait_empty(keep=keep)


@pytest.mark.timeout(420)
def test_slurm_restart_is_a_new_step_and_a_lost_allocation_is_one_sentence(slurm_box, workdir):
    box, ns = slurm_box
    result = infra.run_driver(ns, "slurm_restart", {}, timeout=380, env=box.env, workdir=workdir)
    job = result["jobs"][0]
    before, after = result["ranks"], result["ranks_restarted"]
    assert result["seen_dead"], "the killed engine was not seen dead"
    print(f"Slurm: %dist restart of a killed rank (a new step, its engine up, the group re-formed) took "
          f"{result['restart_s']:.1f} s")
    assert "restarted rank 1" in result["restart"], result["restart"]
    # same rank, host, device and job; a new engine, in a step of its own
    keep = ("rank", "local_rank", "host", "device", "slurm_job", "slurm_node")
    assert [{k: r[k] for k in keep} for r in after] == [{k: r[k] for k in keep} for r in before]
    assert after[0]["pid"] == before[0]["pid"] and after[1]["pid"] != before[1]["pid"]
    assert {r["slurm_job"] for r in after} == {job}
    steps_before, steps_after = result["steps_before"], result["steps_after"]
    assert [s[:2] for s in steps_before] == [[job, "0"], [job, "0"]]
    assert steps_after[0] == steps_before[0], "rank 0 is the same engine, in the job's first step"
    assert steps_after[1][0] == job and steps_after[1][1] not in ("0", "batch"), steps_after
    assert f"{job}.{steps_after[1][1]}" in result["squeue_steps"], result["squeue_steps"]
    assert result["sums"] == [3.0, 3.0]
    assert result["kept"] == [0, before[0]["pid"]], "rank 0 keeps its Python state"
    assert result["attached_jobs"] == [job], "another process still attaches to the pool from its files"

    # the third rank's job cancelled: the allocation lost its node, one sentence, the ranks left offered
    third = result["third"]["slurm_job"]
    assert third != job and sorted(result["jobs_scaled"]) == sorted([job, third])
    assert result["seen_dead_third"]
    refused = result["refused"].strip().splitlines()
    node = result["third"]["slurm_node"]
    assert refused == [f"UsageError: Slurm job {third} has ended, so the allocation no longer holds node "
                       f"{node} for rank 2: go on with the 2 ranks left (`%dist scale 2`), or stop and start "
                       "the pool."], refused
    assert "going on without rank 2" in result["scaled_back"]
    assert result["sums_after"] == [3.0, 3.0]
    assert result["kept_after"] == [0, before[0]["pid"]]

    assert result["squeue_after_stop"] == "" and result["steps_after_stop"] == "", "no job or step left"
    assert result["left"] == []
    assert box.squeue() == []
    assert left_in_box(box, ns) == []


@pytest.mark.timeout(560)
def test_slurm_replace_true_brings_a_killed_rank_back_as_a_step(slurm_box, workdir):
    box, ns = slurm_box
    steps = 1500
    setup = setup_code().replace("hang_timeout=3,", "hang_timeout=30, replace=True,")
    assert "replace=True" in setup
    spec = {"setup": setup, "steps": steps, "at_step": 10, "wait": 420}
    result = infra.run_driver(ns, "slurm_replace", spec, timeout=520, env=box.env, workdir=workdir)
    job = result["jobs"][0]
    assert result["outcomes"] == ["lost", "ok", "ok"], result["outcomes"]
    assert result["world_size"] == 2 and result["steps"] == [steps, steps]
    last = result["events"][-1]
    assert last["joined"] == [1] and last["world_size"] == 2, result["events"]
    assert f"{job}.1 " in result["squeue_steps"] + " ", result["squeue_steps"]
    check_every_sample_once(result["step_log"], steps)
    want = reference(steps)
    for params in result["params"]:
        got = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}
        torch.testing.assert_close(got, want)
    assert result["squeue_after_stop"] == "" and result["steps_after_stop"] == ""
    assert result["left"] == []
    assert box.squeue() == []
    assert left_in_box(box, ns) == []
