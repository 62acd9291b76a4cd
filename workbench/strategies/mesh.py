"""The named device mesh and the one broadcast that makes every rank start equal."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

# Meshes made in this process group, by (device type, degrees): every mesh owns communicators (NCCL's cost
# GPU memory), so running shard() again reuses them. A new group (re-formed) starts afresh.
_meshes: dict = {}


def build_mesh(degrees: dict[str, int], device_type: str = "cpu") -> DeviceMesh:
    """A mesh with one named dim per degree, outermost first (``{"pp": 2, "dp": 2}``); the same mesh
    again for the same degrees while the process group lasts."""
    if _meshes.get("world") is not dist.group.WORLD:
        _meshes.clear()
        _meshes["world"] = dist.group.WORLD
    key = (device_type, tuple(degrees.items()))
    if key not in _meshes:
        _meshes[key] = init_device_mesh(device_type, tuple(degrees.values()), mesh_dim_names=tuple(degrees))
    return _meshes[key]


@torch.no_grad()
def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (before any sharding)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    for t in [*module.parameters(), *module.buffers()]:
        dist.broadcast(t.data, src=src)
