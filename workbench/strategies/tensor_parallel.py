"""Tensor parallel with DTensor: each block's linears split column- then row-wise.

A model says how with ``tp_plan`` (names inside a block -> "colwise"/"rowwise"); the
embeddings, norms and head stay replicated, so every tensor-parallel rank sees the
same whole batch.

>>> model = tensor_parallel(model, mesh)    # doctest: +SKIP
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def tensor_parallel(model: nn.Module, mesh, plan: dict[str, str] | None = None) -> nn.Module:
    """Parallelize every block of ``model`` in place over the mesh's "tp" dim."""
    tp_mesh = mesh["tp"] if "tp" in (mesh.mesh_dim_names or ()) else mesh
    plan = plan if plan is not None else getattr(model, "tp_plan", None)
    if not plan:
        raise ValueError(f"{type(model).__name__} has no tp_plan: pass plan={{'fc1': 'colwise', ...}}.")
    bad = sorted(set(plan.values()) - set(STYLES))
    if bad:
        raise ValueError(f"unknown tensor-parallel style {bad[0]!r}: choose one of {', '.join(STYLES)}.")
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, {name: STYLES[style]() for name, style in plan.items()})
    return model
