"""Inside an allocation (issue 37): the notebook's kernel runs inside a Slurm job on the two-node Slurm, as
Open OnDemand and batchspawner start it, on partitions that are not oversubscribed (as GPU partitions are).

- The fixture itself: a kernel inside an allocation of 1 and of 2 nodes, started by ``salloc`` on the login
  node or as the job's batch script on its first node, sees the job as those tools give it, and a step of
  that job starts on each of its nodes (``srun --jobid=J --overlap``).
- Part 1 of issue 37: the allocation is the pool. ``%dist start -n 2 --launcher slurm`` inside it queues
  no second job (it did before: the second job pended behind the user's own; the test was an expected
  failure until then); ``%dist start`` with no launcher takes every slot of every node as steps of the job,
  restarts and scales inside it.
"""

from __future__ import annotations

import re

import pytest

from tests.cluster import infra
from tests.cluster.conftest import need
from workbench.pool.launch import allocation as slurm_job

pytestmark = [pytest.mark.slow]

@pytest.mark.timeout(30)
def test_a_node_list_reads_as_slurm_expands_it(tmp_path, monkeypatch):
    """The job's nodes are named as Slurm's own ``scontrol show hostnames`` names them (it reads slurm.conf
    and asks no daemon): two ranges in one name, zero-padding, a name without a range. The hand-written
    parser this replaced read ``a[1-2]b[3-4]`` as ``a1b, a2b, 3-4]``."""
    need("scontrol")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=wb\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert slurm_job.hostnames("a[1-2]b[3-4],gpu[08-10,12],login") == [
        "a1b3", "a1b4", "a2b3", "a2b4", "gpu08", "gpu09", "gpu10", "gpu12", "login"]
    assert slurm_job.hostnames("") == []


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
@pytest.mark.parametrize(("nodes", "how"), [(1, "salloc"), (2, "batch")],
                         ids=["1-node-salloc", "2-node-batch"])
def test_launcher_slurm_inside_an_allocation_queues_no_second_job(allocation, nodes, how):
    """The allocation is the pool, no second job at any point of the start (before part 1 of issue 37 a
    second job sat ``PENDING (Resources)`` behind the user's own, and the start failed after its timeout)."""
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




POOL_SHAPES = [(1, "salloc"), (2, "batch")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("nodes", "how"), POOL_SHAPES, ids=[f"{n}-node-{h}" for n, h in POOL_SHAPES])
def test_the_allocation_is_the_pool(allocation, nodes, how):
    """Part 1 of issue 37: inside a job of 1 or 2 whole nodes (2 CPUs, so 2 tasks, each), `%dist start` with
    no launcher starts one engine per allocated task on every node as steps of that job, ranks contiguous per
    node in the job's node order; `-n` above the job is refused with the numbers, below it uses part of it
    and says so; status, `workbench pools` say which job and its time left; a killed rank comes back as a
    new step on its node; the pool scales down and back up inside the job, not past it; no second job at
    any point, no step left after `%dist stop`."""
    slots = 2 * nodes
    hosts = [h for h in ("n1", "n2")[:nodes] for _ in range(2)]
    result = allocation("allocation_pool", {"too_many": slots + 1, "part": slots - 1}, nodes=nodes, how=how,
                        timeout=260)
    own = result["own_job"]
    words = f"Slurm job {own} ({nodes} node{'s' if nodes > 1 else ''}, {slots} tasks, no GPU)"
    too_many = result["too_many"]
    assert f"UsageError: -n {slots + 1} is more than Slurm job {own} holds: {nodes} node" in too_many
    assert f"= {slots} ranks (one per task). Start at most {slots}" in result["too_many"]
    assert f"{slots - 1} ranks use part of {words}: " in result["part"], result["part"]
    assert [h for _, h in result["part_ranks"]] == hosts[:-1]
    print(f"inside {words} ({how}): %dist start with no launcher took {result['start_s']:.1f} s")
    assert f"inside {words} · " in result["started"] and " min left" in result["started"], result["started"]
    # every slot of every node, as steps of the job: one step per node, ranks contiguous in node order
    ranks = result["ranks"]
    assert [r["host"] for r in ranks] == hosts and [r["local_rank"] for r in ranks] == [0, 1] * nodes
    assert {r["slurm_job"] for r in ranks} == {own} and [r["slurm_node"] for r in ranks] == hosts
    steps = {tuple(s[:2]) for s in result["steps"]}
    assert len(steps) == nodes and all(job == own and step.isdigit() for job, step in steps), result["steps"]
    assert sorted(line.split()[1] for line in result["steps_running"]) == sorted(set(hosts))
    assert [w["sum"] for w in result["where"]] == [float(sum(range(1, slots + 1)))] * slots
    assert re.search(rf"^inside {re.escape(words)} · (29|30) min left$", result["status"], re.M), \
        result["status"]
    assert "launcher allocation" in result["status"]
    assert f"inside Slurm job {own}" in result["pools_cli"] and "min left" in result["pools_cli"]
    # a killed rank: a new step of the job on its node, the others untouched
    assert result["seen_dead"] and "restarted rank" in result["restart"], result["restart"]
    keep = ("rank", "local_rank", "host", "slurm_job", "slurm_node")
    assert [{k: r[k] for k in keep} for r in result["ranks_restarted"]] == [{k: r[k] for k in keep}
                                                                          for r in ranks]
    before, after = result["steps"], result["steps_restarted"]
    assert after[:-1] == before[:-1] and after[-1][0] == own and after[-1][1] not in {s for _, s in steps}
    # down by one and back up into the free slot, inside the job; past it refused with the numbers
    assert [r[1:] for r in result["ranks_scaled"]] == [[h, own] for h in hosts]
    assert f"is more than Slurm job {own} holds" in result["too_many_scale"]
    assert result["sums_scaled"] == [float(sum(range(1, slots + 1)))] * slots
    # no second job at any point, no step and no process of the pool left
    assert result["jobs_seen"] == {own: ["RUNNING (None)"]}, result["jobs_seen"]
    assert result["steps_after_stop"] == [] and result["left"] == []



