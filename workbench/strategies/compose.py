"""``shard``: one entry point that composes the strategies in one fixed order.

Order (torchtitan's): pipeline split outermost, then on this rank's stage tensor
parallel -> activation checkpointing -> compile -> FSDP/DDP. Mesh dims, outermost
first: "pp", "dp", "tp" (only those above 1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbench.strategies.ddp import CommTimer, ddp
from workbench.strategies.fsdp import fsdp
from workbench.strategies.layout import Layout, _arch, device_of
from workbench.strategies.mesh import broadcast_module, build_mesh
from workbench.strategies.parallel_config import ParallelConfig
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
    call it with the same model (rank 0's weights are what every rank starts from). A model
    still on the CPU goes to this rank's GPU when the ranks have GPUs; under FSDP only this
    rank's shard of each parameter ever reaches the GPU (the model is sharded on the meta
    device, then rank 0's weights are loaded into the shards one tensor at a time).

    >>> model = wb.shard(TinyGPT(cfg), "fsdp")                            # doctest: +SKIP
    >>> model = wb.shard(MLP(), dp=2, pp=2, schedule="gpipe")            # doctest: +SKIP
    """
    config = plan(model, strategy, **options)
    arch, loss_fn = _arch(model), getattr(model, "loss_fn", None)
    device = rank_device(device_of(model))
    on_meta = config.data_parallel == "fsdp"
    if on_meta:
        weights, extra = _to_meta(model)
    else:
        model.to(device)
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
    if on_meta:
        fsdp(model, mesh, mixed_precision=config.mixed_precision)
        _materialize(model, device, weights, extra)
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


def rank_device(model_device: torch.device) -> torch.device:
    """Where this rank trains: a model on the CPU moves to this rank's GPU when the group reduces CUDA
    tensors (NCCL), instead of training on the CPU over gloo while a GPU waits."""
    nccl = dist.is_initialized() and "nccl" in str(dist.get_backend())
    if model_device.type == "cpu" and nccl and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return model_device


def _to_meta(model: nn.Module) -> tuple[dict, dict]:
    """Move ``model`` to the meta device; returns its weights (rank 0's are loaded later) and the buffers
    a state dict leaves out."""
    weights = model.state_dict()
    extra = {name: buf for name, buf in model.named_buffers() if name not in weights}
    model.to("meta")
    return weights, extra


def _materialize(model: nn.Module, device: torch.device, weights: dict, extra: dict) -> None:
    """Give the sharded meta ``model`` storage on ``device`` and rank 0's ``weights`` (tensor by tensor)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights if dist.get_rank() == 0 else {}, options=options)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            saved = extra.get(name.replace("_checkpoint_wrapped_module.", ""))
            if saved is not None:
                buf.copy_(saved)


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
