"""Lines that differ only in their numbers, one line with the spread: pure functions for the output merger.

At 64 ranks, ``[rank 17] step 40 loss 2.31`` printed by every rank is 64 lines that say one thing. When
every rank printed a line of the same shape (the same text once its numbers are taken out), they come
out as one: ``[ranks 0-63] step 40 loss 2.29..2.35``, each number that differs shown as its smallest and
largest value, as the ranks wrote them.

>>> spread(["step 40 loss 2.31", "step 40 loss 2.29", "step 40 loss 2.35"])
'step 40 loss 2.29..2.35'
>>> spread(["loss 2.31", "accuracy 0.9"]) is None
True
"""

from __future__ import annotations

import re

# A number as people print them: 40, -3, 2.31, 1e-05, 3.5E+2, .5, "cuda:1"'s 1, "3." at a sentence's end;
# not the digits inside a word ("v2", "epoch2").
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?!\w)(?!\.\d)")
_NUMBER_SPLIT = re.compile(f"({NUMBER.pattern})")
# On by default above this many ranks (below, a line per rank is still readable).
SPREAD_ABOVE = 8


def shape(line: str) -> tuple[str, list[str]]:
    """The line with its numbers taken out, and the numbers (as written).

    >>> shape("step 40 loss 2.31")
    ('step \\x00 loss \\x00', ['40', '2.31'])
    >>> shape("epoch2 done")
    ('epoch2 done', [])
    """
    parts = _NUMBER_SPLIT.split(line)  # one pass: text, number, text, ..., text
    return "\x00".join(parts[::2]), parts[1::2]


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
    shapes = [shape(line) for line in lines]
    first, numbers = shapes[0]
    if not numbers or any(s != first or len(n) != len(numbers) for s, n in shapes[1:]):
        return None
    parts = first.split("\x00")
    out = [parts[0]]
    for i, part in enumerate(parts[1:]):
        column = [n[i] for _, n in shapes]
        out.append(_range(column) + part)
    return "".join(out)


def _range(column: list[str]) -> str:
    """``lo..hi`` of the numbers in ``column`` as they were written, or the one value they share.

    >>> _range(["2.31", "2.29", "2.35"]), _range(["40", "40"]), _range(["-1", "3"])
    ('2.29..2.35', '40', '-1..3')
    """
    if len(set(column)) == 1:
        return column[0]
    values = [float(c) for c in column]
    lo, hi = values.index(min(values)), values.index(max(values))
    return column[lo] if values[lo] == values[hi] else f"{column[lo]}..{column[hi]}"


def wanted(option: bool | None, ranks: int) -> bool:
    """Whether a cell's lines are spread: ``option`` as given (``--spread`` / ``--no-spread``), by default
    when the cell runs on more than :data:`SPREAD_ABOVE` ranks.

    >>> wanted(None, 8), wanted(None, 9), wanted(True, 2), wanted(False, 64)
    (False, True, True, False)
    """
    return ranks > SPREAD_ABOVE if option is None else option
