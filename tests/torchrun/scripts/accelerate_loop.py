"""An Accelerate training loop in the style of Accelerate's own examples (``nlp_example.py``): ``prepare``,
``accelerator.backward``, ``gather`` for the logged loss, ``save_state``; the data comes from a helper module
beside the script (``datautils.py``).

torchrun --nproc-per-node 2 accelerate_loop.py --cpu --mixed_precision bf16 --epochs 2 --output-dir state
"""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datautils import make_dataset
from torch import nn
from torch.utils.data import DataLoader


def main(args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(make_dataset(), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            mean = accelerator.gather(loss.detach()).mean().item()
            accelerator.print(f"epoch {epoch} step {steps} loss {mean:.6f}")
    accelerator.print(f"Steps: {steps}")
    accelerator.save_state(args.output_dir)
    checksum = sum(p.detach().double().sum().item() for p in accelerator.unwrap_model(model).parameters())
    print(f"process {accelerator.process_index} of {accelerator.num_processes}: checksum {checksum:.6f}")
    accelerator.end_training()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="Accelerator(cpu=True)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--output-dir", default="accelerate-state")
    main(parser.parse_args())
