"""Lines of many ranks merged by position: identical lines once, lines that differ only in numbers once with
the spread. Pure functions and one class, used on each host (its hub merges its own ranks' lines) and in the
kernel (which merges the hosts' merged lines the same way).

At 64 ranks, ``[rank 17] step 40 loss 2.31`` printed by every rank is 64 lines that say one thing. When every
rank printed a line of the same shape (the same text once its numbers are taken out), they come out as one:
``[ranks 0-63] step 40 loss 2.29..2.35``, each number that differs shown as its smallest and largest value, as
the ranks wrote them. A merged line keeps each number's lowest and highest value (:class:`Line`), so merging
is associative: a host merges its 8 ranks, the kernel merges 16 hosts' lines into the same line that merging
the 128 ranks at once would give.

Imports nothing of the package but the rank map's short form of a rank list (a leaf).

>>> spread(["step 40 loss 2.31", "step 40 loss 2.29", "step 40 loss 2.35"])
'step 40 loss 2.29..2.35'
>>> a = combine([Line.of(0, "loss 2.31"), Line.of(1, "loss 2.29")], spread_numbers=True)
>>> b = combine([Line.of(2, "loss 2.35"), Line.of(3, "loss 2.30")], spread_numbers=True)
>>> both = combine([a, b], spread_numbers=True)
>>> both.ranks, both.text()
((0, 1, 2, 3), 'loss 2.29..2.35')
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from workbench.pool.rankmap import format_ranks

# A number as people print them: 40, -3, 2.31, 1e-05, 3.5E+2, .5, "cuda:1"'s 1, "3." at a sentence's end;
# not the digits inside a word ("v2", "epoch2").
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?!\w)(?!\.\d)")
_NUMBER_SPLIT = re.compile(f"({NUMBER.pattern})")
GAP = "\x00"  # where a number stood in a line's shape
STREAMS = ("stdout", "stderr")
# Lines that differ only in numbers are spread by default above this many ranks (below, a line per rank is
# still readable).
SPREAD_ABOVE = 8


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


def wanted(option: bool | None, ranks: int) -> bool:
    """Whether a cell's lines are spread: ``option`` as given (``--spread`` / ``--no-spread``), by default
    when the cell runs on more than :data:`SPREAD_ABOVE` ranks.

    >>> wanted(None, 8), wanted(None, 9), wanted(True, 2), wanted(False, 64)
    (False, True, True, False)
    """
    return ranks > SPREAD_ABOVE if option is None else option


def shape(line: str) -> tuple[str, list[str]]:
    """The line with its numbers taken out, and the numbers (as written).

    >>> shape("step 40 loss 2.31")
    ('step \\x00 loss \\x00', ['40', '2.31'])
    >>> shape("epoch2 done")
    ('epoch2 done', [])
    """
    parts = _NUMBER_SPLIT.split(line)  # one pass: text, number, text, ..., text
    return GAP.join(parts[::2]), parts[1::2]


def spread(lines: list[str]) -> str | None:
    """One line for ``lines`` (one per rank) of the same shape, with at least one number: every number
    that differs shown as ``min..max``; None where the shapes differ or there is nothing numeric.

    >>> spread(["rank 0 of 4", "rank 3 of 4"])
    'rank 0..3 of 4'
    >>> spread(["lr 1e-03 ok", "lr 5e-04 ok"])
    'lr 5e-04..1e-03 ok'
    >>> spread(["same", "same"]) is None
    True
    """
    if len(lines) < 2:
        return None
    one = combine([Line.of(i, line) for i, line in enumerate(lines)], spread_numbers=True)
    return one.text() if one is not None and one.cols else None


def _value(number: str) -> float:
    try:
        return float(number)
    except ValueError:  # "1e" cannot come out of NUMBER; be safe anyway
        return math.nan


@dataclass(frozen=True, slots=True)
class Line:
    """A line printed by ``ranks`` at one position of their output: its ``shape`` (the text, a
    :data:`GAP` where each number stood) and for each number its lowest and highest value as written.

    >>> Line.of(3, "step 40 loss 2.31")
    Line(ranks=(3,), shape='step \\x00 loss \\x00', cols=(('40', '40'), ('2.31', '2.31')))
    >>> Line.from_wire(Line.of(3, "x 1").to_wire()) == Line.of(3, "x 1")
    True
    """

    ranks: tuple[int, ...]
    shape: str
    cols: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, rank: int, text: str) -> Line:
        """One rank's line."""
        form, numbers = shape(text)
        return cls((rank,), form, tuple((n, n) for n in numbers))

    def text(self) -> str:
        """The line as shown: each number that differs between the ranks as ``lowest..highest``.

        >>> Line((0, 1), "loss \\x00 of \\x00", (("2.29", "2.35"), ("4", "4"))).text()
        'loss 2.29..2.35 of 4'
        """
        if not self.cols:
            return self.shape
        parts = self.shape.split(GAP)
        out = [parts[0]]
        for (lo, hi), part in zip(self.cols, parts[1:], strict=True):
            out.append((lo if lo == hi or _value(lo) == _value(hi) else f"{lo}..{hi}") + part)
        return "".join(out)

    def label(self) -> str:
        """``[rank 3] `` or ``[ranks 0-7] ``: who printed it."""
        return f"[rank {self.ranks[0]}] " if len(self.ranks) == 1 else f"[ranks {format_ranks(self.ranks)}] "

    def to_wire(self) -> list:
        return [list(self.ranks), self.shape, [list(c) for c in self.cols]]

    @classmethod
    def from_wire(cls, data: list) -> Line:
        ranks, form, cols = data
        return cls(tuple(int(r) for r in ranks), str(form), tuple((str(lo), str(hi)) for lo, hi in cols))


