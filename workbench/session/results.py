"""What a cell produced on each rank, and the error of a rank whose engine is gone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench import faults
from workbench.pool.rankmap import RankInfo


@dataclass
class RankResult:
    """What one rank produced for one cell."""

    rank: RankInfo
    stdout: str = ""
    stderr: str = ""
    result: dict | None = None  # the last expression's mime bundle, e.g. {"text/plain": "42"}
    outputs: list = field(default_factory=list)  # display_data contents
    error: Any = None  # ipyparallel RemoteError, or RankDied
    completed: Any = None


@dataclass
class CellResult:
    """Every target rank's result, in rank order."""

    ranks: list[RankResult]
    elapsed: float
    fault: faults.FaultEvent | None = None

    def failures(self) -> list[RankResult]:
        """The ranks that failed, root cause first: dead ranks, then real errors, then echoes."""
        def order(r):
            err = r.error
            echo = faults.is_secondary(err.ename, str(err.evalue))
            tier = 0 if isinstance(err, RankDied) else 2 if echo else 1
            done = r.completed.timestamp() if hasattr(r.completed, "timestamp") else float("inf")
            return tier, done, r.rank.rank
        return sorted((r for r in self.ranks if r.error is not None), key=order)


class RankDied:
    """The error of a rank whose engine process is gone."""

    ename = "RankDied"

    def __init__(self, info: RankInfo, how: str):
        self.evalue = f"the engine process {info.pid} of rank {info.rank} {how}"

    def render_traceback(self) -> list[str]:
        return [f"RankDied: {self.evalue}. `%dist restart` (Session.restart()) brings the rank back."]
