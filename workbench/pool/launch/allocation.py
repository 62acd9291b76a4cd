"""The Slurm job this kernel runs in, as the pool sees it: its nodes, what each holds, when it ends.

Open OnDemand, JupyterHub's batchspawner, ``salloc`` and ``sbatch`` run the notebook's kernel inside a Slurm
job (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``... in its environment). The pool of
such a kernel is that job's allocation (:class:`~workbench.pool.launch.slurm_allocation.SlurmAllocation`):
one engine per allocated GPU, else per allocated task, on every node of the job. This module reads the job
once (``scontrol -d show job``: its nodes, each node's GPUs, its end) and plans where ``n`` engines go:
contiguous per node, the job's nodes in order, a node filled before the next (``-n`` below the job's size
uses part of it; above it is refused with the numbers). Pure parsing functions, and two Slurm commands.

>>> job = Job("12", (Node("n1", tasks=2, cpus=2, gpus=0), Node("n2", tasks=2, cpus=2, gpus=0)), ends=None)
>>> job.words(), job.plan(3)
('Slurm job 12 (2 nodes, 4 tasks, no GPU)', {'n1': 2, 'n2': 1})
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime

SCONTROL_TIMEOUT_S = 10
# squeue's states of a job that still holds its nodes
HOLDING = {"RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "STOPPED", "RESIZING", "SIGNALING",
           "STAGE_OUT"}


class NotInAJob(ValueError):
    """The allocation launcher was asked for outside a Slurm job."""


@dataclass(frozen=True)
class Node:
    """One node of the job: its Slurm name, the tasks, CPUs and GPUs the job holds there."""

    name: str
    tasks: int
    cpus: int
    gpus: int

    @property
    def slots(self) -> int:
        """Engines it takes: one per GPU, else one per task."""
        return self.gpus or self.tasks


@dataclass(frozen=True)
class Job:
    """A Slurm job as the pool uses it: ``id``, its ``nodes`` in Slurm's order, when it ``ends`` (epoch
    seconds; None: no time limit)."""

    id: str
    nodes: tuple[Node, ...]
    ends: float | None = None

    @property
    def gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    @property
    def slots(self) -> int:
        return sum(node.slots for node in self.nodes)

    def words(self) -> str:
        """``Slurm job 12 (2 nodes, 8 GPUs)``; without GPUs the tasks.

        >>> Job("7", (Node("a", 1, 8, 4),)).words()
        'Slurm job 7 (1 node, 4 GPUs)'
        """
        nodes = f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}"
        if self.gpus:
            return f"Slurm job {self.id} ({nodes}, {self.gpus} GPU{'s' if self.gpus != 1 else ''})"
        tasks = sum(node.tasks for node in self.nodes)
        return f"Slurm job {self.id} ({nodes}, {tasks} task{'s' if tasks != 1 else ''}, no GPU)"

    def record(self) -> dict:
        """What the pool's state says of it (``workbench pools``, the card and ``%dist status`` read it)."""
        return {"job": self.id, "nodes": [n.name for n in self.nodes], "gpus": self.gpus,
                "tasks": sum(n.tasks for n in self.nodes), "inside": True}

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def plan(self, n: int | None = None, *, nodes: int | None = None, per_node: int | None = None
             ) -> dict[str, int]:
        """``{node: engines}`` for ``n`` engines (None: every slot), on the first ``nodes`` nodes (None: all),
        at most ``per_node`` on each (None: its slots), each node filled before the next. More than that
        is refused with the numbers.

        >>> job = Job("12", (Node("n1", 4, 32, 4), Node("n2", 4, 32, 4)))
        >>> job.plan(), job.plan(6), job.plan(nodes=1), job.plan(per_node=2)
        ({'n1': 4, 'n2': 4}, {'n1': 4, 'n2': 2}, {'n1': 4}, {'n1': 2, 'n2': 2})
        >>> job.plan(9)
        Traceback (most recent call last):
        ...
        ValueError: -n 9 is more than Slurm job 12 holds: 2 nodes x 4 GPUs = 8 ranks (one per GPU). Start at \
most 8 (`%dist start` takes them all), or ask for a larger allocation; `--launcher slurm --new-job` \
submits a job of its own.
        """
        if nodes is not None and nodes > len(self.nodes):
            raise ValueError(f"--nodes {nodes} is more than Slurm job {self.id} holds: it has "
                             f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''} "
                             f"({', '.join(x.name for x in self.nodes)}).")
        used = self.nodes[:nodes] if nodes else self.nodes
        if per_node is not None:
            short = [x for x in used if per_node > x.slots]
            if short:
                x = short[0]
                raise ValueError(f"--gpus-per-node {per_node} is more than Slurm job {self.id} holds on node "
                                 f"{x.name} ({self._slot_words(x)}).")
        caps = [(x.name, per_node or x.slots) for x in used]
        total = sum(k for _, k in caps)
        n = total if n is None else n
        if n > total:
            raise ValueError(f"-n {n} is more than Slurm job {self.id} holds: {self._capacity_words(used)}. "
                             f"Start at most {total} (`%dist start` takes them all), or ask for a larger "
                             "allocation; `--launcher slurm --new-job` submits a job of its own.")
        out: dict[str, int] = {}
        for name, k in caps:
            take = min(k, n - sum(out.values()))
            if take <= 0:
                break
            out[name] = take
        return out

    def _slot_words(self, node: Node) -> str:
        return f"{node.gpus} GPUs" if node.gpus else f"{node.tasks} tasks, no GPU"

    def _capacity_words(self, nodes) -> str:
        """``2 nodes x 4 GPUs = 8 ranks (one per GPU)``, or the counts of each node where they differ."""
        nodes = list(nodes)
        total = sum(x.slots for x in nodes)
        what = "GPU" if any(x.gpus for x in nodes) else "task"
        if len({x.slots for x in nodes}) == 1:
            k = nodes[0].slots
            return (f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} x {k} {what}{'s' if k != 1 else ''} "
                    f"= {total} ranks (one per {what})")
        return f"{', '.join(f'{x.name}: {x.slots}' for x in nodes)} = {total} ranks (one per {what})"

    def partly(self, plan: dict[str, int]) -> str:
        """The sentence of a plan that uses part of the job ('' when it uses all of it).

        >>> Job("12", (Node("n1", 2, 2, 0), Node("n2", 2, 2, 0))).partly({"n1": 2, "n2": 1})
        '3 ranks use part of Slurm job 12 (2 nodes, 4 tasks, no GPU): n1 2, n2 1.'
        """
        if sum(plan.values()) >= self.slots:
            return ""
        where = ", ".join(f"{node} {k}" for node, k in plan.items())
        return f"{sum(plan.values())} ranks use part of {self.words()}: {where}."


