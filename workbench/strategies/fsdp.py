"""Fully sharded data parallel with FSDP2: ``fully_shard`` per block, then the root.

Each rank keeps 1/dp of every parameter; a block's full weights exist only while it runs.

>>> model = fsdp(model, mesh, mixed_precision="bf16")     # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def fsdp(model: nn.Module, mesh, *, mixed_precision: str | None = None,
         reshard_after_forward: bool = True) -> nn.Module:
    """Shard ``model`` in place over the mesh's "dp" dim; returns the same module."""
    dp_mesh = mesh["dp"] if "dp" in (mesh.mesh_dim_names or ()) else mesh
    policy = MixedPrecisionPolicy()
    if mixed_precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model
