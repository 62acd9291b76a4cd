"""Where a Trainer's batches come from, step by step: the :class:`Feed` seam.

A plain run's feed is :class:`PlainFeed` (a DataLoader, epoch after epoch); an elastic run's is
:class:`~workbench.train.elastic.ElasticRun` (positions in the epoch that survive a change of world size).
The Trainer prefetches one step ahead and tells its feed when a step begins, ends or is abandoned; the
feed never changes the Trainer (it asks: ``trainer._next_epoch()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.train.trainer import Trainer


class Feed:
    """Where a Trainer's batches come from, step by step: the one interface a plain run
    (:class:`PlainFeed`) and an elastic run (:class:`~workbench.train.elastic.ElasticRun`) implement.

    The Trainer prefetches one step ahead: ``fetch`` gives the next step's micro-batches, ``take`` says
    the step that begins uses them, ``commit`` that it is done (taken, or skipped alike on every rank),
    ``abandon`` forgets every step fetched and not committed (an elastic regroup takes them again).
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

    def check_group(self) -> None:
        """Before the step's all-reduce: raise if the process group is gone under this rank."""

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


__all__ = ["Feed", "PlainFeed"]
