"""Batches from the notebook to the ranks and back, over the running session.

Runs in the kernel: imports torch only when given a tensor.

On 2 ranks, rank 0 gets ``x = tensor([0, 1, 2, 3])`` and rank 1 the rest:

>>> scatter(torch.arange(8), "x")       # doctest: +SKIP
[4, 4]
>>> gather("x")                         # doctest: +SKIP
tensor([0, 1, 2, 3, 4, 5, 6, 7])
"""

from __future__ import annotations

import sys
import types
from typing import Any


def scatter(value: Any, name: str = "batch", *, ranks=None, session=None) -> list[int]:
    """Send ``value`` split along dim 0 to the ranks: rank i gets part i as ``name``
    (:meth:`workbench.session.rank_view.RankView.scatter`).

    Returns each target rank's part length. ``ranks``: None (all), a rank or a list.
    """
    from workbench.session import current

    return (session or current()).view(ranks).scatter(value, name)


def gather(name: str = "batch", *, session=None) -> Any:
    """Every rank's ``name`` joined in rank order (``torch.cat`` for tensors, else concatenation).

    Values that are neither tensors, arrays nor lists come back as a list, one per rank.
    """
    from workbench.session import current

    return (session or current()).view().gather(name)


class _CallableModule(types.ModuleType):
    """``workbench.scatter`` is both this module and the function: once the module is
    imported, Python sets it as the package attribute, shadowing the lazy ``wb.scatter``
    function; calling the module calls the function, so ``wb.scatter(x)`` always works."""

    def __call__(self, *args, **kwargs):
        return scatter(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
