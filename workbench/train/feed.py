"""Where a Trainer's batches come from, step by step: the :class:`Feed` seam.

A plain run's feed is :class:`PlainFeed` (a DataLoader, epoch after epoch); an elastic run's is
:class:`ElasticRun` (positions in the epoch that survive a change of world size, and the run's record:
its regroups and what the beacon says). The Trainer prefetches one step ahead and tells its feed when a
step begins, ends or is abandoned; a feed never changes the Trainer (it asks: ``trainer._next_epoch()``).
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING

import torch.distributed as dist

from workbench.train.data import ElasticLoader
from workbench.train.elastic_policy import per_rank_batch

if TYPE_CHECKING:
    from workbench.train.elastic import ElasticConfig
    from workbench.train.trainer import Trainer


class Feed:
    """Where a Trainer's batches come from, step by step: the one interface a plain run
    (:class:`PlainFeed`) and an elastic run (:class:`ElasticRun`) implement.

    The Trainer prefetches one step ahead: ``fetch`` gives the next step's micro-batches, ``take`` says
    the step that begins uses them, ``commit`` that it is done (taken, or skipped alike on every rank),
    ``abandon`` forgets every step fetched and not committed (an elastic regroup takes them again).
    A batch may carry a ``weight`` (its loss is scaled by it: an elastic rank's uneven share).
    """

    def fetch(self, trainer: Trainer) -> list | None:
        """``grad_accum`` batches on the trainer's device, or ``None`` when this rank's data ran out."""
        raise NotImplementedError

    def take(self, trainer: Trainer, batches: list) -> None:
        """A step begins with ``batches`` (the ones fetched first)."""

    def commit(self) -> None:
        """The step in progress is done."""

    def abandon(self) -> None:
        """Forget the steps fetched and not committed."""

    def counters(self) -> dict:
        """The data position to save with a checkpoint (beside the Trainer's own counters)."""
        return {}

    def restore(self, trainer: Trainer, counters: dict) -> None:
        """Stand where a checkpoint's ``counters`` say (the Trainer's step and epoch are set already)."""


class PlainFeed(Feed):
    """A plain run's batches: a DataLoader's (re-iterated every epoch, with ``sampler.set_epoch``), or any
    iterable of ``(x, y)`` batches (used once).

    >>> feed = PlainFeed([(1.0, 0.0)] * 3)           # a list: used once
    >>> feed.cyclic
    False
    """

    def __init__(self, data):
        self.data, self.iter = data, None
        self.consumed = 0  # batches taken in this epoch (for resuming a DataLoader)

    @property
    def cyclic(self) -> bool:
        return hasattr(getattr(self.data, "sampler", None), "set_epoch")

    def fetch(self, trainer: Trainer) -> list | None:
        batches = []
        for _ in range(trainer.config.grad_accum):
            batch = self._next_batch(trainer)
            if batch is None:
                return None
            batches.append(tuple(t.to(trainer.device, non_blocking=True) for t in batch))
        return batches

    def take(self, trainer: Trainer, batches: list) -> None:
        self.consumed += len(batches)

    def counters(self) -> dict:
        return {"consumed": self.consumed}

    def restore(self, trainer: Trainer, counters: dict) -> None:
        self.iter, self.consumed = None, 0
        if self.cyclic:
            for _ in range(int(counters.get("consumed", 0))):
                self._next_batch(trainer)
            self.consumed = int(counters.get("consumed", 0))

    def _next_batch(self, trainer: Trainer):
        if self.iter is None:
            if self.cyclic:
                self.data.sampler.set_epoch(trainer.epoch)
            self.iter = iter(self.data)
        try:
            return next(self.iter)
        except StopIteration:
            if not self.cyclic:
                return None
            trainer._next_epoch()
            self.consumed = 0
            self.data.sampler.set_epoch(trainer.epoch)
            self.iter = iter(self.data)
            return next(self.iter, None)


class _Batch(tuple):
    """One rank's micro-batch, with the weight that makes uneven shares average exactly: a rank with
    ``b`` of a step's ``G`` samples over ``w`` ranks scales its loss by ``b * w / G``."""

    weight: float = 1.0


_serials = itertools.count(1)


class ElasticRun(Feed):
    """An elastic Trainer's run (``trainer.elastic``): its data position (the Trainer's feed), the regroups
    it went through (``events``) and what the beacon says about it (:meth:`status`).

    Positions are ``(epoch, offset)`` in the epoch's permutation. ``committed``: where the next step
    begins; ``steps``: the fetched steps not committed yet (the one being taken, the one prefetched);
    ``last_step``: the samples of the last committed step (``position``, ``size``, ``world_size`` and
    this rank's ``indices``). ``base_world``: the world size the learning rates were set for (the
    ``per_rank`` batch policy scales them from it).
    """

    def __init__(self, config: ElasticConfig, data, *, fsdp: bool):
        self.config, self.fsdp = config, fsdp
        self.loader = data if isinstance(data, ElasticLoader) else ElasticLoader.from_loader(data)
        self.per_rank_batch = -(-self.loader.global_batch // _world())
        self.base_world = _world()
        self.committed = (0, 0)
        self.consumed = 0  # batches taken since the run began or was restored (as a plain run counts them)
        self.steps: deque = deque()
        self.last_step: dict | None = None
        self.serial = next(_serials)
        self.events: list[dict] = []  # every regroup this trainer went through

    def status(self) -> dict:
        """What the beacon says about the elastic run (the kernel decides on regroups from it)."""
        c = self.config
        return {"serial": self.serial, "min_ranks": c.min_ranks, "hang_timeout": c.hang_timeout,
                "fsdp": self.fsdp, "data": self.loader.signature(), "replace": c.replace}

    # -- the feed ------------------------------------------------------------------------------------
    def fetch(self, trainer: Trainer) -> list:
        """The next step's micro-batches for this rank (epochs roll over: the data never runs out)."""
        rank, world = _rank(), _world()
        position = self.steps[-1]["end"] if self.steps else self.committed
        batches, record = [], {"world_size": world, "size": 0, "indices": []}
        for _ in range(trainer.config.grad_accum):
            position = self.loader.start(*position, world)
            record.setdefault("position", position)
            size = self.loader.step_size(position)
            indices = self.loader.indices(position, rank, world)
            batch = _Batch(t.to(trainer.device, non_blocking=True) for t in self.loader.batch(indices))
            batch.weight = len(indices) * world / size
            batches.append(batch)
            record["size"] += size
            record["indices"] += indices
            position = self.loader.advance(position, world)
        self.steps.append(dict(record, end=position))
        return batches

    def take(self, trainer: Trainer, batches: list) -> None:
        """A step begins with the batches fetched first (they stay in flight until :meth:`commit`)."""
        self.consumed += len(batches)  # saved as a plain run's is (a plain Trainer resuming skips them)

    def commit(self) -> None:
        """The step in progress is done (taken, or skipped alike on every rank): its samples are used."""
        self.last_step = self.steps.popleft()
        self.committed = self.last_step["end"]

    def abandon(self) -> None:
        """Forget the step in progress and the prefetched one: they are taken again after a regroup."""
        self.steps.clear()

    def counters(self) -> dict:
        """Where the next step begins in the epoch, in samples (saved with a checkpoint)."""
        return {"epoch": self.committed[0], "offset": self.committed[1], "consumed": self.consumed}

    def restore(self, trainer: Trainer, counters: dict) -> None:
        """Stand where a checkpoint's ``counters`` say."""
        self.steps.clear()
        self.committed, self.consumed = (trainer.epoch, int(counters.get("offset", 0))), 0

    # -- what a regroup agrees on --------------------------------------------------------------------
    def numbers(self) -> dict:
        """What every member says about its batch when a group forms (the source's are everyone's)."""
        return {"global_batch": self.loader.global_batch, "per_rank_batch": self.per_rank_batch,
                "lr_world": self.base_world, "data": self.loader.signature()}

    def take_numbers(self, source: dict) -> None:
        """The batch sizes and learning-rate world of ``source``'s :meth:`numbers`."""
        self.loader.global_batch, self.per_rank_batch = source["global_batch"], source["per_rank_batch"]
        self.base_world = source["lr_world"]

    def position(self) -> dict:
        """The data position a rank copies from the source rank (with its model and optimizer)."""
        return {"committed": list(self.committed)}

    def take_position(self, source: dict) -> None:
        self.committed = tuple(source["committed"])

    def resize(self, world: int) -> float:
        """The ``per_rank`` batch policy at ``world`` ranks: the global batch grows or shrinks with the
        ranks; returns the factor on the learning rates (the linear rule)."""
        self.loader.global_batch, factor = per_rank_batch(self.per_rank_batch, world, self.base_world)
        self.base_world = world
        return factor

    def record(self, event: dict) -> None:
        """One regroup this run went through (``trainer.elastic.events``)."""
        self.events.append(event)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


__all__ = ["ElasticRun", "Feed", "PlainFeed"]
