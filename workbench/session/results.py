"""What a cell produced on each rank, how each rank ended, and the sentences that say so.

Each rank of a cell ends one way (``RankResult.outcome``):

- ``ok``: it ran to its end before anything went wrong;
- ``error``: it raised, and that was not the echo of another rank's failure;
- ``stopped``: it was cut short because another rank failed (released from a collective by the
  abort, or interrupted): never counted as "without error";
- ``interrupted``: Ctrl-C or a timeout stopped it (at a step boundary, or where it was);
- ``died``: its engine process is gone; ``killed``: we ended it because it ignored every gentler step;
- ``lost``: it died or hung in an elastic run, which went on without it (not a failure of the cell).

>>> summary_line([RankResult(_info(0), outcome="ok"), RankResult(_info(1), outcome="error",
...               error=_Err("ValueError", "bad batch"))])
'2 ranks · 1 ok · 1 error (rank 1: ValueError: bad batch)'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from workbench import faults
from workbench.pool.rankmap import RankInfo, format_ranks

OUTCOMES = ("ok", "error", "died", "killed", "stopped", "interrupted", "lost")
# A frame of the cell in an IPython traceback: "Cell In[3], line 5" or "Cell In[3], line 3, in f()"
_CELL_FRAME = re.compile(r"Cell In\[\d+\], line (\d+)(?:, in (\w+))?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Frames a collective's error passes through: our tracking wrapper and torch.distributed itself.
COLLECTIVE_FRAMES = ("workbench/engine/guard.py", "torch/distributed/")


@dataclass
class RankResult:
    """What one rank produced for one cell, and how it ended (one of :data:`OUTCOMES`)."""

    rank: RankInfo
    stdout: str = ""
    stderr: str = ""
    result: dict | None = None  # the last expression's mime bundle, e.g. {"text/plain": "42"}
    outputs: list = field(default_factory=list)  # display_data contents
    error: Any = None  # ipyparallel RemoteError, or RankDied
    completed: Any = None
    outcome: str = "ok"
    where: str | None = None  # where it stopped, e.g. "cell line 3 (in f)", when it was cut short
    origin: str | None = None  # where the rank says its failure came from (faults.origin_of)
    lost: str | None = None  # an elastic run's lost rank: how and when, "died after step 100 (12:03:04)"


@dataclass
class CellResult:
    """Every target rank's result, in rank order."""

    ranks: list[RankResult]
    elapsed: float
    fault: faults.FaultEvent | None = None
    hints: list[str] = field(default_factory=list)  # what to do, one line each (:mod:`.hints`)
    group_broken: bool = True  # whether the group needs re-forming after this cell (a fault line says so)

    def failures(self) -> list[RankResult]:
        """The ranks that failed, root cause first: dead ranks, then real errors, then echoes."""
        def order(r):
            err = r.error
            echo = faults.is_secondary(err.ename, str(err.evalue), r.origin)
            tier = 0 if isinstance(err, RankDied) else 2 if echo else 1
            done = r.completed.timestamp() if hasattr(r.completed, "timestamp") else float("inf")
            return tier, done, r.rank.rank
        return sorted((r for r in self.ranks if r.error is not None), key=order)

    def ranks_with(self, *outcomes: str) -> list[int]:
        return [r.rank.rank for r in self.ranks if r.outcome in outcomes]

    def summary_line(self) -> str:
        """:func:`summary_line` of these ranks (what :class:`~workbench.errors.CellError` shows first)."""
        return summary_line(self.ranks)


class RankDied:
    """The error of a rank whose engine process is gone: it has no traceback of its own, only how it went.

    >>> died = RankDied(_info(1), "exited")
    >>> str(died), died.render_traceback()
    ('its engine process 101 exited', [])
    """

    ename = "RankDied"

    def __init__(self, info: RankInfo, how: str):
        self.evalue = f"its engine process {info.pid} {how}"

    def __str__(self) -> str:
        return self.evalue

    def render_traceback(self) -> list[str]:
        return []  # the cell's error says how it died and what brings it back (errors.RankError)


def where_in_cell(error) -> str | None:
    """The innermost line of the cell in a rank's traceback: ``"cell line 3 (in f)"``.

    >>> where_in_cell(_Err("KeyboardInterrupt", "", "Cell In[1], line 5\\n...\\nCell In[1], line 3, in f()"))
    'cell line 3 (in f)'
    """
    frames = _CELL_FRAME.findall(plain_traceback(error))
    if not frames:
        return None
    line, fn = frames[-1]
    return f"cell line {line}" + (f" (in {fn})" if fn else "")


