"""Lines that differ only in their numbers, one line with the spread: when a cell's lines are spread.

The merging itself is :mod:`workbench.lines` (each host's hub merges its ranks' lines, the kernel the hosts'):
``[ranks 0-63] step 40 loss 2.29..2.35`` for 64 ranks that printed one loss line each.

>>> spread(["step 40 loss 2.31", "step 40 loss 2.29", "step 40 loss 2.35"])
'step 40 loss 2.29..2.35'
>>> wanted(None, 8), wanted(None, 9), wanted(True, 2), wanted(False, 64)
(False, True, True, False)
"""

from __future__ import annotations

from workbench.lines import NUMBER, SPREAD_ABOVE, shape, spread, wanted

__all__ = ["NUMBER", "SPREAD_ABOVE", "shape", "spread", "wanted"]
