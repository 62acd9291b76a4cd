"""Gradient clipping in one reduction, and one precision for every strategy (gloo on CPU, world 2)."""

from __future__ import annotations

import pytest
import torch
from mp_common import batches, dp_slice, make
from world_harness import run_world

from workbench.strategies import shard
from workbench.train import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

MAX_NORM = 0.05  # well below the norm after one step: clipping scales every gradient


def _reference_grads(kind: str) -> dict:
    x, y = batches(kind, steps=1)[0]
    model = make(kind)
    model.loss_fn(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    return {n: p.grad for n, p in model.named_parameters()}


def _clipped(rank, world, kind, strategy):
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    model = shard(make(kind), strategy)
    (x, y), = dp_slice(batches(kind, steps=1), model.wb_layout)
    model.wb_layout.loss_fn(model(x), y).backward()
    trainer = Trainer(model, [], optim="sgd", lr=0.1)
    with CommDebugMode() as comm:
        finite, _ = trainer._clip(MAX_NORM)
    grads = {n.removeprefix("module."): p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
             for n, p in model.named_parameters()}
    torch.testing.assert_close(grads, _reference_grads(kind), atol=1e-6, rtol=1e-5)
    return finite, comm.get_total_counts(), sum(isinstance(p.grad, DTensor) for p in model.parameters())


@pytest.mark.parametrize(("kind", "strategy"), [("mlp", "fsdp"), ("gpt", "tp"), ("mlp", "ddp")])
def test_clipping_equals_a_single_process_and_takes_one_reduction(kind, strategy):
    finite, collectives, sharded = run_world(_clipped, 2, kind, strategy)[0]
    assert finite
    assert collectives <= 1, f"{collectives} collectives to clip {sharded} sharded gradients"


def _activation_dtype(rank, world, strategy, precision):
    model = shard(make("mlp"), strategy, **({"schedule": "gpipe"} if strategy == "pp" else {}))
    seen = []
    linear = next(m for m in model.wb_layout.base.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    data = dp_slice(batches("mlp", steps=1), model.wb_layout)
    Trainer(model, data, optim="sgd", lr=0.1, precision=precision).run(steps=1)
    return sorted({str(d) for d in seen})


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "pp"])
def test_every_strategy_trains_in_the_precision_asked_for(strategy):
    assert run_world(_activation_dtype, 2, strategy, "bf16") == [["torch.bfloat16"]] * 2
    assert run_world(_activation_dtype, 2, strategy, "fp32") == [["torch.float32"]] * 2