def expand_counts(text: str) -> list[int]:
    """Slurm's per-node counts (``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_CPUS_PER_NODE``) one per node.

    >>> expand_counts("2(x3),1"), expand_counts("4"), expand_counts("")
    ([2, 2, 2, 1], [4], [])
    """
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise ValueError(f"not a Slurm count list: {text!r}")
        out += [int(m[1])] * int(m[2] or 1)
    return out


def hostnames(nodelist: str) -> list[str]:
    """Slurm's compact node list (``n[1-2],gpu[08-10]``), one name per node, as Slurm itself expands it
    (``scontrol show hostnames``: it reads slurm.conf and asks no daemon)."""
    if not nodelist:
        return []
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"scontrol did not answer ({exc}): the nodes of {nodelist} are unknown.") from None
    if done.returncode != 0:
        raise ValueError(f"scontrol cannot expand the node list {nodelist}: {done.stderr.strip()}")
    return done.stdout.split()


def parse_gpus(gres: str) -> int:
    """GPUs in a node's GRES of ``scontrol -d show job`` (types summed).

    >>> parse_gpus("gpu:4(IDX:0-3)"), parse_gpus("gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:2)"), parse_gpus("")
    (4, 3, 0)
    """
    return sum(int(m[1]) for m in re.finditer(r"gpu(?::[^:(,]+)?:(\d+)", gres))


def parse_end(text: str, limit: str = "") -> float | None:
    """A Slurm time stamp (local time) as epoch seconds; None for none, or an unlimited job.

    >>> parse_end("Unknown"), parse_end("2026-12-04T22:31:08", "UNLIMITED")
    (None, None)
    >>> parse_end("2026-12-04T22:31:08") == datetime(2026, 12, 4, 22, 31, 8).timestamp()
    True
    """
    stamp = re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", text)
    if limit.upper() in ("UNLIMITED", "INFINITE") or not stamp:
        return None
    return datetime.fromisoformat(text).timestamp()


