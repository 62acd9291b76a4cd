"""Inside an allocation (issue 37): the notebook's kernel runs inside a Slurm job on the two-node Slurm, as
Open OnDemand and batchspawner start it, on partitions that are not oversubscribed (as GPU partitions are).

- The fixture itself: a kernel inside an allocation of 1 and of 2 nodes, started by ``salloc`` on the login
  node or as the job's batch script on its first node, sees the job as those tools give it, and a step of
  that job starts on each of its nodes (``srun --jobid=J --overlap``).
- Today's behaviour that part 1 of issue 37 changes: ``%dist start -n 2 --launcher slurm`` inside the
  allocation submits a second job that pends behind the user's own; marked ``xfail(strict=True)`` so it
  turns into a failure (and is then un-marked) when part 1 lands.
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.slow]

SHAPES = [(1, "salloc"), (2, "salloc"), (1, "batch"), (2, "batch")]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("nodes", "how"), SHAPES, ids=[f"{n}-node-{h}" for n, h in SHAPES])
def test_a_kernel_inside_an_allocation_sees_its_job(allocation, nodes, how):
    result = allocation("allocation_env", nodes=nodes, how=how)
    env = result["env"]
    job = env["SLURM_JOB_ID"]
    assert job and job.isdigit(), env
    hosts = ["n1", "n2"][:nodes]
    assert env["SLURM_JOB_NODELIST"] == ("n[1-2]" if nodes == 2 else "n1"), env
    assert env["SLURM_JOB_NUM_NODES"] == str(nodes)
    assert env["SLURM_JOB_PARTITION"] == ("debug" if nodes == 2 else "one")
    # --exclusive: the job holds every CPU of its nodes (2 each)
    assert env["SLURM_JOB_CPUS_PER_NODE"] == ("2(x2)" if nodes == 2 else "2"), env
    [line] = result["squeue"].splitlines()
    assert line.split()[:3] == [job, "RUNNING", str(nodes)], line
    if how == "batch":  # Open OnDemand's and batchspawner's shape: the kernel on the job's first node
        assert result["hostname"] == "n1" and env["SLURMD_NODENAME"] == "n1", result
    else:  # salloc: the shell on the login node
        assert result["hostname"] not in hosts and env["SLURMD_NODENAME"] is None, result
    assert result["step_hosts"] == hosts, result["step_error"]
    assert "this notebook drives no pool" in result["magics"]
    # workbench doctor, from the kernel: the allocation, its nodes and the time left (30 minutes asked)
    doctor = result["doctor"]
    nodelist = env["SLURM_JOB_NODELIST"]
    assert f"allocation: inside Slurm job {job} ({nodes} node(s): {nodelist}; GPUs on this node: none; " \
           "time left " in doctor, doctor
    assert re.search(r"time left (29|30):\d\d\)", doctor), doctor


@pytest.mark.timeout(240)
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="part 1 of issue 37")
@pytest.mark.parametrize(("nodes", "how"), [(1, "salloc"), (2, "batch")],
                         ids=["1-node-salloc", "2-node-batch"])
def test_launcher_slurm_inside_an_allocation_queues_no_second_job(allocation, nodes, how):
    """Wanted: the allocation is the pool, no second job at any point of the start. Today a second job
    sits ``PENDING (Resources)`` behind the user's own, and the start fails after its timeout."""
    spec = {"partition": "debug" if nodes == 2 else "one", "interface": "wb0", "timeout": 20}
    try:
        result = allocation("allocation_slurm_start", spec, nodes=nodes, how=how, timeout=200)
    except AssertionError as exc:  # the harness failed: a real failure, not the expected one
        pytest.fail(f"the allocation's kernel did not run: {exc}")
    own = result["own_job"]
    others = {job: states for job, states in result["jobs_seen"].items() if job != own}
    print(f"inside Slurm job {own} ({nodes} node(s), {how}): other jobs seen during the start: {others}; "
          f"start {'failed: ' + result['start_error'] if 'start_error' in result else 'succeeded'} "
          f"after {result['start_s']:.1f} s")
    assert others == {}, f"a second job queued behind the allocation: {others}"
    assert "start_error" not in result, result["start_error"]
    assert {w["slurm_job"] for w in result["where"]} == {own}, "the engines are steps of the allocation"
    assert [w["sum"] for w in result["where"]] == [3.0, 3.0]
    assert result["left"] == []
    assert result["squeue_after"].split()[:1] == [own], "nothing but the allocation is left"

