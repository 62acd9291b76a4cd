"""A Lightning ``Trainer`` + ``LightningModule``, in the style of Lightning's "Lightning in 15 minutes":
``Trainer(accelerator="cpu", devices=2, strategy=...)``, a synthetic regression set, ``seed_everything``.

torchrun --nproc-per-node 2 lightning_ddp.py --strategy ddp --max-epochs 2
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        mean = self.all_gather(loss.detach()).mean()
        if self.trainer.is_global_zero:
            print(f"epoch {self.current_epoch} step {self.global_step} loss {mean.item():.6f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(args):
    L.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1)
    model = Regressor()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=args.strategy, max_epochs=args.max_epochs,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True))
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"global rank {trainer.global_rank} of {trainer.world_size}: checksum {checksum:.6f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--max-epochs", type=int, default=2)
    main(parser.parse_args())
