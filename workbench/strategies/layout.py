"""Where a sharded model lives: its mesh, degrees and this rank's place in them.

``shard`` attaches a :class:`Layout` to the model it returns (``model.wb_layout``); the
Trainer, the loader helper and export read it. An unsharded model gets a plain layout:
every rank of the world is its own data shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class Layout:
    config: Any = None  # ParallelConfig
    mesh: Any = None  # DeviceMesh with dims named "pp", "dp", "tp" (those above 1)
    base: Any = None  # the module holding parameters (stage module for a pipeline)
    arch: dict = field(default_factory=dict)  # export_config() of the original model
    loss_fn: Any = None
    schedule: Any = None  # pipeline schedule, when pp > 1
    comm: Any = None  # object with a ``seconds`` counter fed by comm hooks

    def _dim(self, name: str):
        if self.mesh is None or self.mesh.mesh_dim_names is None or name not in self.mesh.mesh_dim_names:
            return None
        return self.mesh[name]

    def size(self, name: str) -> int:
        sub = self._dim(name)
        if sub is not None:
            return sub.size()
        if name == "dp" and self.mesh is None and dist.is_initialized():
            return dist.get_world_size()
        return 1

    def local_rank(self, name: str) -> int:
        sub = self._dim(name)
        if sub is not None:
            return sub.get_local_rank()
        if name == "dp" and self.mesh is None and dist.is_initialized():
            return dist.get_rank()
        return 0

    def group(self, name: str):
        sub = self._dim(name)
        return sub.get_group() if sub is not None else None

    @property
    def dp_size(self) -> int:
        return self.size("dp")

    @property
    def dp_rank(self) -> int:
        return self.local_rank("dp")

    @property
    def pp(self) -> int:
        return self.size("pp")

    @property
    def stage(self) -> int:
        return self.local_rank("pp")

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.pp - 1


def layout_of(model) -> Layout:
    """The model's layout, or a plain one for an unsharded model (or ``None``)."""
    layout = getattr(model, "wb_layout", None)
    if layout is not None:
        return layout
    base = model
    return Layout(base=base, arch=_arch(base), loss_fn=getattr(base, "loss_fn", None))


def _arch(module) -> dict:
    fn = getattr(module, "export_config", None)
    return fn() if callable(fn) else {}


def device_of(module) -> torch.device:
    for p in module.parameters():
        return p.device
    return torch.device("cpu")
