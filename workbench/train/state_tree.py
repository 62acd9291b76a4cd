"""Moving a state tree (dicts, lists, tuples, tensors, plain values) from one rank to every rank.

>>> _fill(_strip({"a": [torch.ones(2), 3]}, box := []), box)
{'a': [tensor([1., 1.]), 3]}
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class _Slot:
    """Where a tensor was in a tree sent by :func:`broadcast_tree`."""

    index: int
    shape: tuple
    dtype: torch.dtype
    cuda: bool


def broadcast_tree(tree, src: int, device: torch.device):
    """``src``'s ``tree`` (dicts, lists, tuples, tensors and plain values) on every rank.

    The structure travels pickled (one small object); each tensor by ``dist.broadcast``, so a large
    optimizer state is not pickled. Returns the tree (on ``src``: the same one).
    """
    tensors: list[torch.Tensor] = []
    box = [_strip(tree, tensors) if _rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    skeleton = box[0]
    slots = list(_slots(skeleton))
    if _rank() != src:
        tensors = [torch.empty(s.shape, dtype=s.dtype, device=device if s.cuda else "cpu") for s in slots]
    for t in tensors:
        dist.broadcast(t, src=src)
    return tree if _rank() == src else _fill(skeleton, tensors)


def _strip(tree, tensors: list):
    if isinstance(tree, torch.Tensor):
        tensors.append(tree.detach().contiguous())
        return _Slot(len(tensors) - 1, tuple(tree.shape), tree.dtype, tree.is_cuda)
    if isinstance(tree, dict):
        return {k: _strip(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_strip(v, tensors) for v in tree)
    return tree


def _slots(tree):
    if isinstance(tree, _Slot):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _slots(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _slots(v)


def _fill(tree, tensors: list):
    if isinstance(tree, _Slot):
        return tensors[tree.index]
    if isinstance(tree, dict):
        return {k: _fill(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(v, tensors) for v in tree)
    return tree


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


__all__ = ["broadcast_tree"]
