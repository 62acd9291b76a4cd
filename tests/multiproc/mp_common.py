"""Models, data and single-process references shared by the multiprocess tests."""

from __future__ import annotations

import torch

from workbench.train import MLP, GPTConfig, MLPConfig, TinyGPT, char_dataset, char_vocab, regression_data

B, STEPS, LR = 8, 3, 0.1


def make(kind: str):
    torch.manual_seed(0)
    if kind == "mlp":
        return MLP(MLPConfig(d_in=8, d_hidden=16, d_out=4, n_layers=4, expansion=2))
    return TinyGPT(GPTConfig(vocab=char_vocab(), block_size=8, n_layers=2, n_head=2, d_model=16))


def batches(kind: str, steps: int = STEPS, batch: int = B) -> list:
    if kind == "mlp":
        return [regression_data(batch, d_in=8, d_out=4, seed=s) for s in range(steps)]
    ds = char_dataset(block_size=8)
    return [(ds.tensors[0][s * batch:(s + 1) * batch], ds.tensors[1][s * batch:(s + 1) * batch])
            for s in range(steps)]


def reference(kind: str, data: list, lr: float = LR) -> tuple[dict, list[float]]:
    """Plain single-process SGD on the full batches: (state dict, losses)."""
    model = make(kind)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in data:
        loss = model.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {k: v.detach() for k, v in model.state_dict().items()}, losses


def dp_slice(data: list, layout) -> list:
    """This rank's part of each full batch along the data-parallel dim."""
    n, i = layout.dp_size, layout.dp_rank
    return [(x.tensor_split(n)[i], y.tensor_split(n)[i]) for x, y in data]