@pytest.mark.timeout(300)
def test_the_walltime_warns_checkpoints_and_ends_the_pool(allocation, workdir):
    """Part 2 of issue 37: inside an allocation of 1 minute, with ``--walltime-warning 40``: the time left
    in the pool's state, ``%dist status`` and ``workbench pools``; 40 s before the end the notebook is warned
    once and the running Trainer's ``wb.Checkpoint`` (``every`` far away) saves at its next step on every
    rank; when Slurm ends the job the pool stops by itself and says so once, no step and no process of it
    left."""
    ckpt = workdir / "walltime-ckpt"
    result = allocation("walltime", {"warning": 40, "ckpt": str(ckpt), "limit": 90}, nodes=1, how="salloc",
                        timeout=280, minutes=1)
    check_the_walltime(result, ckpt, "inside")


@pytest.mark.timeout(300)
def test_a_pools_own_slurm_job_has_its_walltime_watched_too(slurm_box, workdir):
    """Part 2 of issue 37 for ``--launcher slurm --time 1`` (the pool's own job, the kernel outside Slurm):
    the same warning, checkpoint and end of the pool as inside an allocation."""
    box, ns = slurm_box
    ckpt = workdir / "walltime-ckpt"
    spec = {"warning": 40, "ckpt": str(ckpt), "limit": 90,
            "start": "--launcher slurm -n 2 --interface lo --partition debug --time 1 --timeout 120"}
    result = infra.run_driver(ns, "walltime", spec, timeout=280, env=box.env, workdir=workdir)
    check_the_walltime(result, ckpt, "in")