def combine(lines: list[Line], spread_numbers: bool) -> Line | None:
    """One line for ``lines`` (each printed by other ranks, at one position): when they are the same line,
    or (``spread_numbers``) of one shape, each number's range widened to cover them all; else None.

    >>> combine([Line.of(0, "same"), Line.of(1, "same")], spread_numbers=False).text()
    'same'
    >>> combine([Line.of(0, "x 1"), Line.of(1, "x 2")], spread_numbers=False) is None
    True
    >>> combine([Line.of(0, "x 10"), Line.of(1, "x 9"), Line.of(2, "x -2")], spread_numbers=True).text()
    'x -2..10'
    """
    first = lines[0]
    if any(line.shape != first.shape or len(line.cols) != len(first.cols) for line in lines[1:]):
        return None
    if not spread_numbers:
        if any(line.cols != first.cols for line in lines[1:]) or any(lo != hi for lo, hi in first.cols):
            return None
        return Line(tuple(r for line in lines for r in line.ranks), first.shape, first.cols)
    cols = []
    for i in range(len(first.cols)):
        lows = [line.cols[i][0] for line in lines]
        highs = [line.cols[i][1] for line in lines]
        if len(set(lows)) == 1 and len(set(highs)) == 1:
            cols.append((lows[0], highs[0]))
            continue
        lo = min(lows, key=_value)
        hi = max(highs, key=_value)
        cols.append((lo, hi))
    return Line(tuple(r for line in lines for r in line.ranks), first.shape, tuple(cols))


Unit = Hashable  # a rank (its own lines) or a host (the lines its hub merged over its ranks)


class Merger:
    """Merges the lines of several units (ranks, or hosts) by position and hands each merged line to
    ``emit(stream, line)``.

    A line every unit has at one position comes out once (:func:`combine`) when they agree; other lines come
    out as each unit had them. A line waits at most ``hold`` seconds for the other units'. A feed costs O(1):
    only a line every unit has waiting can come out at once (64 ranks printing: 64 feeds a line); lines held
    too long go at the next :meth:`poll`.

    ``units``: each unit and the ranks it stands for, in order.

    >>> out = []
    >>> m = Merger({0: (0,), 1: (1,)}, lambda stream, line: out.append(line.label() + line.text()), hold=10)
    >>> m.feed(0, "stdout", "same\\nr0\\n", now=0); m.feed(1, "stdout", "same\\nr1\\n", now=0)
    >>> m.close(); out
    ['[ranks 0-1] same', '[rank 0] r0', '[rank 1] r1']
    """

    def __init__(self, units: dict[Unit, tuple[int, ...]], emit: Callable[[str, Line], None],
                 hold: float, spread_numbers: bool = False):
        self.units = dict(units)
        self.emit = emit
        self.hold = hold
        self.spread_numbers = spread_numbers
        order = list(self.units)
        self.pending = {(u, s): deque() for u in order for s in STREAMS}
        self.partial = {(u, s): "" for u in order for s in STREAMS}
        self._queues = {s: [self.pending[(u, s)] for u in order] for s in STREAMS}
        self._filled = dict.fromkeys(STREAMS, 0)  # units with a line waiting, per stream

    def feed(self, unit: Unit, stream: str, text: str, now: float | None = None) -> None:
        """Text a one-rank unit printed (any part of a line, or many lines)."""
        key = (unit, stream)
        lines = (self.partial[key] + text).split("\n")
        self.partial[key] = lines.pop()
        if lines:
            rank = self.units[unit][0]
            self.feed_lines(unit, stream, [Line.of(rank, line) for line in lines], now)

    def feed_lines(self, unit: Unit, stream: str, lines: list[Line], now: float | None = None) -> None:
        """Whole lines of ``unit`` (a host's own merged lines)."""
        if not lines:
            return
        now = time.monotonic() if now is None else now
        queue = self.pending[(unit, stream)]
        if not queue:
            self._filled[stream] += 1
        queue.extend((line, now) for line in lines)
        if self._filled[stream] == len(self.units):
            self._merge(stream)

    def poll(self, now: float | None = None) -> None:
        """Merge what can be, and let go of lines that waited ``hold`` seconds for the other units'."""
        now = time.monotonic() if now is None else now
        for stream in STREAMS:
            self._merge(stream)
            for q in self._queues[stream]:
                while q and now - q[0][1] >= self.hold:
                    self.emit(stream, q.popleft()[0])
            self._filled[stream] = sum(1 for q in self._queues[stream] if q)

    def _merge(self, stream: str) -> None:
        queues = self._queues[stream]
        while all(queues):
            heads = [q.popleft()[0] for q in queues]
            one = combine(heads, self.spread_numbers) if len(heads) > 1 else None
            for line in [one] if one is not None else heads:
                self.emit(stream, line)
        self._filled[stream] = sum(1 for q in queues if q)

    def close(self) -> None:
        """Flush everything, partial last lines included."""
        for (unit, stream), text in self.partial.items():
            if text:
                self.partial[(unit, stream)] = ""
                self.pending[(unit, stream)].append((Line.of(self.units[unit][0], text), -math.inf))
        self.poll(now=math.inf)
