"""``--launcher allocation``: the Slurm job this kernel runs in is the pool (the default inside one).

Open OnDemand, JupyterHub's batchspawner, ``salloc`` and ``sbatch`` run the notebook inside a Slurm job that
already holds the nodes; a pool there must not submit a second job that waits behind it. Here the engines are
**steps of that job**: one ``srun --jobid=J --nodelist=NODE --overlap --ntasks=K`` per node
(:class:`~workbench.pool.launch.spawn.PoolSrunEngineSetLauncher`), K engines on each node, one per allocated
GPU (each step holds its node's GPUs and the rank map pins local rank ``i`` to ``cuda:i``), else one per
allocated task; the nodes in the job's order, each filled before the next, so ranks are contiguous per node
(:mod:`workbench.pool.launch.allocation` reads the job and plans). ``-n`` below the job's size uses part of
it and says so; above it is refused with the numbers; ``--nodes K`` takes the first K nodes, ``--gpus-per-node
G`` G engines on each. ``--overlap``: the steps share the job's CPUs, memory and GPUs with its other steps
(the notebook's own, in a batch job). Slurm's GPU binding, cgroups, accounting and clean-up apply to the
engines; when the job ends Slurm ends them, and the pool stops with it
(:class:`~workbench.pool.watch.walltime.Walltime`).

The engines reach the kernel over the network: with no ``--interface`` the address is the one this machine
reaches the job's nodes from (the route to a node's ``NodeAddr``). A lost rank comes back as a new step of the
job on its node (:mod:`workbench.pool.launch.slurm_steps`) while the job holds the node and the node's slurmd
answers, else on another node of the job with a free slot, else one sentence says why; a pool grows into the
job's free slots.

>>> from workbench.pool.launch.allocation import Job, Node
>>> launcher = SlurmAllocation(PoolConfig(launcher="allocation"))
>>> launcher._job = Job("12", (Node("n1", 4, 32, 4), Node("n2", 4, 32, 4)))
>>> launcher.default_engines(), launcher.where(), launcher.plan(6)
(8, 'Slurm job 12 (2 nodes, 8 GPUs)', {'n1': 4, 'n2': 2})
>>> kw = launcher.engine_set_kwargs(4, work_dir="/tmp/x", env={}, engine_args=[], placement={"n2": 4})
>>> " ".join(kw["mpi_cmd"])
'srun --jobid=12 --nodelist=n2 --nodes=1 --ntasks-per-node=4 --cpus-per-task=8 --overlap --export=ALL \
--input=none --kill-on-bad-exit=0 --job-name=workbench-engines --gpus-per-node=4'
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from workbench.config import PoolConfig
from workbench.pool.launch import allocation, slurm_steps
from workbench.pool.launch.allocation import HOLDING, Job
from workbench.pool.launch.base import ENGINE_MAIN, Launcher, Pool, go_on, ranks_left
from workbench.pool.launch.spawn import PoolSrunEngineSetLauncher
from workbench.pool.machine import netif
from workbench.pool.processes.reap import MARKER

ANSWER_TIMEOUT_S = 3.0  # a node's slurmd asked whether it answers (a new step there needs it)
# the jobs read here, by id: their nodes do not change (their end may: ``allocation.state_and_end``)
_jobs: dict[str, Job] = {}


class SlurmAllocation(Launcher):
    """Engines as steps of the Slurm job this kernel runs in."""

    name = "allocation"
    engine_set = PoolSrunEngineSetLauncher
    poll_s = 0.05
    refusal_advice = ("Check the Slurm job this kernel runs in (`squeue --me`, `scontrol show job "
                      "$SLURM_JOB_ID`).")
    failed_todo = "The pool's log has what srun said."

    def __init__(self, config: PoolConfig):
        super().__init__(config)
        self._job: Job | None = None
        self._slurmd: tuple[dict[str, str], int] | None = None  # the nodes' addresses, slurmd's port

    # -- the job -------------------------------------------------------------------------------------
    @property
    def job(self) -> Job:
        """The Slurm job this kernel runs in (read once per process)."""
        if self._job is None:
            job_id = os.environ.get("SLURM_JOB_ID", "")
            if job_id not in _jobs:
                _jobs[job_id] = allocation.read()
            self._job = _jobs[job_id]
        return self._job

    def plan(self, n: int | None = None) -> dict[str, int]:
        """``{node: engines}`` for ``n`` engines (None: every slot the options leave)."""
        return self.job.plan(n, nodes=self.config.nodes, per_node=self.config.gpus_per_node)

    # -- sizes and places ------------------------------------------------------------------------------
    def default_engines(self, local_gpus: int = 0) -> int:
        """``-n``, else one per allocated GPU (or task) of the nodes the options leave."""
        if self.config.n is not None:
            return self.config.n
        return sum(self.plan().values())

    def node_order(self) -> list[str]:
        """The job's nodes in its order: rank 0 on its first node (where a batch job's notebook runs)."""
        return [node.name for node in self.job.nodes]

    def check_capacity(self, n: int) -> None:
        """More ranks than the job holds: refused with the numbers, before anything starts."""
        self.plan(n)

    def needs_routable_address(self) -> bool:
        return True

    def where(self) -> str:
        return self.job.words()

    def configured(self, config: PoolConfig) -> PoolConfig:
        """With no ``--interface`` or ``--address``: the address this machine reaches the job's nodes from."""
        if config.interface is not None or not netif.is_loopback(config.address):
            return config
        names = [node.name for node in self.job.nodes]
        here = socket.gethostname()
        addresses = allocation.node_addresses(names)
        target = next((addresses[n] for n in names if n != here and n in addresses), None) or \
            next(iter(addresses.values()), None)
        if target is None:
            return config  # the start refuses loopback, naming the interfaces there are
        return replace(config, address=netif.route_to(target)["address"])

    def check_address(self, address: str) -> None:
        """Loopback with no interface named is fine where :meth:`configured` finds the route to the nodes."""
        if self.config.interface is None and netif.is_loopback(address):
            address = self.configured(self.config).address
        super().check_address(address)

    def notes(self, n: int) -> list[str]:
        """What a start says besides its progress: that it uses part of the job; options of a new job that
        do not apply inside this one."""
        said = [self.job.partly(self.plan(n))]
        ignored = [f"--{name}" for name in ("partition", "time", "account") if getattr(self.config, name)]
        if ignored:
            said.append(f"{', '.join(ignored)} {'are' if len(ignored) > 1 else 'is'} for a job of its own: "
                        f"the pool runs inside {self.job.words()}, with its nodes and its time limit "
                        "(--new-job submits another job).")
        return [s for s in said if s]

    # -- the engines ----------------------------------------------------------------------------------
    def engine_env(self, n: int) -> dict[str, str]:
        """Each rank's threads: its share of its node's CPUs."""
        plan = self.plan(n)
        shares = [max(1, self.job.node(name).cpus // k) for name, k in plan.items()]
        return {"OMP_NUM_THREADS": str(min(shares or [1]))}

    def engine_set_kwargs(self, n: int, *, work_dir: str, env: dict[str, str], engine_args: list[str],
                          log: str = "", placement: dict | None = None) -> dict:
        """One node's step (``placement``: ``{node: n}``): ``srun`` on that node, the engine as its tasks."""
        [node] = list(placement or self.plan(n))
        kwargs = {**({"output_file": log} if log else {}), "engine_cmd": list(ENGINE_MAIN),
                  "mpi_cmd": self.step_command(node, n, env.get(MARKER)), "mpi_args": []}
        kwargs.update(self.config.launcher_options)
        kwargs["environment"] = dict(env)
        kwargs["engine_args"] = list(engine_args)
        return kwargs

    def step_command(self, node: str, k: int, pool_id: str | None = None) -> list[str]:
        """The ``srun`` of ``k`` engines on ``node``, a step of the job (the engine's command follows)."""
        info = self.job.node(node)
        if info is None:
            raise ValueError(f"node {node} is not one of {self.job.words()}: "
                             f"{', '.join(x.name for x in self.job.nodes)}.")
        # --export=ALL: the engines' environment (the controller's connection info, the pool's tag) goes to
        # the tasks even where the job was submitted with --export=LIST (batchspawner's SlurmSpawner), which
        # leaves SLURM_EXPORT_ENV in the job's environment for every srun in it
        command = ["srun", f"--jobid={self.job.id}", f"--nodelist={node}", "--nodes=1",
                   f"--ntasks-per-node={k}", f"--cpus-per-task={max(1, info.cpus // k)}", "--overlap",
                   "--export=ALL", "--input=none", "--kill-on-bad-exit=0",
                   f"--job-name=workbench-{pool_id or 'engines'}"]
        return command + ([f"--gpus-per-node={info.gpus}"] if info.gpus else [])

    def start_engines(self, pool: Pool, n: int) -> None:
        """One step per node of the plan, the first node first."""
        for node, k in self.plan(n).items():
            pool.start_engine_set(k, {node: k})

    # -- replacements -----------------------------------------------------------------------------------
    def where_to_start(self, pool: Pool | None, lost: list, ranks: list,
                       progress: Callable[[str], None]) -> dict[str, int]:
        """``{node: n}``: a new step on each lost rank's node while the job holds it and its slurmd answers,
        else on a node of the job with a free slot (``progress`` hears which), else one sentence."""
        left = ranks_left(lost, ranks)
        held = slurm_steps.place(lost, left)  # {(job, node): n}, or why the job no longer holds a node
        gone = {x.engine_id for x in lost}
        alive = Counter(r.slurm_node or r.host for r in ranks if r.engine_id not in gone)
        placement: Counter = Counter()
        for (_, node), k in held.items():
            if self.answers(node):
                placement[node] += k
                continue
            free = {x.name: x.slots - alive[x.name] - placement[x.name] for x in self.job.nodes
                    if x.name != node and self.answers(x.name)}
            if sum(max(0, f) for f in free.values()) < k:
                raise ValueError(f"node {node} of Slurm job {self.job.id} does not answer (its slurmd), and "
                                 f"the job's other nodes have no free slot for {k} engine{'s' * (k != 1)}: "
                                 f"`%dist restart` again once it answers, or {go_on(left)}")
            moved = Counter()
            for name, f in free.items():
                take = min(max(0, f), k - sum(moved.values()))
                if take:
                    moved[name] += take
            placement.update(moved)
            where = ", ".join(f"{name} ({m})" for name, m in moved.items())
            progress(f"node {node} of Slurm job {self.job.id} does not answer: {k} engine{'s' * (k != 1)} "
                     f"start on {where} instead")
        return dict(placement)

    def answers(self, node: str) -> bool:
        """Whether ``node``'s slurmd takes a connection (a step there needs it): one try, bounded."""
        if self._slurmd is None:
            names = [x.name for x in self.job.nodes]
            self._slurmd = (allocation.node_addresses(names), allocation.slurmd_port())
        addresses, port = self._slurmd
        try:
            with socket.create_connection((addresses.get(node, node), port), timeout=ANSWER_TIMEOUT_S):
                return True
        except OSError:
            return False

    def start_more(self, pool: Pool, n: int, placement: dict | None) -> list:
        """Replacements on the nodes ``placement`` names, or growth into the job's free slots: a step per
        node; returns the steps' launchers (a step that ends before its engines registered says so)."""
        nodes = dict(placement) if placement else self._free(pool, n)
        started = []
        for node, k in nodes.items():
            pool.start_engine_set(k, {node: k})
            started.append(pool.engine_sets()[-1])
        return started

    def _free(self, pool: Pool, n: int) -> dict[str, int]:
        """``{node: engines}`` for ``n`` more engines in the slots the pool's ranks leave free."""
        taken = Counter(r.get("slurm_node") or r.get("host") for r in pool.state.ranks)
        out: dict[str, int] = {}
        for node, cap in self.plan().items():
            take = min(max(0, cap - taken[node]), n - sum(out.values()))
            if take > 0:
                out[node] = take
        if sum(out.values()) < n:
            raise ValueError(f"{n} more ranks do not fit {self.job.words()}: it has "
                             f"{sum(out.values())} free slot{'s' if sum(out.values()) != 1 else ''}.")
        return out

    def steps_ended(self, ended: int, log: Path | None) -> str:
        return (f"{ended} new step{'s' if ended != 1 else ''} of Slurm job {self.job.id} ended before their "
                f"engines registered; the pool's log ({log}) has what srun said.")

    # -- a start that waits or fails ------------------------------------------------------------------
    @property
    def via(self) -> str:
        return f" as steps of {self.job.words()}"

    def engines_exited(self, dead: int, n: int) -> str:
        return (f"{dead} srun step{'s' if dead != 1 else ''} of Slurm job {self.job.id} ended while starting "
                "the engines")

    def why_slow(self, pool: Pool) -> str:
        """What squeue says of the job's steps (``; Slurm job 12 RUNNING, steps: 12.1 on n1``)."""
        state, _ = allocation.state_and_end(self.job.id)
        try:
            steps = subprocess.run(["squeue", "-h", "-s", "-j", self.job.id, "-o", "%i on %N"],
                                   capture_output=True, text=True,
                                   timeout=allocation.SCONTROL_TIMEOUT_S).stdout.split("\n")
        except (OSError, subprocess.TimeoutExpired):
            steps = []
        steps = [s for s in steps if s.strip()]
        return f"; Slurm job {self.job.id} {state}" + (f", steps: {', '.join(steps)}" if steps else "")

    # -- the job's time --------------------------------------------------------------------------------
    def allocation_record(self, pool: Pool | None = None) -> dict | None:
        return self.job.record()

    def ends(self, pool: Pool | None = None) -> tuple[bool, float | None]:
        """Whether the job still holds its nodes, and when it ends (None: no time limit)."""
        state, end = allocation.state_and_end(self.job.id)
        if state == "UNKNOWN":  # squeue did not answer: as it was
            return True, self.job.ends
        return state in HOLDING, end
