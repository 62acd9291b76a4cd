"""Training events: what metrics, widgets and checkpoints attach to.

>>> class PrintLoss(Callback):
...     def on_step_end(self, trainer, stats):
...         print(stats.step, round(stats.loss, 3))
>>> default_callbacks.append(PrintLoss())        # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class StepStats:
    """One optimizer step, the same on every rank except the timings and ``rank_loss`` (seconds).

    ``loss``: mean over the data-parallel ranks; ``samples``/``tokens``: over all of them.
    ``rank_loss``: the mean loss of this rank's own batches (what the dashboard draws per rank: a rank
    whose data or numerics drift shows apart from the others); nan on a pipeline stage that holds no loss.
    ``comm_time``: measured collectives (gradient all-reduces through the DDP hook, the
    step's flag all-reduce, the grad-norm all-reduce); under DDP it overlaps compute.
    ``mem_peak``/``mem_reserved_peak``: the most CUDA memory allocated/reserved during the step
    (bytes; None on the CPU).
    """

    step: int
    loss: float
    lr: float
    samples: int
    tokens: int
    step_time: float
    compute_time: float
    comm_time: float
    data_time: float
    mem_peak: int | None = None
    mem_reserved_peak: int | None = None
    rank_loss: float = math.nan


class Callback:
    """Override any of these; each is called on every rank."""

    def on_run_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer, stats: StepStats) -> None:
        pass

    def on_run_end(self, trainer) -> None:
        pass

    def on_regroup(self, trainer, event: dict) -> None:
        """An elastic run changed its ranks (one lost, or some joined) and goes on; ``event`` says how
        (``step``, ``world_size``, ``lost``, ``joined``, ``text``, ``source`` of the state)."""


# Every Trainer calls these after its own callbacks, as registered at each event (the dashboard's publisher).
default_callbacks: list[Callback] = []
