"""Rank-labelled output for ``%%distributed``: live lines, identical lines shown once, lines that differ
only in numbers shown once with the spread (:mod:`workbench.lines`; by default above 8 ranks).

On a pool whose hosts have a hub each, the hubs merge their own ranks' lines and the kernel merges the
hosts' lines (:meth:`LineMerger.feed_lines`); elsewhere the kernel merges the ranks' text itself
(:meth:`LineMerger.feed`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable

from workbench.lines import HOLD_SECONDS, Line, Merger


class LineMerger(Merger):
    """Turns per-rank text streams (or the hosts' merged lines) into labelled lines.

    A line that every rank printed at the same position comes out once as
    ``[ranks 0-1] line``; other lines come out as ``[rank N] line``. A line waits at
    most ``hold`` seconds for the other ranks. ``units``: instead of one unit a rank, the hosts (each with
    its ranks) whose hubs merged their ranks' lines.

    >>> out = []
    >>> m = LineMerger([0, 1], lambda stream, text: out.append(text), hold=10)
    >>> m.feed(0, "stdout", "same\\nr0\\n", now=0); m.feed(1, "stdout", "same\\nr1\\n", now=0)
    >>> m.close(); out
    ['[ranks 0-1] same\\n', '[rank 0] r0\\n', '[rank 1] r1\\n']
    """

    def __init__(self, ranks: list[int], emit: Callable[[str, str], None], hold: float = HOLD_SECONDS,
                 spread_numbers: bool = False, units: dict[Hashable, tuple[int, ...]] | None = None):
        self.ranks = list(ranks)
        self.text_out = emit
        super().__init__(units if units is not None else {r: (r,) for r in self.ranks}, self._line,
                         hold, spread_numbers)

    def _line(self, stream: str, line: Line) -> None:
        self.text_out(stream, line.label() + line.text() + "\n")


def print_stream(stream: str, text: str) -> None:
    (sys.stderr if stream == "stderr" else sys.stdout).write(text)
