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

    On the CPU, wall time until the future completes. On a GPU, CUDA events on the stream: NCCL's
    future completes once the all-reduce is enqueued, so wall time would read near zero; the events
    are read (their elapsed time) when :meth:`take` is called, after the step has waited for them.
    The all-reduce overlaps the rest of backward: this is the collectives' own time, not time the
    step waited for them.
    """

    def __init__(self, group=None):
        self.group = group
        self.seconds = 0.0
        self._events: list = []  # (start, end) CUDA events not read yet

    def start(self, device: torch.device):
        """A token for :meth:`stop`, marking a collective's launch."""
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, token) -> None:
        """The collective started at ``token`` is ready (called on the stream that waits for it)."""
        if isinstance(token, float):
            self.seconds += time.perf_counter() - token
        else:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((token, end))

    def take(self) -> float:
        for start, end in self._events:
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1000.0
        self._events.clear()
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def _timed_allreduce(state: CommTimer, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = state.group or dist.group.WORLD
    buffer = bucket.buffer().div_(group.size())
    token = state.start(buffer.device)
    fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()

    def done(f):
        state.stop(token)
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
