"""The stable map rank -> (host, local rank, device, engine).

Users speak in ranks; ipyparallel engine ids are an internal detail that changes
when engines restart. Pure functions only: no ipyparallel, no torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EngineInfo:
    """What an engine reports about itself when it comes up."""

    engine_id: int
    host: str
    pid: int
    gpus: int = 0  # GPUs visible to the engine's process
    gpu_uuids: tuple[str, ...] = ()  # their UUIDs, in the engine's CUDA order (empty: unknown)
    slurm_job: str = ""  # a Slurm pool: the job whose step runs the engine, and its node's Slurm name
    slurm_node: str = ""
    hub: str = ""  # its host's hub, where it has one (workbench.pool.processes.host_hub)


@dataclass(frozen=True)
class RankInfo:
    """One rank of the process group and where it lives."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    pid: int
    device: str  # "cpu" or "cuda:N" (N in the engine's own CUDA numbering)
    engine_id: int
    gpu_uuid: str | None = None  # the GPU's identity, whatever CUDA_VISIBLE_DEVICES each process has
    slurm_job: str = ""  # a Slurm pool: the job (allocation) and node the rank's engine runs in
    slurm_node: str = ""
    hub: str = ""  # the hub of its host (its output and replies merged there with the host's), "" if none

    def label(self) -> str:
        return f"rank {self.rank} ({self.host}, {self.device})"


def build_rank_map(engines: list[EngineInfo], *, share_gpus: bool = False, order: Sequence[str] = ()
                   ) -> list[RankInfo]:
    """Give ranks to engines: contiguous per host (and per hub within a host: a local pool's groups of forks
    that stand for hosts), hosts in ``order`` (Slurm node names or hosts: the nodes of a Slurm job in the
    job's order), the others in order of their first engine.

    Each engine on a host gets the next local rank and a GPU of its own: its only one when it sees one
    (Slurm's per-task binding), else the GPU of its local rank. More ranks than GPUs on a host is refused
    (NCCL cannot put two ranks of a group on one GPU) unless ``share_gpus``, which warns.

    >>> m = build_rank_map([EngineInfo(5, "b", 10, 2), EngineInfo(3, "a", 11), EngineInfo(4, "b", 12, 2)])
    >>> [(r.rank, r.host, r.local_rank, r.device, r.engine_id) for r in m]
    [(0, 'a', 0, 'cpu', 3), (1, 'b', 0, 'cuda:0', 4), (2, 'b', 1, 'cuda:1', 5)]
    >>> [r.host for r in build_rank_map([EngineInfo(1, "b", 10), EngineInfo(2, "a", 11)], order=["a", "b"])]
    ['a', 'b']
    """
    place = {name: i for i, name in enumerate(order)}
    ordered = sorted(engines, key=lambda e: (place.get(e.slurm_node or e.host, len(place)), e.engine_id))
    first = {}
    for i, e in enumerate(ordered):
        first.setdefault(e.host, i)
    return extend_rank_map([], engines, share_gpus=share_gpus, first=first)


def extend_rank_map(ranks: list[RankInfo], engines: list[EngineInfo], *,
                    share_gpus: bool = False, first: dict[str, int] | None = None) -> list[RankInfo]:
    """``ranks`` as they are, then ``engines`` appended as new ranks (``%dist scale`` growing the pool).

    The existing ranks keep rank, engine and device (their Python state lives there); a new engine
    takes the next local rank on its host and a GPU no rank on that host holds.

    >>> old = build_rank_map([EngineInfo(4, "a", 10, 2)])
    >>> [(r.rank, r.engine_id, r.device) for r in extend_rank_map(old, [EngineInfo(2, "a", 11, 2)])]
    [(0, 4, 'cuda:0'), (1, 2, 'cuda:1')]
    """
    out = list(ranks)
    nodes = {r.host: r.node_rank for r in ranks}
    for e in sorted(engines, key=lambda e: ((first or {}).get(e.host, 0), e.engine_id)):
        nodes.setdefault(e.host, len(nodes))
    for host in nodes:  # hosts in order (``first``: their place), new engines in engine-id order
        members = sorted((e for e in engines if e.host == host), key=lambda e: (e.hub, e.engine_id))
        for e in members:
            here = [r for r in out if r.host == host]
            device, uuid = _pick_gpu(e, here, share_gpus)
            out.append(RankInfo(len(out), len(here), nodes[host], host, e.pid, device, e.engine_id, uuid,
                                e.slurm_job, e.slurm_node, e.hub))
    return out


