"""Sharding strategies as plain functions over (model, mesh, config), and ``shard``.

Composed in one fixed order on a named DeviceMesh ("pp", "dp", "tp"): pipeline split
outermost, then tensor parallel -> activation checkpointing -> compile -> FSDP/DDP. The degrees are a
:class:`~workbench.strategies.parallel_config.ParallelConfig`.

>>> import workbench as wb                                  # doctest: +SKIP
>>> model = wb.shard(MLP(), "fsdp")                         # doctest: +SKIP
>>> model = wb.shard(MLP(), dp=2, pp=2)                     # doctest: +SKIP
"""

from workbench.strategies.compose import plan, shard, unwrap
from workbench.strategies.ddp import ddp
from workbench.strategies.fsdp import fsdp
from workbench.strategies.layout import Layout, layout_of
from workbench.strategies.mesh import build_mesh
from workbench.strategies.parallel_config import ParallelConfig
from workbench.strategies.pipeline import Pipelined, split_stage
from workbench.strategies.tensor_parallel import tensor_parallel

__all__ = ["Layout", "ParallelConfig", "Pipelined", "build_mesh", "ddp", "fsdp", "layout_of", "plan",
           "shard", "split_stage", "tensor_parallel", "unwrap"]
