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


def split(value: Any, n: int) -> list:
    """``value`` cut along dim 0 into ``n`` contiguous parts (sizes differ by at most 1).

    >>> split([1, 2, 3, 4, 5], 2)
    [[1, 2, 3], [4, 5]]
    """
    if n < 1:
        raise ValueError(f"cannot split into {n} parts.")
    if hasattr(value, "shape") and hasattr(value, "__getitem__") and len(value.shape) > 0:
        length = value.shape[0]
    elif isinstance(value, (list, tuple)):
        length = len(value)
    else:
        raise ValueError(f"scatter takes a tensor, an array or a list, not {type(value).__name__}: "
                         "push it whole with Session.push instead.")
    base, extra = divmod(length, n)
    parts, lo = [], 0
    for i in range(n):
        hi = lo + base + (i < extra)
        parts.append(value[lo:hi])
        lo = hi
    return [type(value)(p) if isinstance(value, tuple) else p for p in parts]


def scatter(value: Any, name: str = "batch", *, ranks=None, session=None) -> list[int]:
    """Send ``value`` split along dim 0 to the ranks: rank i gets part i as ``name``.

    Returns each target rank's part length. ``ranks``: None (all), a rank or a list.
    """
    from workbench.session import current

    s = session or current()
    targets = [r.rank for r in s.targets(ranks)]
    parts = split(value, len(targets))
    for rank, part in zip(targets, parts, strict=True):
        s.push({name: part}, ranks=rank)
    return [len(p) for p in parts]


def gather(name: str = "batch", *, session=None) -> Any:
    """Every rank's ``name`` joined in rank order (``torch.cat`` for tensors, else concatenation).

    Values that are neither tensors, arrays nor lists come back as a list, one per rank.
    """
    from workbench.session import current

    s = session or current()
    values = s.pull(name)
    first = values[0]
    if type(first).__module__.startswith("torch") and hasattr(first, "shape"):
        import torch

        return torch.cat([v.reshape(1) if v.dim() == 0 else v for v in values])
    if type(first).__module__.startswith("numpy"):
        import numpy

        return numpy.concatenate([numpy.atleast_1d(v) for v in values])
    if isinstance(first, (list, tuple)):
        return [x for v in values for x in v]
    return values


class _CallableModule(types.ModuleType):
    """``workbench.scatter`` is both this module and the function: once the module is
    imported, Python sets it as the package attribute, shadowing the lazy ``wb.scatter``
    function; calling the module calls the function, so ``wb.scatter(x)`` always works."""

    def __call__(self, *args, **kwargs):
        return scatter(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
