"""The data of accelerate_loop.py, a helper module beside it (a test edits a copy between two runs)."""

import torch
from torch.utils.data import TensorDataset

SAMPLES = 32


def make_dataset(seed: int = 0) -> TensorDataset:
    """A synthetic regression set: y = x . w + noise, from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(SAMPLES, generator=g)
    return TensorDataset(x, y.unsqueeze(1))
