"""``shard``: one entry point that composes the strategies in one fixed order.

Order (torchtitan's): pipeline split outermost, then on this rank's stage tensor
parallel -> activation checkpointing -> compile -> FSDP/DDP. Mesh dims, outermost
first: "pp", "dp", "tp" (only those above 1).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from workbench.strategies.config import ParallelConfig
from workbench.strategies.ddp import CommTimer, ddp
from workbench.strategies.fsdp import fsdp
from workbench.strategies.layout import Layout, _arch, device_of
from workbench.strategies.mesh import broadcast_module, build_mesh
from workbench.strategies.pipeline import Pipelined, split_stage
from workbench.strategies.tensor_parallel import tensor_parallel


def plan(model: nn.Module, strategy: str | None = None, *, world_size: int | None = None,
         **options) -> ParallelConfig:
    """The checked config ``shard`` would use; raises ``ValueError`` listing every factor.

    Touches no process group beyond reading the world size.
    """
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_initialized() else 1
    config = ParallelConfig.from_args(world_size, strategy, **options)
    n_layers = len(model.blocks) if hasattr(model, "blocks") else None
    if n_layers is None and (config.pp > 1 or config.tp > 1 or config.data_parallel == "fsdp"):
        raise ValueError(f"{type(model).__name__} has no `blocks`: tp, pp and fsdp need a model with "
                         "pre/blocks/post parts, like workbench.train.MLP or TinyGPT.")
    divisors = model.tp_divisors() if hasattr(model, "tp_divisors") else {}
    config.check(world_size=world_size, n_layers=n_layers, tp_divisors=divisors)
    return config


def shard(model: nn.Module, strategy: str | None = None, **options) -> nn.Module:
    """Shard ``model`` across the ranks; returns what to train (with ``.wb_layout``).

    ``strategy``: "ddp", "fsdp", "tp", "pp" or None, plus any :class:`ParallelConfig`
    field (``dp``, ``tp``, ``pp``, ``schedule``, ``microbatches``, ...). Every rank must
    call it with the same model (rank 0's weights are broadcast first).

    >>> model = wb.shard(TinyGPT(cfg), "fsdp")                            # doctest: +SKIP
    >>> model = wb.shard(MLP(), dp=2, pp=2, schedule="gpipe")            # doctest: +SKIP
    """
    config = plan(model, strategy, **options)
    arch, loss_fn = _arch(model), getattr(model, "loss_fn", None)
    device = device_of(model)
    broadcast_module(model)
    mesh = build_mesh(config.degrees, device.type)
    layout = Layout(config=config, mesh=mesh, arch=arch, loss_fn=loss_fn)
    stage = mesh["pp"].get_local_rank() if config.pp > 1 else 0
    if config.pp > 1:
        split_stage(model, stage, config.pp)
    if config.tp > 1:
        tensor_parallel(model, mesh)
    if config.activation_checkpoint:
        _checkpoint_blocks(model)
    if config.compile:
        for block in model.blocks.values():
            block.compile()
    if config.data_parallel == "fsdp":
        fsdp(model, mesh, mixed_precision=config.mixed_precision)
    layout.base = model
    if config.pp > 1:
        model = Pipelined(model, stage, config.pp, mesh["pp"].get_group(), device, loss_fn,
                          config.schedule, config.microbatches)
        layout.schedule = model.schedule
    elif config.data_parallel == "ddp":
        model = ddp(model, mesh, device=device)
        layout.comm = model.wb_comm
    layout.comm = layout.comm or CommTimer()
    model.wb_layout = layout
    return model


def _checkpoint_blocks(model: nn.Module) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for key in list(model.blocks.keys()):
        model.blocks[key] = checkpoint_wrapper(model.blocks[key])


def unwrap(model: nn.Module) -> nn.Module:
    """The module that holds the parameters (the stage for a pipeline, inside DDP)."""
    layout = getattr(model, "wb_layout", None)
    if layout is not None and layout.base is not None:
        return layout.base
    return getattr(model, "module", model)


__all__ = ["plan", "shard", "unwrap"]
