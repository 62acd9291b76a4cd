"""A set of ranks of a running pool, and what a notebook does with them: push, pull, apply, scatter, gather.

As ipyparallel's ``DirectView`` carries execute/push/pull/scatter/gather for a set of engines, a
:class:`RankView` carries them for a set of torch ranks. It resolves its ranks on every call (a restart
or a scale may have changed which engine is which rank) and refuses a dead rank by name. It sends through the
pool's door (:class:`~workbench.remote.door.Door`: the user's own data, the user's own functions).
:class:`Session` makes one with :meth:`Session.view` and forwards its own ``push``/``pull``/``apply`` to it.

Runs in the kernel: imports no torch (only when it joins tensors a gather brought back).

>>> v = s.view("0-1")                    # doctest: +SKIP
>>> v.targets                            # doctest: +SKIP
[0, 1]
>>> v.scatter(torch.arange(8), "x")      # doctest: +SKIP
[4, 4]
>>> v.gather("x")                        # doctest: +SKIP
tensor([0, 1, 2, 3, 4, 5, 6, 7])
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from ipyparallel.error import CompositeError, RemoteError

from workbench.errors import RankDiedError
from workbench.pool.rankmap import RankInfo, format_ranks

Resolve = Callable[[Any], list[RankInfo]]  # None / a rank / a list / "0,2-3" -> the ranks, checked


class RankView:
    """The ranks ``ranks`` (``None``: all) of a running session.

    ``resolve`` checks and resolves the ranks (the session's :meth:`~Session.targets`), ``door`` gives the
    pool's door (the one of the pool running now), ``dead`` the dead ranks with how they died, and
    ``on_push`` hears what was pushed to every rank (a new engine's setup replays it).
    """

    def __init__(self, ranks, *, resolve: Resolve, door: Callable[[], Any],
                 dead: Callable[[], dict[int, str]],
                 on_push: Callable[[dict], None] | None = None):
        self.ranks = ranks
        self._resolve, self._door, self._dead, self._on_push = resolve, door, dead, on_push

    def __repr__(self) -> str:
        return f"<RankView ranks={'all' if self.ranks is None else self.ranks!r}>"

    @property
    def targets(self) -> list[int]:
        """The ranks this view reaches now, in rank order."""
        return [r.rank for r in self._resolve(self.ranks)]

    def alive(self) -> list[RankInfo]:
        """The ranks, refusing the first dead one by name (``RankDiedError``)."""
        targets = self._resolve(self.ranks)
        dead = self._dead()
        gone = [r for r in targets if r.rank in dead]
        if gone:
            raise RankDiedError(f"{gone[0].label()} is dead ({dead[gone[0].rank]}): `%dist restart` brings "
                                "it back.")
        return targets

    def push(self, values: dict) -> None:
        """Send ``{name: value}`` into the namespace of every rank of the view.

        A value that cannot be sent (a generator, a lock, an open file) is a ``ValueError`` saying so.
        """
        try:
            self._door().push(self.alive(), values)
        except (TypeError, AttributeError, pickle.PicklingError) as exc:  # pickle's refusals
            raise ValueError(f"cannot send {', '.join(values)} to the ranks: {exc}. Send data (numbers, "
                             "lists, arrays, tensors), or build the object on the ranks in a "
                             "%%distributed cell.") from None
        if self.ranks is None and self._on_push is not None:
            self._on_push(values)

    def pull(self, name: str) -> list:
        """Every rank's ``name``, in rank order; a name some rank lacks is a ``NameError`` naming them."""
        targets = self.alive()
        try:
            return self._door().pull(targets, name)
        except (RemoteError, CompositeError) as exc:
            errors = exc.elist if isinstance(exc, CompositeError) else [(exc.ename, exc.evalue, None, None)]
            if any(e[0] == "NameError" for e in errors):
                where = format_ranks([r.rank for r in targets])
                raise NameError(f"{name!r} is not defined on rank {where}: set it in a %%distributed cell "
                                "first.") from None
            raise

    def apply(self, fn: Callable, *args, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on every rank of the view at once; the results in rank order."""
        return self._door().apply(self.alive(), fn, *args, **kwargs)

    def scatter(self, value: Any, name: str = "batch") -> list[int]:
        """Send ``value`` cut along dim 0: the i-th rank of the view gets part i as ``name``.

        Returns each rank's part length.
        """
        targets = self.alive()
        parts = split(value, len(targets))
        for rank, part in zip(targets, parts, strict=True):
            self._door().push([rank], {name: part})
        return [len(p) for p in parts]

    def gather(self, name: str = "batch") -> Any:
        """Every rank's ``name`` joined in rank order (see :func:`join`)."""
        return join(self.pull(name))


def split(value: Any, n: int) -> list:
    """``value`` cut along dim 0 into ``n`` contiguous parts (sizes differ by at most 1).

    >>> split([1, 2, 3, 4, 5], 2)
    [[1, 2, 3], [4, 5]]
    >>> split((1, 2, 3), 2)
    [(1, 2), (3,)]
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


def join(values: list) -> Any:
    """The ranks' parts joined in rank order: ``torch.cat`` for tensors, ``numpy.concatenate`` for
    arrays, concatenation for lists; anything else comes back as the list, one per rank.

    >>> join([[0, 1], [2]])
    [0, 1, 2]
    >>> join([3, 4])
    [3, 4]
    """
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
