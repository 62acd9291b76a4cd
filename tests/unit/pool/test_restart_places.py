"""Where `%dist restart` starts lost ranks off this machine (issue 26), the pure part: a Slurm pool's new
steps go to the job and node each lost rank ran in while the job holds it; else, and on MPI, one sentence
that counts the ranks left (never the dead ones) and offers them."""

from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.pool.launch import launcher_for, slurm_steps
from workbench.pool.rankmap import RankInfo

pytestmark = pytest.mark.timeout(30)


def ranks(n: int, job: str = "7", node: str = "gpu01") -> list[RankInfo]:
    return [RankInfo(i, i, 0, node, 100 + i, f"cuda:{i}", i, None, job, node) for i in range(n)]


def one_sentence(text: str) -> bool:
    return "\n" not in text and text.endswith(".") and text.count(". ") == 0


def test_mpi_says_what_it_can_do_and_counts_the_survivors():
    members = ranks(4)
    with pytest.raises(ValueError) as err:
        launcher_for(PoolConfig(launcher="mpi")).where_to_start(None, members[1:2], members, print)
    text = str(err.value)
    assert text.startswith("an MPI pool cannot start engines for lost ranks: mpiexec")
    assert "go on with the 3 ranks left (`%dist scale 3`), or stop and start the pool." in text
    assert one_sentence(text), text


def test_slurm_lost_ranks_go_back_to_their_job_and_node_while_it_holds_it():
    members = ranks(4)[:2] + ranks(4, job="8", node="gpu02")[2:]
    asked = []

    def held(job):
        asked.append(job)
        return "RUNNING", ["gpu01", "gpu02"]

    placement = slurm_steps.place([members[1], members[2], members[3]], left=1, held=held)
    assert placement == {("7", "gpu01"): 1, ("8", "gpu02"): 2}
    assert asked == ["7", "8"], "squeue is asked once per job"


@pytest.mark.parametrize("state, nodes, why", [
    ("ENDED", [], "Slurm job 7 has ended, so the allocation no longer holds node gpu01 for rank 1"),
    ("RUNNING", ["gpu03"], "Slurm job 7 (running) no longer holds node gpu01 for rank 1"),
    ("COMPLETING", ["gpu01"], "Slurm job 7 has ended, so the allocation no longer holds node gpu01 for "
                              "rank 1"),
    ("SUSPENDED", ["gpu01"], "Slurm job 7 (suspended) no longer holds node gpu01 for rank 1"),
])
def test_slurm_a_job_that_lost_the_node_is_one_sentence_offering_the_ranks_left(state, nodes, why):
    members = ranks(3)
    with pytest.raises(ValueError) as err:
        slurm_steps.place(members[1:2], left=2, held=lambda job: (state, nodes))
    text = str(err.value)
    assert text == f"{why}: go on with the 2 ranks left (`%dist scale 2`), or stop and start the pool."
    assert one_sentence(text)


def test_the_step_runs_one_engine_with_the_pools_engine_settings():
    kw = slurm_steps.step_set_kwargs("7", "gpu01", gpus_per_node=4, env={"WORKBENCH_POOL": "ab"},
                                     engine_args=["--IPEngine.enable_nanny=False"], log="/tmp/pool.log")
    srun = kw["engine_cmd"][:kw["engine_cmd"].index("-m") - 1]
    assert srun[:3] == ["srun", "--jobid=7", "--nodelist=gpu01"]
    assert {"--nodes=1", "--ntasks=1", "--overlap", "--gpus-per-node=4"} <= set(srun)
    assert kw["engine_cmd"][-2:] == ["-m", "ipyparallel.engine"]
    assert kw["environment"] == {"WORKBENCH_POOL": "ab"} and kw["pool_log"] == "/tmp/pool.log"
