"""A Lightning Fabric loop in the style of Fabric's "Convert PyTorch code to Fabric": ``launch``,
``setup``, ``setup_dataloaders``, ``fabric.backward``, ``all_reduce``, ``fabric.save``.

torchrun --nproc-per-node 2 fabric_loop.py --strategy ddp --epochs 2 --checkpoint fabric.ckpt
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main(args):
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=args.strategy)
    fabric.launch()
    fabric.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True))
    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            mean = fabric.all_reduce(loss.detach(), reduce_op="mean")
            fabric.print(f"epoch {epoch} step {step} loss {mean.item():.6f}")
    fabric.save(args.checkpoint, {"model": model, "optimizer": optimizer, "step": step})
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"global rank {fabric.global_rank} of {fabric.world_size}: checksum {checksum:.6f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint", default="fabric.ckpt")
    main(parser.parse_args())
