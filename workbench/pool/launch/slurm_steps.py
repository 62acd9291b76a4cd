"""New engines for lost ranks of a Slurm pool: a step of the rank's own job, on its node, while that job
still holds the node.

A Slurm pool's engines are the tasks of one ``srun`` inside its sbatch job
(:func:`workbench.pool.launch.slurm.slurm_script`).
A lost rank comes back as a step of its own in the same job (its allocation: its CPUs and GPUs), started
from this machine: ``srun --jobid=J --nodelist=NODE -N1 -n1 --overlap ...`` runs one ipengine with the
pool's engine settings, so it registers to the same controller. ``--overlap``: the job's first step
holds every CPU of the allocation, and the new step shares them, as the lost task did. The ``srun``
runs here, is one of the pool's processes (tagged, recorded, ended with the pool) and its step ends
when it does; the job's ``scancel`` at the pool's stop ends it too.

When the job no longer holds the node (it ended, or it is not running any more), the rank cannot come
back inside it: :func:`place` raises one sentence that says so and offers the ranks left.

>>> place([type("R", (), {"rank": 1, "host": "n1", "slurm_job": "12", "slurm_node": "n1"})()], left=1,
...       held=lambda job: ("RUNNING", ["n1"]))
{('12', 'n1'): 1}
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable

from ipyparallel.cluster.launcher import ipengine_cmd_argv

from workbench.pool.launch import allocation
from workbench.pool.launch.base import go_on

SQUEUE_TIMEOUT_S = 10
# squeue's states of a job that is over or on its way out (a cancelled job shows COMPLETING for seconds)
ENDED = {"ENDED", "COMPLETING", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def step_command(job: str, node: str, gpus_per_node: int | None = None) -> list[str]:
    """The ``srun`` that runs one engine as a new step of ``job`` on ``node`` (the engine's command
    follows it). ``--input=none``: the step reads nothing from this kernel's stdin. With GPUs the
    step asks for the node's GPUs, which the job's first step holds too (``--overlap``), so the new
    engine sees them as the lost one did and the rank map gives it the lost rank's device.

    >>> step_command("12", "n1")
    ['srun', '--jobid=12', '--nodelist=n1', '--nodes=1', '--ntasks=1', '--overlap', '--input=none', \
'--kill-on-bad-exit=0']
    >>> step_command("12", "n1", 4)[-1]
    '--gpus-per-node=4'
    """
    command = ["srun", f"--jobid={job}", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--overlap",
               "--input=none", "--kill-on-bad-exit=0"]
    return command + ([f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else [])


def step_set_kwargs(job: str, node: str, *, gpus_per_node: int | None, env: dict[str, str],
                    engine_args: list[str], log: str) -> dict:
    """Keyword arguments for ``Cluster.start_engines`` with the pool's local engine set launcher
    (:class:`workbench.pool.launch.spawn.CancellableEngineSetLauncher`): each engine is its own ``srun`` step,
    with the engine arguments and environment the sbatch job's engines got.

    >>> kw = step_set_kwargs("12", "n1", gpus_per_node=None, env={"A": "1"}, engine_args=["--x"], log="/l")
    >>> kw["engine_cmd"][:2], kw["engine_cmd"][-2:], kw["pool_log"], kw["engine_args"]
    (['srun', '--jobid=12'], ['-m', 'ipyparallel.engine'], '/l', ['--x'])
    """
    return {"engine_cmd": [*step_command(job, node, gpus_per_node), *ipengine_cmd_argv], "delay": 0,
            "pool_log": log, "environment": dict(env), "engine_args": list(engine_args)}


def held_nodes(job: str) -> tuple[str, list[str]]:
    """``job``'s state as squeue says (``"ENDED"`` once Slurm forgot it) and the nodes it holds."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T|%N"], capture_output=True, text=True,
                             timeout=SQUEUE_TIMEOUT_S).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"squeue did not answer ({exc}): whether Slurm job {job} still holds its nodes is "
                         "unknown; try `%dist restart` again.") from None
    state, _, nodelist = out.partition("|")
    if not state:
        return "ENDED", []
    return state, allocation.hostnames(nodelist)


def place(lost: list, left: int, held: Callable[[str], tuple[str, list[str]]] = held_nodes
          ) -> dict[tuple[str, str], int]:
    """``{(job, node): engines}`` for one new step per rank of ``lost`` (RankInfos), each in the job and
    on the node its engine ran in; ``left``: the ranks still running. Raises ValueError, one sentence,
    where a job no longer holds its rank's node.

    >>> r = type("R", (), {"rank": 2, "host": "n1", "slurm_job": "13", "slurm_node": "n1"})()
    >>> place([r], left=2, held=lambda job: ("ENDED", []))
    Traceback (most recent call last):
    ...
    ValueError: Slurm job 13 has ended, so the allocation no longer holds node n1 for rank 2: go on with \
the 2 ranks left (`%dist scale 2`), or stop and start the pool.
    """
    states: dict[str, tuple[str, list[str]]] = {}
    placement: Counter = Counter()
    for r in lost:
        job, node = r.slurm_job, r.slurm_node or r.host
        if not job:
            raise ValueError(f"rank {r.rank}'s engine did not say which Slurm job it ran in, so no step can "
                             f"start for it: {go_on(left)}")
        if job not in states:
            states[job] = held(job)
        state, nodes = states[job]
        if state in ENDED:
            raise ValueError(f"Slurm job {job} has ended, so the allocation no longer holds node {node} for "
                             f"rank {r.rank}: {go_on(left)}")
        if state != "RUNNING" or node not in nodes:
            raise ValueError(f"Slurm job {job} ({state.lower()}) no longer holds node {node} for rank "
                             f"{r.rank}: {go_on(left)}")
        placement[(job, node)] += 1
    return dict(placement)
