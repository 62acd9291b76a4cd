"""A failed rank's frames and locals, seen from the kernel (``%dist debug RANK``).

What runs on the rank is :mod:`workbench.engine.postmortem`, reached through the pool's door
(:class:`~workbench.remote.door.Door`, the catalogue's :func:`~workbench.remote.failed_frames` and
:func:`~workbench.remote.evaluate_in_failed`); the frames stay on the rank, and only until its next cell.

>>> pm = PostMortem(rank=1, error="ValueError: boom", frames=[
...     {"name": "<module>", "where": "cell line 4", "text": "g(3)", "locals": {}, "more": 0},
...     {"name": "g", "where": "cell line 3", "text": "raise ValueError('boom')",
...      "locals": {"a": "3"}, "more": 0}])
>>> print(pm.format())
rank 1 failed: ValueError: boom
frame 0: cell line 4 in <module>: g(3)
frame 1: cell line 3 in g: raise ValueError('boom')
    a = 3
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench import remote

DEBUG_TIMEOUT_S = 10.0


@dataclass
class PostMortem:
    """The failing frames of one rank's last cell, outermost first."""

    rank: int
    error: str
    frames: list[dict]

    def format(self) -> str:
        lines = [f"rank {self.rank} failed: {self.error}"]
        for i, f in enumerate(self.frames):
            text = f": {f['text']}" if f.get("text") else ""
            lines.append(f"frame {i}: {f['where']} in {f['name']}{text}")
            lines += [f"    {name} = {value}" for name, value in f["locals"].items()]
            if f.get("more"):
                lines.append(f"    ... and {f['more']} more")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.format()


def no_failure(rank: int) -> str:
    return (f"rank {rank} has no failed cell to look at: a failed cell's frames are kept until the next "
            "cell on that rank. Run the failing cell again, then `%dist debug RANK`.")


def _ask(door, info, timeout: float, fn, *args):
    """``fn(*args)`` on the engine of ``info`` (a rank), which answers once its main thread is free."""
    try:
        return door.call_one_within(timeout, fn, info, *args)
    except TimeoutError:
        raise ValueError(f"rank {info.rank} did not answer within {timeout:g} s: a cell (perhaps another "
                         "notebook's) is running on it. `%dist stacks` shows what it does now.") from None


def fetch(door, info, timeout: float = DEBUG_TIMEOUT_S) -> PostMortem:
    """The failed frames of the rank ``info`` (a ``RankInfo``), through ``door`` (the pool's)."""
    found = _ask(door, info, timeout, remote.failed_frames)
    if found is None:
        raise ValueError(no_failure(info.rank))
    return PostMortem(info.rank, found["error"], found["frames"])


def evaluate(door, info, expr: str, frame: int | None, timeout: float = DEBUG_TIMEOUT_S) -> str:
    """``expr`` evaluated on the rank ``info`` in frame ``frame`` (default: the innermost) of its failed
    cell."""
    rank = info.rank
    found = _ask(door, info, timeout, remote.evaluate_in_failed, expr, frame)
    if "error" in found:
        if found["error"].startswith("no failed cell"):
            raise ValueError(no_failure(rank))
        if found["error"].startswith("no frame"):
            raise ValueError(f"rank {rank}: {found['error']}")
        return f"rank {rank}, frame {frame if frame is not None else 'innermost'}: {found['error']}"
    return found["value"]
