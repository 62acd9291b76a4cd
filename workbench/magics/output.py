"""Rank-labelled output for ``%%distributed``: live lines, identical lines shown once."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable

from workbench.pool.rankmap import format_ranks

# How long a line waits for the other ranks to print the same line before it is shown alone: with the
# engines' 0.05 s output flush and the cell's 0.05 s tick, a line shows within 0.2 s of its print.
HOLD_SECONDS = 0.1


class LineMerger:
    """Turns per-rank text streams into labelled lines.

    A line that every rank printed at the same position comes out once as
    ``[ranks 0-1] line``; other lines come out as ``[rank N] line``. A line waits at
    most ``hold`` seconds for the other ranks.

    >>> out = []
    >>> m = LineMerger([0, 1], lambda stream, text: out.append(text), hold=10)
    >>> m.feed(0, "stdout", "same\\nr0\\n", now=0); m.feed(1, "stdout", "same\\nr1\\n", now=0)
    >>> m.close(); out
    ['[ranks 0-1] same\\n', '[rank 0] r0\\n', '[rank 1] r1\\n']
    """

    def __init__(self, ranks: list[int], emit: Callable[[str, str], None], hold: float = HOLD_SECONDS):
        self.ranks = list(ranks)
        self.emit = emit
        self.hold = hold
        self.pending = {(r, s): deque() for r in self.ranks for s in ("stdout", "stderr")}
        self.partial = {(r, s): "" for r in self.ranks for s in ("stdout", "stderr")}

    def feed(self, rank: int, stream: str, text: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        key = (rank, stream)
        lines = (self.partial[key] + text).split("\n")
        self.partial[key] = lines.pop()
        self.pending[key].extend((line, now) for line in lines)
        self.poll(now)

    def poll(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for stream in ("stdout", "stderr"):
            queues = [self.pending[(r, stream)] for r in self.ranks]
            while all(queues):
                heads = [q.popleft()[0] for q in queues]
                if len(self.ranks) > 1 and len(set(heads)) == 1:
                    self._line(stream, f"[ranks {format_ranks(self.ranks)}] ", heads[0])
                else:
                    for r, line in zip(self.ranks, heads, strict=True):
                        self._line(stream, f"[rank {r}] ", line)
            for r, q in zip(self.ranks, queues, strict=True):
                while q and now - q[0][1] >= self.hold:
                    self._line(stream, f"[rank {r}] ", q.popleft()[0])

    def close(self) -> None:
        """Flush everything, partial last lines included."""
        for key, text in self.partial.items():
            if text:
                self.pending[key].append((text, -float("inf")))
                self.partial[key] = ""
        self.poll(now=float("inf"))

    def _line(self, stream: str, label: str, line: str) -> None:
        self.emit(stream, label + line + "\n")


def print_stream(stream: str, text: str) -> None:
    (sys.stderr if stream == "stderr" else sys.stdout).write(text)
