"""A 2-D device mesh (data parallel x tensor parallel), in the style of PyTorch's 2-D parallel tutorial:
tensor parallel inside the "tp" dimension, FSDP2 over "dp". On 2 CPU ranks the mesh is 2 x 1.

torchrun --nproc-per-node 2 mesh_2d.py --tp 1
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class FeedForward(nn.Module):
    def __init__(self, dim=16, hidden=64):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


def main(tp):
    world_size = int(os.environ["WORLD_SIZE"])
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    mesh = init_device_mesh(device_type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    model = FeedForward()
    parallelize_module(model, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(10 + dp_rank)  # each data-parallel replica its own data
    for step in range(4):
        x = torch.randn(4, 16)
        loss = model(x).square().mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=mesh["dp"].get_group())
        print(f"rank {dist.get_rank()} step {step} dp-mean loss {mean.item() / mesh['dp'].size():.6f}")
    dist.barrier()  # under torchrun a rank that tore its subgroups down first once aborted its peer's exit
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    main(parser.parse_args().tp)
