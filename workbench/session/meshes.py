"""Sub-meshes: a pool's ranks split into disjoint named sets, each its own process group (pure functions).

A split (:meth:`workbench.session.Session.split`) gives each sub-mesh a name and a run of the pool's ranks in
order; :class:`~workbench.session.group.ProcessGroup` then forms one default group per sub-mesh (see
``docs/submeshes.md``). The kernel keeps naming ranks by their place in the pool; inside a sub-mesh's cell
``rank`` and ``world_size`` are the sub-mesh's. ``WHOLE`` stands for the pool not split (one group of all).

>>> split_plan([2, 2], None, 4)
{'m0': [0, 1], 'm1': [2, 3]}
>>> mesh_of({'a': [0, 1], 'b': [2, 3]}, 3)
'b'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workbench.pool.rankmap import format_ranks

WHOLE = "*"  # the key of the whole pool (not split, or a turn over every rank: a split, a join, a restart)


def split_plan(sizes: Sequence[int], names: Sequence[str] | None, world: int) -> dict[str, list[int]]:
    """The sub-meshes of a split of ``world`` ranks into ``sizes`` (in rank order), named ``names`` (default
    ``m0``, ``m1``, ...): name -> its pool ranks. A mistake is a ``ValueError`` saying what would fit.

    >>> split_plan([1, 3], ["small", "big"], 4)
    {'small': [0], 'big': [1, 2, 3]}
    >>> split_plan([2, 1], None, 4)
    Traceback (most recent call last):
    ...
    ValueError: the sizes 2 + 1 = 3 do not add up to the pool's 4 ranks: e.g. `%dist split 2 2`.
    >>> split_plan([2, 2], ["a", "a"], 4)
    Traceback (most recent call last):
    ...
    ValueError: sub-mesh names must differ: 'a' is given twice.
    """
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2:
        raise ValueError("a split needs at least two sizes (in rank order), e.g. `%dist split 2 2`; "
                         "`%dist join` makes the whole pool one group again.")
    if any(s < 1 for s in sizes):
        raise ValueError(f"every sub-mesh needs at least one rank (got sizes {' '.join(map(str, sizes))}).")
    if sum(sizes) != world:
        raise ValueError(f"the sizes {' + '.join(map(str, sizes))} = {sum(sizes)} do not add up to the "
                         f"pool's {world} ranks: e.g. `%dist split {_even(world)}`.")
    names = [f"m{i}" for i in range(len(sizes))] if names is None else [str(n).strip() for n in names]
    if len(names) != len(sizes):
        raise ValueError(f"{len(names)} names for {len(sizes)} sub-meshes: give one name per size.")
    for name in names:
        if not name.isidentifier():
            raise ValueError(f"sub-mesh name {name!r} is not a name: use letters, digits and _ (e.g. a, "
                             "lr_01).")
        if names.count(name) > 1:
            raise ValueError(f"sub-mesh names must differ: {name!r} is given twice.")
    plan, start = {}, 0
    for name, size in zip(names, sizes, strict=True):
        plan[name] = list(range(start, start + size))
        start += size
    return plan


def _even(world: int) -> str:
    """Two halves where the pool has an even size, else one rank and the rest.

    >>> _even(4), _even(3)
    ('2 2', '1 2')
    """
    return f"{world // 2} {world // 2}" if world % 2 == 0 else f"1 {world - 1}"


def mesh_of(meshes: dict[str, list[int]], rank: int) -> str | None:
    """The name of the sub-mesh ``rank`` (of the pool) is in; None when the pool is not split."""
    for name, ranks in meshes.items():
        if rank in ranks:
            return name
    return None


def keys_for(meshes: dict[str, list[int]], ranks: Iterable[int]) -> frozenset[str]:
    """What a cell on ``ranks`` holds: the sub-meshes they lie in, or :data:`WHOLE` where the pool is not
    split. Two cells whose keys do not meet run at the same time.

    >>> sorted(keys_for({'a': [0, 1], 'b': [2, 3]}, [1, 2])), keys_for({}, [0])
    (['a', 'b'], frozenset({'*'}))
    """
    if not meshes:
        return frozenset({WHOLE})
    return frozenset(name for name, members in meshes.items() if set(members) & set(ranks))


def resolve_on(meshes: dict[str, list[int]], on: str, ranks: list[int] | None) -> list[int]:
    """The pool ranks of a cell ``--on`` the sub-mesh ``on`` (``ranks``: some of them, given as pool ranks).

    >>> resolve_on({'a': [0, 1], 'b': [2, 3]}, 'b', None)
    [2, 3]
    >>> resolve_on({'a': [0, 1]}, 'c', None)
    Traceback (most recent call last):
    ...
    ValueError: no sub-mesh 'c': this pool's are a (ranks 0-1).
    >>> resolve_on({}, 'a', None)
    Traceback (most recent call last):
    ...
    ValueError: the pool is not split: `%dist split 2 2 --names a,b` makes sub-meshes to run on.
    """
    if not meshes:
        raise ValueError("the pool is not split: `%dist split 2 2 --names a,b` makes sub-meshes to run on.")
    if on not in meshes:
        have = ", ".join(f"{n} (ranks {format_ranks(r)})" for n, r in meshes.items())
        raise ValueError(f"no sub-mesh {on!r}: this pool's are {have}.")
    members = meshes[on]
    if ranks is None:
        return list(members)
    outside = sorted(set(ranks) - set(members))
    if outside:
        raise ValueError(f"rank {format_ranks(outside)} is not in sub-mesh {on} (ranks "
                         f"{format_ranks(members)}): --ranks names ranks of the pool.")
    return sorted(set(ranks))
