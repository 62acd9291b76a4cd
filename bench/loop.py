"""The code measured on the ranks: the same functions under ``%%distributed``, ``torchrun`` and raw gloo.

Imported on the engines (the cell puts this folder on ``sys.path``) and by ``torchrun_main.py``.
Each function times itself on the rank, so both sides are measured the same way.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

# batch per rank, and the models: small enough for 2 CPU cores, big enough that a step is compute.
BATCH = {"mlp": 64, "gpt": 16}


def build(model: str = "mlp", seed: int = 0, device=None, data_world: int | None = None, **options):
    """A DDP-sharded model on ``device`` (default: CPU), its loader over this rank's shard and a
    Trainer (plain fp32, AdamW); ``options`` go to the Trainer (``elastic=True``, ``callbacks=``).
    The MLP's data holds 64 global batches of ``data_world`` ranks (default: the world size; an
    elastic run fixes it: a new engine replays this in a group of one)."""
    import workbench as wb

    torch.manual_seed(seed)
    world = dist.get_world_size()
    if model == "mlp":
        net = wb.MLP(wb.MLPConfig(d_in=64, d_hidden=256, d_out=16, n_layers=4))
        x, y = wb.regression_data(BATCH["mlp"] * (data_world or world) * 64, d_in=64, d_out=16)
        data = torch.utils.data.TensorDataset(x, y)
    elif model == "gpt":
        vocab = wb.char_vocab()
        net = wb.TinyGPT(wb.GPTConfig(vocab=vocab, block_size=64, n_layers=2, n_head=4, d_model=128))
        data = wb.char_dataset(block_size=64, vocab=vocab)
    else:
        raise ValueError(f"unknown model {model!r}: mlp or gpt.")
    if device is not None:
        net = net.to(device)
    net = wb.shard(net, "ddp")
    loader = wb.make_loader(data, batch_size=BATCH[model], model=net)
    return wb.Trainer(net, loader, lr=1e-3, precision="fp32", **options)


def measure(trainer, steps: int, warmup: int = 5) -> dict:
    """``steps`` timed steps after ``warmup``: samples/s over the whole world, timed on this rank."""
    if warmup:  # a run of 0 steps would still be a run (a dashboard would show it)
        trainer.run(steps=warmup)
    dist.barrier()
    t0 = time.perf_counter()
    result = trainer.run(steps=steps)
    seconds = time.perf_counter() - t0
    samples = sum(s.samples for s in result.history)
    return {
        "samples_per_s": samples / seconds,
        "steps": len(result.history),
        "seconds": seconds,
        "loss": result.history[-1].loss if result.history else None,
    }


def set_metrics(trainer, on: bool) -> bool:
    """Attach (or detach) this engine's metrics publisher to ``trainer``; whether one is attached."""
    from workbench.metrics import publisher

    trainer.callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, publisher.Publisher)]
    if on and publisher._publisher is not None:
        trainer.callbacks.insert(0, publisher._publisher)
    return any(isinstance(cb, publisher.Publisher) for cb in trainer.callbacks)


def allreduce_sweep(sizes: list[int], budget_s: float = 0.4, max_iters: int = 200) -> dict:
    """Seconds per ``all_reduce`` of a float32 tensor of each size in bytes (median of timed iterations).

    Every rank runs the same number of iterations (rank 0's choice, broadcast), so none waits alone.
    """
    out = {}
    for size in sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32)
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        one = max(time.perf_counter() - t0, 1e-6)
        n = torch.tensor([max(5, min(max_iters, int(budget_s / one)))])
        dist.broadcast(n, 0)
        times = []
        for _ in range(int(n.item())):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        times.sort()
        out[size] = times[len(times) // 2]
    return out
