"""Rank-labelled output for ``%%distributed``: live lines, identical lines shown once, lines that differ
only in numbers shown once with the spread (:mod:`workbench.magics.spread`; by default above 8 ranks)."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable

from workbench.magics.spread import spread
from workbench.pool.rankmap import format_ranks

# How long a line waits for the other ranks to print the same line before it is shown alone: with the
# engines' 0.05 s output flush and the cell's 0.05 s tick, a line shows within 0.2 s of its print.
HOLD_SECONDS = 0.1


def hold_for(ranks: int) -> float:
    """How long a line waits for the other ranks' at this many ranks: the lines of 64 engines on a few busy
    cores arrive over longer than those of 2 (0.1 s up to 8 ranks, at most 0.5 s).

    >>> hold_for(2), hold_for(64)
    (0.1, 0.5)
    """
    return min(0.5, HOLD_SECONDS * max(1.0, ranks / 8))


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

    def __init__(self, ranks: list[int], emit: Callable[[str, str], None], hold: float = HOLD_SECONDS,
                 spread_numbers: bool = False):
        self.ranks = list(ranks)
        self.emit = emit
        self.hold = hold
        self.spread_numbers = spread_numbers  # lines that differ only in numbers: one line with the spread
        self.pending = {(r, s): deque() for r in self.ranks for s in ("stdout", "stderr")}
        self.partial = {(r, s): "" for r in self.ranks for s in ("stdout", "stderr")}
        self._queues = {s: [self.pending[(r, s)] for r in self.ranks] for s in ("stdout", "stderr")}
        self._filled = {"stdout": 0, "stderr": 0}  # ranks with a line waiting, per stream

    def feed(self, rank: int, stream: str, text: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        key = (rank, stream)
        lines = (self.partial[key] + text).split("\n")
        self.partial[key] = lines.pop()
        queue = self.pending[key]
        if lines and not queue:
            self._filled[stream] += 1
        queue.extend((line, now) for line in lines)
        # only a line every rank has waiting can come out now (lines held too long go at the next poll):
        # a feed costs O(1), not a look at every rank's queue (64 ranks printing: 64 feeds a line)
        if self._filled[stream] == len(self.ranks):
            self._merge(stream)

    def poll(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for stream in ("stdout", "stderr"):
            self._merge(stream)
            for r, q in zip(self.ranks, self._queues[stream], strict=True):
                while q and now - q[0][1] >= self.hold:
                    self._line(stream, f"[rank {r}] ", q.popleft()[0])
            self._filled[stream] = sum(1 for q in self._queues[stream] if q)

    def _merge(self, stream: str) -> None:
        """Lines every rank has waiting, one position at a time: once where they are the same (or of one
        shape, with ``spread_numbers``), else one a rank."""
        queues = self._queues[stream]
        while all(queues):
            heads = [q.popleft()[0] for q in queues]
            one = heads[0] if len(set(heads)) == 1 else spread(heads) if self.spread_numbers else None
            if len(self.ranks) > 1 and one is not None:
                self._line(stream, f"[ranks {format_ranks(self.ranks)}] ", one)
            else:
                for r, line in zip(self.ranks, heads, strict=True):
                    self._line(stream, f"[rank {r}] ", line)
        self._filled[stream] = sum(1 for q in queues if q)

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
