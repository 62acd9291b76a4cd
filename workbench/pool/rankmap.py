"""The stable map rank -> (host, local rank, device, engine).

Users speak in ranks; ipyparallel engine ids are an internal detail that changes
when engines restart. Pure functions only: no ipyparallel, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EngineInfo:
    """What an engine reports about itself when it comes up."""

    engine_id: int
    host: str
    pid: int
    gpus: int = 0  # GPUs visible to the engine's process


@dataclass(frozen=True)
class RankInfo:
    """One rank of the process group and where it lives."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    pid: int
    device: str  # "cpu" or "cuda:N"
    engine_id: int

    def label(self) -> str:
        return f"rank {self.rank} ({self.host}, {self.device})"


def build_rank_map(engines: list[EngineInfo]) -> list[RankInfo]:
    """Give ranks to engines: contiguous per host, hosts in order of their first engine.

    Each engine on a host gets the next local rank and, where the host has GPUs, the
    GPU of that index; an engine beyond the host's GPU count runs on the CPU.

    >>> m = build_rank_map([EngineInfo(5, "b", 10, 1), EngineInfo(3, "a", 11), EngineInfo(4, "b", 12, 1)])
    >>> [(r.rank, r.host, r.local_rank, r.device, r.engine_id) for r in m]
    [(0, 'a', 0, 'cpu', 3), (1, 'b', 0, 'cuda:0', 4), (2, 'b', 1, 'cpu', 5)]
    """
    by_host: dict[str, list[EngineInfo]] = {}
    for e in sorted(engines, key=lambda e: e.engine_id):
        by_host.setdefault(e.host, []).append(e)
    ranks: list[RankInfo] = []
    for node_rank, (host, members) in enumerate(by_host.items()):
        for local_rank, e in enumerate(members):
            device = f"cuda:{local_rank}" if local_rank < e.gpus else "cpu"
            ranks.append(RankInfo(len(ranks), local_rank, node_rank, host, e.pid, device, e.engine_id))
    return ranks


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
        out.append(replace(r, engine_id=e.engine_id, pid=e.pid))
    return out


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