def raised_in_collective(error) -> bool:
    """Whether a rank's error came out of a torch.distributed call (by where it was raised, not its text).

    Such an error is the echo of a failure elsewhere when another rank failed or died: a root cause
    (a DistBackendError after a CUDA OOM) only when nothing else went wrong.

    >>> raised_in_collective(_Err("RuntimeError", "x", "File .../torch/distributed/distributed_c10d.py:2799"))
    True
    """
    text = getattr(error, "traceback", None) or ""
    return any(marker in text for marker in COLLECTIVE_FRAMES)


def summary_line(ranks: list[RankResult]) -> str:
    """One line for a cell that did not simply succeed: how many ranks ended which way."""
    parts = [f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}"]
    for outcome in OUTCOMES:
        these = [r for r in ranks if r.outcome == outcome]
        if not these:
            continue
        part = f"{len(these)} {outcome}{'s' if outcome == 'error' and len(these) > 1 else ''}"
        if outcome in ("error", "died", "killed"):
            first = these[0]
            said = "" if isinstance(first.error, RankDied) else \
                f": {first.error.ename}: {_short(first.error.evalue)}"  # how it died: the line above says
            part += f" (rank {first.rank.rank}{said})"
        parts.append(part)
    return " · ".join(parts)


def stop_report(ranks: list[RankResult], group_reformed: bool) -> str:
    """What an interrupt or a timeout did to each rank, and what holds now: sentences, no traceback.

    >>> print(stop_report([RankResult(_info(0), outcome="error", error=_Err("ValueError", "bad size")),
    ...                    RankResult(_info(1), outcome="ok"),
    ...                    RankResult(_info(2), outcome="interrupted", where="cell line 3")], False))
    rank 0 had raised ValueError: bad size
    rank 1 had finished.
    rank 2 stopped at cell line 3.
    Every rank keeps its Python state.
    """
    steps = {getattr(r.error, "ename", None) == "TrainingInterrupted" for r in ranks}
    if steps == {True}:
        return f"{_short(ranks[0].error.evalue)}."
    lines = []
    for r in ranks:
        label = f"rank {r.rank.rank}"
        if r.outcome == "killed":
            lines.append(f"{label} ignored the interrupt and the abort and was killed: its Python state "
                         "is lost.")
        elif r.outcome == "died":
            lines.append(f"{label} died ({r.error.evalue}).")
        elif r.outcome in ("interrupted", "stopped"):
            inside = " inside backward()" if in_backward(r.error) else ""
            lines.append(f"{label} stopped{inside} at {r.where or 'an unknown line'}.")
        elif r.outcome == "error":  # it raised before the stop: its own error, not "finished"
            lines.append(f"{label} had raised {r.error.ename}: {_short(r.error.evalue)}")
        elif r.error is None and r.outcome == "ok":
            lines.append(f"{label} had finished.")
        else:
            lines.append(f"{label} ended: {r.outcome}.")
    if any(r.outcome in ("interrupted", "stopped") and in_backward(r.error) for r in ranks):
        lines.append("A DistributedDataParallel model stopped inside backward() is left half-way through "
                     "its step: wrap its module again before training on (`model = DDP(model.module)`, "
                     "then `optimizer.zero_grad()`); `wb.Trainer` does this itself.")
    lost = [r.rank.rank for r in ranks if r.outcome in ("killed", "died")]
    if lost:
        lines.append(f"`%dist restart` brings rank {format_ranks(lost)} back; the other ranks keep their "
                     "state.")
    elif group_reformed:
        lines.append("Every rank keeps its Python state; the next cell re-forms the process group.")
    else:
        lines.append("Every rank keeps its Python state.")
    return "\n".join(lines)


_BACKWARD = re.compile(r"torch/_tensor\.py:\d+, in Tensor\.backward"
                       r"|torch/autograd/__init__\.py:\d+, in backward")


def in_backward(error) -> bool:
    """Whether the rank's traceback passes through ``Tensor.backward`` (autograd was running).

    >>> in_backward(_Err("KeyboardInterrupt", "", "File /t/torch/_tensor.py:630, in Tensor.backward(x)"))
    True
    >>> in_backward(_Err("KeyboardInterrupt", "", "File <cell>:2"))
    False
    """
    return bool(_BACKWARD.search(plain_traceback(error)))


def plain_traceback(error) -> str:
    """A rank's traceback without its colours ("" if it has none).

    >>> plain_traceback(_Err("ValueError", "x", "\x1b[31mValueError\x1b[39m: x"))
    'ValueError: x'
    """
    return _ANSI.sub("", getattr(error, "traceback", None) or "")


def _short(text, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Err:
    """A stand-in remote error for the examples above."""

    def __init__(self, ename: str, evalue: str, traceback: str = ""):
        self.ename, self.evalue, self.traceback = ename, evalue, traceback


def _info(rank: int) -> RankInfo:
    return RankInfo(rank, rank, 0, "host", 100 + rank, "cpu", rank)
