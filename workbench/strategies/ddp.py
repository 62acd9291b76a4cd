"""Data parallel with torch DDP: every rank a full replica, gradients averaged.

>>> model = ddp(model, mesh)            # doctest: +SKIP
"""


import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class CommTimer:
    """Seconds spent in gradient all-reduces, from launch until the result is ready.

    On gloo the all-reduce overlaps the rest of backward, so this is wall time of the
    collectives themselves, not time the step waited for them.
    """

    def __init__(self, group=None):
        self.group = group
        self.seconds = 0.0

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def _timed_allreduce(state: CommTimer, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    t0 = time.perf_counter()
    group = state.group or dist.group.WORLD
    buffer = bucket.buffer().div_(group.size())
    fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()

    def done(f):
        state.seconds += time.perf_counter() - t0
        return f.value()[0]

    return fut.then(done)


def ddp(model: nn.Module, mesh=None, *, device: torch.device | None = None) -> DDP:
    """Wrap ``model`` in DDP over the mesh's "dp" dim (or the whole world); gradients averaged."""
    group = mesh["dp"].get_group() if mesh is not None and "dp" in (mesh.mesh_dim_names or ()) else None
    ids = [device.index] if device is not None and device.type == "cuda" else None
    wrapped = DDP(model, device_ids=ids, process_group=group)
    timer = CommTimer(group)
    wrapped.register_comm_hook(timer, _timed_allreduce)
    wrapped.wb_comm = timer
    return wrapped