def parse_job(text: str) -> dict:
    """What ``scontrol -d show job J`` says of a job: its state, node list, end, and the GPUs of each of its
    nodes' groups (a compact node list each, as :func:`hostnames` expands it).

    >>> info = parse_job('''JobId=12 JobName=x
    ...    JobState=RUNNING Reason=None
    ...    RunTime=00:00:05 TimeLimit=00:30:00 TimeMin=N/A
    ...    StartTime=2026-12-04T22:00:00 EndTime=2026-12-04T22:30:00 Deadline=N/A
    ...    NodeList=n[1-2]
    ...      Nodes=n[1-2] CPU_IDs=0-7 Mem=0 GRES=gpu:4(IDX:0-3)
    ... ''')
    >>> info["state"], info["nodelist"], info["gpus"], info["limit"]
    ('RUNNING', 'n[1-2]', {'n[1-2]': 4}, '00:30:00')
    """
    def field(name: str) -> str:
        m = re.search(rf"(?:^|\s){name}=(\S*)", text)
        return m[1] if m else ""

    gpus = {m[1]: parse_gpus(m[2])
            for m in re.finditer(r"^\s*Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)", text, re.MULTILINE)}
    return {"state": field("JobState"), "nodelist": field("NodeList"), "end": field("EndTime"),
            "limit": field("TimeLimit"), "gpus": gpus}


def _scontrol_job(job: str) -> str:
    try:
        done = subprocess.run(["scontrol", "-d", "show", "job", job], capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"scontrol did not answer ({exc}): Slurm job {job}'s nodes are unknown.") from None
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        raise ValueError(f"scontrol cannot show Slurm job {job}: {said}")
    return done.stdout


def read(env=None) -> Job:
    """The Slurm job this process runs in (``NotInAJob`` outside one): its nodes from the environment Slurm
    gave it (tasks and CPUs per node) and ``scontrol -d show job`` (the GPUs of each node, the end)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise NotInAJob("--launcher allocation runs the engines as steps of the Slurm job this kernel runs "
                        "in, and it runs in none (no SLURM_JOB_ID): start Jupyter inside an allocation (Open "
                        "OnDemand, a JupyterHub with batchspawner, salloc, sbatch), or use --launcher slurm "
                        "to submit a job.")
    info = parse_job(_scontrol_job(job))
    names = hostnames(env.get("SLURM_JOB_NODELIST") or info["nodelist"])
    gpus = {name: k for group, k in info["gpus"].items() for name in hostnames(group)}
    tasks = expand_counts(env.get("SLURM_TASKS_PER_NODE", "")) or [1] * len(names)
    cpus = expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE", "")) or tasks
    nodes = tuple(Node(name, tasks[min(i, len(tasks) - 1)], cpus[min(i, len(cpus) - 1)],
                       gpus.get(name, 0)) for i, name in enumerate(names))
    return Job(job, nodes, parse_end(info["end"], info["limit"]))


def state_and_end(job: str) -> tuple[str, float | None]:
    """``job``'s state as squeue says (``"ENDED"`` once Slurm forgot it) and its end (None: unlimited)."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T|%e|%l"], capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT_S).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "UNKNOWN", None
    state, _, rest = out.partition("|")
    end, _, limit = rest.partition("|")
    return (state or "ENDED"), parse_end(end, limit)


def node_addresses(names: list[str]) -> dict[str, str]:
    """Each node's ``NodeAddr`` as Slurm knows it (where srun and slurmd reach it)."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "node", ",".join(names)], capture_output=True,
                             text=True, timeout=SCONTROL_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in out.splitlines():
        name, addr = re.search(r"NodeName=(\S+)", line), re.search(r"NodeAddr=(\S+)", line)
        if name and addr:
            found[name[1]] = addr[1]
    return found


def slurmd_port() -> int:
    """The port slurmd listens on (``SlurmdPort``; 6818 by default)."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 6818
    m = re.search(r"^SlurmdPort\s*=\s*(\d+)", out, re.MULTILINE)
    return int(m[1]) if m else 6818
