"""``--launcher slurm``: one sbatch job whose ``srun`` starts every engine, one task per GPU on every node.

ipyparallel's Slurm engine-set launcher (:class:`~workbench.pool.launch.spawn.PoolSlurmEngineSetLauncher`)
submits our own batch script (:func:`slurm_script`): ``--nodes``, ``--ntasks-per-node``, ``--gpus-per-node``,
``--partition``, ``--time``, ``--account``. Every engine sees its node's GPUs and the rank map pins rank
``local_rank`` to ``cuda:local_rank``. A lost rank comes back as a new step of its own job on its node,
while that job still holds the node (:mod:`workbench.pool.launch.slurm_steps`); a start that waits says what
Slurm says of its job (``squeue``).

>>> launcher = Slurm(PoolConfig(launcher="slurm", nodes=2, gpus_per_node=4))
>>> launcher.default_engines(), launcher.needs_routable_address()
(8, True)
>>> launcher.engine_set_kwargs(2, work_dir="/tmp/x", env={}, engine_args=[])["batch_file_name"]
'/tmp/x/slurm_engine.sbatch'
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ipyparallel.cluster.launcher import BatchSystemLauncher

from workbench.config import PoolConfig
from workbench.pool.launch import allocation, slurm_steps
from workbench.pool.launch.base import Launcher, Pool, ranks_left
from workbench.pool.launch.spawn import CancellableEngineSetLauncher, PoolSlurmEngineSetLauncher

SQUEUE_TIMEOUT_S = 10
JOB_STATES_EVERY_S = 1.0  # squeue asks slurmctld: at most once a second


class Slurm(Launcher):
    """Engines as the tasks of one sbatch job."""

    name = "slurm"
    engine_set = PoolSlurmEngineSetLauncher
    refusal_advice = ("Check the Slurm options (partition, time limit, account, nodes, GPUs per node): "
                      "`sinfo` lists the partitions and their limits.")

    def __init__(self, config: PoolConfig):
        super().__init__(config)
        self._job_cache: tuple[float, dict[str, str]] = (0.0, {})
        self._record: dict | None = None  # the pool's job once it ran (allocation_record)

    def _default_count(self, local_gpus: int) -> int:
        return self.config.nodes or 1

    def needs_routable_address(self) -> bool:
        return True

    def where(self) -> str:
        return "cluster nodes"

    def traits(self, n: int, *, work_dir: str, env: dict[str, str], log: str) -> dict:
        """The batch script and where it is written (the pool's scratch folder); the job's output is the
        pool's log (a shared file system)."""
        return {**({"output_file": log} if log else {}), "batch_template": slurm_script(self.config, n),
                "batch_file_name": os.path.join(work_dir, "slurm_engine.sbatch")}

    def where_to_start(self, pool: Pool | None, lost: list, ranks: list,
                       progress: Callable[[str], None]) -> dict[tuple[str, str], int]:
        """``{(job, node): n}``: a new step of each lost rank's job on its node, while the job still holds
        it (else one sentence that says so, and what the ranks left can do)."""
        return slurm_steps.place(lost, ranks_left(lost, ranks))

    def start_more(self, pool: Pool, n: int, placement: dict | None) -> list:
        """Replacements (``placement``): one engine per ``srun`` step in each ``(job, node)``, through
        ipyparallel's local engine-set launcher; returns their launchers (the ``srun`` processes). Growing
        the pool (no placement) submits another job."""
        if not placement:
            return super().start_more(pool, n, placement)
        started = []
        for (job, node), k in placement.items():
            kwargs = slurm_steps.step_set_kwargs(job, node, gpus_per_node=self.config.gpus_per_node,
                                                 env=pool.env, engine_args=pool.engine_args,
                                                 log=str(pool.log_file or ""))
            # the cluster has one engine launcher class (the sbatch one): the steps' set is a local one
            started += pool.start_engine_set_with(CancellableEngineSetLauncher, k, kwargs)
        return started

    def steps_ended(self, ended: int, log: Path | None) -> str:
        return (f"{ended} new Slurm step(s) ended before their engine registered; the pool's log ({log}) has "
                "what srun said.")

    def engines_exited(self, dead: int, n: int) -> str:
        return "the Slurm job ended while starting the engines"  # one launch for the whole set

    def why_slow(self, pool: Pool) -> str:
        """What Slurm says of the pool's jobs (``; Slurm job 12: PENDING (Resources)``)."""
        states = self.job_states(pool.engine_sets())
        return "".join(f"; Slurm job {job}: {how}" for job, how in states.items())

    def allocation_record(self, pool: Pool | None = None) -> dict | None:
        """The pool's own job once it runs: its nodes, GPUs and tasks (``workbench pools``, the card)."""
        job = self._job_of(pool)
        if job is None or (self._record is not None and self._record["job"] == job):
            return self._record if job is not None else None
        try:
            state, nodes = slurm_steps.held_nodes(job)
        except ValueError:  # squeue or scontrol did not answer: asked again at the next record
            return None
        if state != "RUNNING" or not nodes:
            return None
        self._record = {"job": job, "nodes": nodes, "gpus": len(nodes) * (self.config.gpus_per_node or 0),
                        "tasks": self.default_engines(), "inside": False}
        return self._record

    def ends(self, pool: Pool | None = None) -> tuple[bool, float | None]:
        """Whether the pool's job still holds its nodes, and when its ``--time`` ends it."""
        job = self._job_of(pool)
        if job is None:
            return True, None
        state, end = allocation.state_and_end(job)
        return state in allocation.HOLDING or state == "UNKNOWN", end

    @staticmethod
    def _job_of(pool: Pool | None) -> str | None:
        """The pool's first batch job (its engines' job), if it was submitted."""
        sets = pool.engine_sets() if pool is not None else []
        return next((es.job_id for es in sets if isinstance(es, BatchSystemLauncher) and es.job_id), None)

    def job_states(self, engine_sets: list) -> dict[str, str]:
        """Each Slurm job of the pool with its state and reason, e.g. ``{"12": "PENDING (Resources)"}``."""
        cached_at, states = self._job_cache
        if time.monotonic() - cached_at < JOB_STATES_EVERY_S:
            return states
        states = {}
        for es in engine_sets:
            if isinstance(es, BatchSystemLauncher) and es.job_id:
                try:
                    asked = ["squeue", "-h", "-j", es.job_id, "-o", "%T|%r"]
                    out = subprocess.run(asked, capture_output=True, text=True,
                                         timeout=SQUEUE_TIMEOUT_S).stdout.strip()
                except (OSError, subprocess.TimeoutExpired):
                    out = ""
                state, _, reason = out.partition("|")
                states[es.job_id] = f"{state} ({reason})" if state else "ended"
        self._job_cache = (time.monotonic(), states)
        return states


def slurm_script(config: PoolConfig, n: int) -> str:
    """The sbatch script for ``n`` engines (an ipyparallel ``batch_template``; ``{...}`` are its fields).

    >>> print(slurm_script(PoolConfig(launcher="slurm", nodes=2, gpus_per_node=4, partition="gpu",
    ...                               time="30", account="proj"), 8))
    #!/bin/sh
    #SBATCH --export=ALL
    #SBATCH --job-name=ipengine-{cluster_id}
    #SBATCH --output={output_file}
    #SBATCH --open-mode=append
    #SBATCH --nodes=2
    #SBATCH --ntasks-per-node=4
    #SBATCH --gpus-per-node=4
    #SBATCH --partition=gpu
    #SBATCH --time=30
    #SBATCH --account=proj
    srun --kill-on-bad-exit=0 {program_and_args}
    <BLANKLINE>
    >>> "--ntasks=3" in slurm_script(PoolConfig(launcher="slurm"), 3)
    True
    """
    # --open-mode=append: the output file is the pool's log, which the controller writes too
    lines = ["#!/bin/sh", "#SBATCH --export=ALL", "#SBATCH --job-name=ipengine-{cluster_id}",
             "#SBATCH --output={output_file}", "#SBATCH --open-mode=append"]
    nodes = config.nodes
    if config.gpus_per_node and n % config.gpus_per_node == 0:
        nodes = n // config.gpus_per_node
    if nodes and n % nodes == 0:
        lines += [f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={n // nodes}"]
    else:
        lines += [f"#SBATCH --nodes={nodes}"] if nodes else []
        lines += [f"#SBATCH --ntasks={n}"]
    if config.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={config.gpus_per_node}")
    for flag, value in (("partition", config.partition), ("time", config.time), ("account", config.account)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    # one engine stopping (a shrink) must not end the others
    lines.append("srun --kill-on-bad-exit=0 {program_and_args}")
    return "\n".join(lines) + "\n"
