"""FSDP2 (fully_shard) with a distributed checkpoint, in the style of PyTorch's FSDP2 tutorial.

torchrun --nproc-per-node 2 fsdp2_dcp.py --steps 4 --checkpoint-dir ckpt
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class MLP(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim), nn.Linear(dim, dim)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def main(args):
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device_type, (world_size,))
    torch.manual_seed(0)
    model = MLP()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + rank)
    for step in range(args.steps):
        x = torch.randn(8, 16)
        loss = model(x).square().mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step} mean loss {total.item() / world_size:.6f}")
    model_state, optim_state = get_state_dict(model, optim)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=args.checkpoint_dir)
    full = sum(p.full_tensor().double().sum().item() for p in model.parameters())
    print(f"rank {rank} saved {args.checkpoint_dir}: parameter sum {full:.6f}, "
          f"local shard elements {sum(p.to_local().numel() for p in model.parameters())}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--checkpoint-dir", default=os.path.join(os.getcwd(), "checkpoint"))
    main(parser.parse_args())