def _pick_gpu(e: EngineInfo, here: list[RankInfo], share: bool) -> tuple[str, str | None]:
    """Device and GPU UUID for engine ``e`` joining a host where the ranks ``here`` hold theirs."""
    if e.gpus == 0:
        return "cpu", None
    uuids = list(e.gpu_uuids) if len(e.gpu_uuids) == e.gpus else [None] * e.gpus
    if uuids[0] is not None:
        held = {r.gpu_uuid for r in here}
        free = [i for i, u in enumerate(uuids) if u not in held]
    elif e.gpus == 1:  # its only GPU, identity unknown: per-task binding (the local start checked the count)
        free = [0]
    else:  # every engine sees the same GPUs in the same order
        held_index = {int(r.device.split(":")[1]) for r in here if r.device.startswith("cuda:")}
        free = [i for i in range(e.gpus) if i not in held_index]
    if free:
        index = len(here) if len(here) in free else free[0]
        return f"cuda:{index}", uuids[index]
    from workbench.pool.machine.devices import SharedGpuWarning

    text = (f"more ranks than GPUs on host {e.host!r}: engine {e.engine_id} would share a GPU with local "
            f"rank(s) {format_ranks(r.local_rank for r in here)}")
    if not share:
        raise ValueError(f"{text}. NCCL cannot run two ranks of a group on one GPU: start at most one rank "
                         "per GPU (-n), or share them (share_gpus=True, --share-gpus) to try things out over "
                         "gloo.")
    warnings.warn(f"{text}: they share it and the group talks over gloo.", SharedGpuWarning, stacklevel=4)
    index = len(here) % e.gpus
    return f"cuda:{index}", uuids[index]


def group_backend(requested: str, ranks: list[RankInfo], *, shared: bool = False) -> str:
    """The one backend string every rank passes to ``init_process_group``.

    GPU ranks get ``cpu:gloo,cuda:nccl`` also for ``nccl``: the Trainer's flags and ``broadcast_module``
    send CPU tensors too. Ranks sharing a GPU use gloo (NCCL refuses them); a pool mixing GPU and CPU
    ranks needs ``gloo``.

    >>> group_backend("auto", [RankInfo(0, 0, 0, "h", 1, "cuda:0", 0)])
    'cpu:gloo,cuda:nccl'
    """
    cpu = [r for r in ranks if not r.device.startswith("cuda")]
    if requested == "gloo":
        return "gloo"
    if requested == "nccl" and (cpu or shared):
        why = f"{cpu[0].label()} has no GPU" if cpu else "ranks share a GPU"
        raise ValueError(f"backend nccl needs a GPU of its own for every rank, but {why}: use --backend gloo "
                         "or auto.")
    if cpu and len(cpu) < len(ranks):
        raise ValueError(f"{cpu[0].label()} has no GPU while other ranks do: the group cannot mix NCCL and "
                         "CPU ranks. Start the pool on nodes that all have GPUs, or pass --backend gloo.")
    if cpu or shared:
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def remap_engines(ranks: list[RankInfo], engines: list[EngineInfo]) -> list[RankInfo]:
    """Keep each rank on the same host and device after its engines were replaced.

    New engines are matched to the old ranks host by host, in engine-id order.

    >>> old = build_rank_map([EngineInfo(0, "a", 1), EngineInfo(1, "a", 2)])
    >>> [(r.rank, r.engine_id) for r in remap_engines(old, [EngineInfo(7, "a", 3), EngineInfo(6, "a", 4)])]
    [(0, 6), (1, 7)]
    """
    free: dict[str, list[EngineInfo]] = {}
    for e in sorted(engines, key=lambda e: e.engine_id):
        free.setdefault(e.host, []).append(e)
    out = []
    for r in ranks:
        if not free.get(r.host):
            raise ValueError(f"no new engine on host {r.host!r} for rank {r.rank}")
        e = free[r.host].pop(0)
        out.append(_on_engine(r, e))
    return out


