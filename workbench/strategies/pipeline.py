"""Pipeline parallel: the blocks split into consecutive stages, one per "pp" rank.

Activations flow forward from stage to stage and gradients back, microbatch by microbatch,
under a GPipe or 1F1B schedule from ``torch.distributed.pipelining``.

>>> stage = split_stage(model, stage=0, n_stages=2)      # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_blocks(n_layers: int, n_stages: int) -> list[range]:
    """Consecutive, near-equal runs of block indices, one per stage.

    >>> stage_blocks(5, 2)
    [range(0, 3), range(3, 5)]
    """
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"pp={n_stages} stages need 1 to {n_layers} layers' worth of blocks.")
    base, extra = divmod(n_layers, n_stages)
    bounds, lo = [], 0
    for s in range(n_stages):
        hi = lo + base + (s < extra)
        bounds.append(range(lo, hi))
        lo = hi
    return bounds


def split_stage(model: nn.Module, stage: int, n_stages: int) -> nn.Module:
    """Keep only this stage's part of ``model`` (in place): its blocks, ``pre`` on the
    first stage, ``post`` on the last. Parameter names stay those of the full model."""
    keys = list(model.blocks.keys())
    own = {keys[i] for i in stage_blocks(len(keys), n_stages)[stage]}
    for key in keys:
        if key not in own:
            del model.blocks[key]
    if stage != 0:
        model.pre = None
    if stage != n_stages - 1:
        model.post = None
    return model


class Pipelined(nn.Module):
    """This rank's pipeline stage and its schedule.

    ``step(x, y)`` runs one forward+backward over all microbatches: ``x`` is used on the
    first stage, ``y`` on the last; returns the mean microbatch loss on the last stage,
    ``None`` elsewhere. Gradients are scaled so they equal the unpipelined model's on the
    whole batch.
    """

    def __init__(self, module: nn.Module, stage: int, n_stages: int, group, device: torch.device,
                 loss_fn, schedule: str = "1f1b", microbatches: int = 4):
        super().__init__()
        self.module = module
        self.stage_index, self.n_stages, self.microbatches = stage, n_stages, microbatches
        self.stage = PipelineStage(module, stage, n_stages, device, group=group)
        self.schedule = SCHEDULES[schedule.lower()](self.stage, microbatches, loss_fn=loss_fn)

    def forward(self, *args, **kwargs):
        raise TypeError("a pipelined model runs through step(x, y), not model(x); export it and load the "
                        "full model for inference.")

    def step(self, x: torch.Tensor | None, y: torch.Tensor | None):
        batch = x if x is not None else y
        if batch is not None and batch.shape[0] % self.microbatches:
            raise ValueError(f"batch size {batch.shape[0]} is not divisible by microbatches="
                             f"{self.microbatches}.")
        first, last = self.stage_index == 0, self.stage_index == self.n_stages - 1
        losses: list = []
        args = (x,) if first else ()
        self.schedule.step(*args, target=y if last else None, losses=losses if last else None)
        return torch.stack(losses).mean() if last else None
