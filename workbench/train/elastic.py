"""Elastic training: a lost rank is routed around at the step it was lost in, and new ranks join.

``Trainer(..., elastic=True)`` (or ``elastic=ElasticConfig(...)``) builds an
:class:`~workbench.train.elastic_trainer.ElasticTrainer`. When a rank dies or hangs, the
kernel (:mod:`workbench.session.cell_elastic`) sends the ranks left a *regroup plan*: the new members in
rank order and a standby store to meet at. Each of them, its step cut off by the lost peer (or
released by its agent), takes the plan, forms the new group (:func:`workbench.engine.rendezvous.regroup`),
resets its wrapper onto it and agrees with the others on the state (``ElasticTrainer._sync_state``): the most
advanced rank's model, optimizer, counters and data position are everyone's. The abandoned step is then taken
again, its samples split over the ranks left (:class:`~workbench.train.data.ElasticLoader`), so no
sample of the epoch is skipped or seen twice. New ranks (``%dist restart``, ``%dist scale N``) join the
same way at a step or run boundary and receive the state from a peer.

What a lost rank costs:

- DDP (replicated): nothing. The ranks left hold everything; the abandoned step is redone.
- FSDP2 (sharded): the lost rank's shards are gone, so every rank rebuilds the model on the new world
  and loads the last checkpoint (a :class:`~workbench.train.checkpoint.Checkpoint` callback is required;
  a step-0 checkpoint is saved when a run starts without one). The steps since that checkpoint are
  taken again, from the data position saved with it.

Batch size policy (``batch=``): ``"global"`` (the default) keeps the global batch, so each rank takes
more samples when ranks are lost and the optimization is the same at every world size;
``"per_rank"`` keeps each rank's batch and scales the learning rate with the world size (linear rule).

>>> ElasticConfig(batch="per_rank").batch
'per_rank'
>>> ElasticConfig(batch="twice")
Traceback (most recent call last):
...
ValueError: unknown batch policy 'twice': choose 'global' (the default) or 'per_rank'.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from workbench.train.elastic_policy import GroupLost

BATCH_POLICIES = ("global", "per_rank")


@dataclass(frozen=True, kw_only=True)
class ElasticConfig:
    """How an elastic Trainer routes around a lost rank.

    ``batch``: "global" (keep the global batch; default) or "per_rank" (keep each rank's batch and scale
    the learning rate with the world size). ``min_ranks``: below this many ranks the run fails as a
    plain one would. ``hang_timeout``: seconds a step may wait on a rank that is not in the collective
    (or whose heartbeat stopped) before that rank counts as lost: it is killed and the run goes on
    without it. ``plan_wait``: seconds a rank whose collective failed waits for the kernel's regroup
    plan. ``rebuild``: for FSDP, a function returning the model unsharded (default: rebuilt from its
    config, for the workbench's own models). ``replace``: bring a lost rank back by itself where the
    pool can start an engine (a local pool with room on the machine): what ``%dist restart`` does
    during the run, without anyone typing it; the new rank joins at a step boundary.
    """

    batch: str = "global"
    min_ranks: int = 1
    hang_timeout: float = 60.0
    plan_wait: float = 15.0
    rebuild: Callable | None = None
    replace: bool = False

    def __post_init__(self):
        if self.batch not in BATCH_POLICIES:
            raise ValueError(f"unknown batch policy {self.batch!r}: choose 'global' (the default) or "
                             "'per_rank'.")
        if self.min_ranks < 1:
            raise ValueError(f"min_ranks must be at least 1 (got {self.min_ranks}).")
        if not self.hang_timeout > 0 or not self.plan_wait > 0:
            raise ValueError("hang_timeout and plan_wait must be positive seconds.")

    @classmethod
    def of(cls, elastic) -> ElasticConfig | None:
        """``Trainer(elastic=...)``: False/None (off), True (defaults) or an ElasticConfig."""
        if elastic is None or elastic is False:
            return None
        if elastic is True:
            return cls()
        if isinstance(elastic, cls):
            return elastic
        raise ValueError(f"elastic must be True, False or an ElasticConfig (got {elastic!r}).")


# While a new engine replays the notebook's setup (in a group of its own), ``Trainer.run`` does nothing:
# its state comes from a peer when it joins. The kernel sets it (``remote.set_replay``).
REPLAY = {"on": False}
_trainers: list = []  # weak references to the elastic Trainers of this engine, oldest first


# -- an engine that joins a run in progress ------------------------------------------------------------
def register(trainer) -> None:
    """An elastic Trainer was built on this engine (the newest is the one a joining engine trains)."""
    _trainers.append(weakref.ref(trainer))


def trainer_count() -> int:
    """How many elastic Trainers this engine has built (a new engine replays the setup until it has as
    many as the ranks it joins)."""
    return len(_trainers)


def latest_trainer():
    """The newest elastic Trainer of this engine that still exists, or None."""
    for ref in reversed(_trainers):
        trainer = ref()
        if trainer is not None:
            return trainer
    return None


def join_running(plan: dict):
    """On a new engine, after the setup replay: join the elastic run in progress at the others' next step
    boundary, take the state from a peer and train until the run ends. Returns the run's result."""
    trainer = latest_trainer()
    if trainer is None:
        raise RuntimeError("this engine has no elastic Trainer to join the run with: run the notebook's "
                           "setup on it first.")
    return trainer.join_run(plan)


SAME_DATA_ADVICE = (
    "A new engine replays the notebook's setup in a group of its own (world size 1): build the dataset "
    "without dist.get_world_size() or world_size (wb.make_loader splits it over the ranks), or run the "
    "setup on the new rank yourself with the sizes the others used.")


def data_difference(mine: dict, theirs: dict) -> str:
    """How one loader's :meth:`~workbench.train.data.ElasticLoader.signature` differs from another's
    ("" when alike).

    >>> data_difference({"samples": 4096, "seed": 0}, {"samples": 12288, "seed": 0})
    '4096 samples, not 12288'
    """
    return ", ".join(f"{mine.get(k)} {k}, not {v}" if k == "samples" else f"{k} {mine.get(k)}, not {v}"
                     for k, v in theirs.items() if mine.get(k) != v)


def check_joining_data(expected: dict) -> None:
    """On a new engine, after the setup replay: its newest elastic Trainer's data must be the data of
    the run it joins (``expected``: a running rank's signature), else a ValueError that says what differs."""
    trainer = latest_trainer()
    if trainer is None:
        return
    difference = data_difference(trainer.elastic.loader.signature(), expected)
    if difference:
        raise ValueError(f"the Trainer data the setup built here differs from the running ranks' "
                         f"({difference}). " + SAME_DATA_ADVICE)


__all__ = ["REPLAY", "ElasticConfig", "GroupLost", "check_joining_data", "join_running", "latest_trainer",
           "trainer_count"]