def remap_moved(ranks: list[RankInfo], engines: list[EngineInfo], running: list[RankInfo]) -> list[RankInfo]:
    """Like :func:`remap_engines`, but a rank whose host got no new engine (it did not answer) moves to a
    host that got one: there it takes the next free local rank (a GPU rank the GPU of that number).
    ``running``: the ranks that stay, whose local ranks are taken.

    >>> run = build_rank_map([EngineInfo(0, "a", 1)])
    >>> lost = build_rank_map([EngineInfo(0, "a", 1), EngineInfo(1, "b", 2)])[1:]
    >>> [(r.rank, r.host, r.local_rank, r.engine_id) for r in remap_moved(lost, [EngineInfo(5, "a", 9)], run)]
    [(1, 'a', 1, 5)]
    """
    free: dict[str, list[EngineInfo]] = {}
    for e in sorted(engines, key=lambda e: e.engine_id):
        free.setdefault(e.host, []).append(e)
    used: dict[str, set[int]] = {}
    for r in running:
        used.setdefault(r.host, set()).add(r.local_rank)
    placed: dict[int, RankInfo] = {}
    for r in ranks:
        if free.get(r.host):
            e = free[r.host].pop(0)
            placed[r.rank] = _on_engine(r, e)
            used.setdefault(r.host, set()).add(r.local_rank)
    left = sorted((e for es in free.values() for e in es), key=lambda e: e.engine_id)
    for r, e in zip([r for r in ranks if r.rank not in placed], left, strict=True):
        taken = used.setdefault(e.host, set())
        local = next(i for i in range(len(taken) + 1) if i not in taken)
        taken.add(local)
        node = next((o.node_rank for o in running if o.host == e.host), r.node_rank)
        device = r.device if r.device == "cpu" else f"cuda:{local}"
        uuid = e.gpu_uuids[local] if device != "cpu" and local < len(e.gpu_uuids) else None
        placed[r.rank] = _on_engine(r, e, host=e.host, local_rank=local, node_rank=node, device=device,
                                    gpu_uuid=uuid)
    return [placed[r.rank] for r in ranks]


def parse_ranks(spec: str, world_size: int) -> list[int]:
    """Parse a rank list like ``"0,2-3"`` into sorted ranks, checked against the world size.

    >>> parse_ranks("0,2-3", 4)
    [0, 2, 3]
    >>> parse_ranks("all", 2)
    [0, 1]
    >>> parse_ranks("5", 2)
    Traceback (most recent call last):
    ...
    ValueError: rank 5 is out of range: this pool has ranks 0-1.
    """
    spec = spec.strip()
    if spec in ("all", "*"):
        return list(range(world_size))
    valid = f"this pool has ranks {format_ranks(range(world_size))}"
    ranks: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                chunk = range(lo, hi + 1)
            else:
                chunk = [int(part)]
        except ValueError:
            raise ValueError(
                f"bad rank list {spec!r}: write ranks like '0,2-3' or 'all'; {valid}."
            ) from None
        for r in chunk:
            if not 0 <= r < world_size:
                raise ValueError(f"rank {r} is out of range: {valid}.")
            ranks.add(r)
    return sorted(ranks)


def _on_engine(r: RankInfo, e: EngineInfo, **moved) -> RankInfo:
    """Rank ``r`` on the new engine ``e`` (its id, pid and Slurm job and node), with what else ``moved``."""
    return replace(r, engine_id=e.engine_id, pid=e.pid, slurm_job=e.slurm_job, slurm_node=e.slurm_node,
                   **moved)


def ranks_named(ranks) -> str:
    """Ranks as a sentence names them.

    >>> ranks_named([3]), ranks_named([0, 1, 2, 5])
    ('rank 3', 'ranks 0-2,5')
    """
    ranks = list(ranks)
    return f"rank{'s' * (len(ranks) > 1)} {format_ranks(ranks)}"


def ranks_text(n: int) -> str:
    """``n`` ranks as a sentence says it.

    >>> ranks_text(1), ranks_text(4)
    ('1 rank', '4 ranks')
    """
    return f"{n} rank{'s' * (n != 1)}"


def format_ranks(ranks) -> str:
    """The short form of a rank list: ``[0, 1, 2, 5]`` -> ``"0-2,5"``.

    >>> format_ranks([0, 1, 2, 5])
    '0-2,5'
    """
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)