def check_the_walltime(result: dict, ckpt, where: str) -> None:
    """What a pool whose Slurm job (``where``: "inside" the kernel's, "in" its own) ends within a minute
    shows: the time left, one warning ``warning`` s before the end, the checkpoint at the same step on every
    rank, then the pool stopped by itself with one sentence, nothing of it left."""
    own, ends, ready = result["own_job"], result["ends"], result["ready"]
    assert ends is not None and 0 < ends - ready <= 60, result
    job = f"Slurm job {own} (1 node, 2 tasks, no GPU)"
    assert re.search(rf"^{where} {re.escape(job)} · \d+ s left$", result["status"], re.M), result["status"]
    assert f"{where} {job} · " in result["pools_cli"], result["pools_cli"]
    # one warning, 40 s before the end (or at once, had the start taken longer), then the checkpoint
    [(warned_at, warning)] = result["told_at_save"]
    assert warning.startswith(f"workbench: {job} ends in "), warning
    assert "a running Trainer with a wb.Checkpoint callback saves at its next step" in warning
    assert 0 < ends - warned_at <= 41, (ends, warned_at)
    [(saved, step0), (saved1, step1)] = result["asked"]
    assert saved == saved1 == [step0] and step0 == step1, result["asked"]  # the same step on every rank
    assert (ckpt / "latest").read_text() == f"step-{step0:06d}"
    assert f"at step {step0}, as the notebook asked (the pool's Slurm job ends soon)" in result["train"]
    print(f"{job}: pool ready {ends - ready:.0f} s before the end, warned {ends - warned_at:.0f} s before "
          f"it, checkpoint at step {step0}; the pool stopped {result['stopped_at'] - ends:.0f} s after it")
    # the job's end: the pool stops by itself and says so, once
    assert result["stopped_by_itself"], result["told"]
    assert [text for _, text in result["told"]][1:] == [
        f"workbench: {job} has ended (its time limit, or it was cancelled): Slurm ended its steps and the "
        "pool was stopped; start a new allocation, then `%dist start`."], result["told"]
    assert result["steps_after"] == [] and result["left"] == [], result


@pytest.mark.timeout(600)
def test_a_node_of_the_allocation_cut_off_mid_run_goes_on_then_comes_back_inside_the_job(allocation):
    """Part 4 of issue 37: an elastic DDP run on every slot of a 2-node allocation (4 ranks, steps of the
    job), n2's cable cut on the switch side mid-run: one fault naming n2, the run goes on on n1's ranks with
    the parameters of a single-process run; `%dist restart` while n2's slurmd does not answer says so in one
    sentence (n1 has no free slot); the cable back, the cut-off engines fence themselves and `%dist restart`
    brings the ranks back as a new step of the job on n2."""
    from tests.cluster.test_hostlost import check_params
    from tests.faults.test_elastic import check_every_sample_once, setup_code

    n2 = allocation.cluster.hosts["n2"][0]
    steps = 40
    spec = {"allocation": True, "interface": "wb0", "steps": steps, "at_step": 8, "port": "port2",
            "setup": setup_code().replace("hang_timeout=3", "hang_timeout=30"), "wait": 150,
            "netns": n2.name, "keep": n2.pids(), "fence_wait": 30, "restart_after_up": True}
    result = allocation("ssh_cut", spec, nodes=2, how="salloc", timeout=560)
    assert "cell_error" not in result, result["cell_error"]
    assert [r[1] for r in result["ranks"]] == ["n1", "n1", "n2", "n2"]
    outcomes = sorted((host, outcome) for _, host, outcome in result["outcomes"])
    assert outcomes == [("n1", "ok"), ("n1", "ok"), ("n2", "lost"), ("n2", "lost")], result["outcomes"]
    [fault] = result["faults"]
    assert fault["first_failure"].startswith("host n2 lost: ranks 2-3"), fault["first_failure"]
    cut_to_step = fault["time"] - result["t_cut"] + fault["recover_s"]
    print(f"inside a 2-node allocation, n2 cut -> detected {fault['detect_s']:.2f} s -> next step "
          f"{cut_to_step:.2f} s; cable back -> the cut-off engines gone in {result['fenced_s']:.1f} s")
    assert "after_error" not in result, result["after_error"]
    assert [r[1] for r in result["ranks_after"]] == ["n1", "n1"] and result["steps"] == [steps, steps]
    check_every_sample_once(result["step_log"], steps)
    check_params(result, steps)
    assert result["all_reduce"] == [2.0, 2.0]
    # n2 cut: no free slot on n1, one sentence; back: a new step of the job on n2
    said = result.get("restart_error", "")
    assert "node n2 of Slurm job " in said and "does not answer (its slurmd)" in said, result.get(
        "restart_output", said)
    assert result["left_on_cut_host"] == [], result["fence_heard"]
    assert "restart_up_error" not in result, result["restart_up_error"]
    assert [r[1] for r in result["ranks_restarted_up"]] == ["n1", "n1", "n2", "n2"]
    assert result["all_reduce_restarted_up"] == [4.0] * 4
