"""Every strategy's numbers equal a single-process run (gloo on CPU, world 2 and 4)."""

from __future__ import annotations

import pytest
import torch
from mp_common import LR, STEPS, batches, dp_slice, make, reference
from world_harness import run_world

from workbench.strategies import shard
from workbench.train import Trainer, full_state_dict

pytestmark = pytest.mark.slow


def _train_and_compare(rank, world, kind, options):
    data = batches(kind)
    ref, _ = reference(kind, data)
    model = shard(make(kind), **options)
    trainer = Trainer(model, dp_slice(data, model.wb_layout), optim="sgd", lr=LR, clip=None)
    trainer.run(steps=STEPS)
    assert trainer.step == STEPS
    torch.testing.assert_close(full_state_dict(model), ref, atol=2e-5, rtol=1e-4)
    return trainer.history[-1].loss


CASES = [
    (2, "mlp", {"strategy": "ddp"}),
    (2, "mlp", {"strategy": "fsdp"}),
    (2, "mlp", {"strategy": "fsdp", "activation_checkpoint": True}),
    (2, "gpt", {"strategy": "fsdp"}),
    (2, "gpt", {"strategy": "tp"}),
    (2, "mlp", {"strategy": "tp"}),
    (2, "mlp", {"strategy": "pp", "schedule": "gpipe"}),
    (2, "mlp", {"strategy": "pp", "schedule": "1f1b"}),
    (4, "mlp", {"dp": 2, "pp": 2, "microbatches": 2}),
    (4, "gpt", {"dp": 2, "tp": 2}),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("world", "kind", "options"), CASES,
                         ids=[f"{k}-{'-'.join(f'{a}{b}' for a, b in o.items())}-w{w}" for w, k, o in CASES])
def test_strategy_matches_single_process(world, kind, options):
    losses = run_world(_train_and_compare, world, kind, options)
    assert len(set(losses)) == 1, f"ranks report different losses: {losses}"


def _pipeline_grads(rank, world, schedule):
    x, y = batches("mlp", steps=1)[0]
    full = make("mlp")
    loss_ref = full.loss_fn(full(x), y)
    loss_ref.backward()
    grads_ref = {n: p.grad for n, p in full.named_parameters()}
    model = shard(make("mlp"), "pp", schedule=schedule, microbatches=4)
    loss = model.step(x, y)
    if model.wb_layout.is_last_stage:
        torch.testing.assert_close(loss, loss_ref.detach())
    mine = {n: p.grad for n, p in model.module.named_parameters()}
    assert mine and set(mine) < set(grads_ref)
    torch.testing.assert_close(mine, {n: grads_ref[n] for n in mine}, atol=1e-6, rtol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_loss_and_grads_equal_unpipelined(schedule):
    run_world(_pipeline_grads, 2, schedule)


def _ddp_replicas(rank, world):
    import torch.distributed as dist

    data = batches("mlp", steps=4)
    model = shard(make("mlp"), "ddp")
    Trainer(model, dp_slice(data, model.wb_layout), lr=1e-2).run(steps=4)
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    for other in everyone[1:]:
        assert torch.equal(other, everyone[0])


@pytest.mark.timeout(60)
def test_ddp_replicas_identical_after_training():
    run_world(_ddp_replicas, 2)


def _fsdp_memory(rank, world):
    model = make("gpt")
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    shard(model, "fsdp")
    local_bytes = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
    return full_bytes, local_bytes


@pytest.mark.timeout(60)
def test_fsdp_parameter_memory_is_a_fraction_of_the_model():
    world = 2
    (full, *_), locals_ = zip(*run_world(_fsdp_memory, world), strict=True)
    for local in locals_:
        assert abs(local / full - 1 / world) < 0.05, f"rank holds {local} of {full} bytes"


def _fsdp_bf16(rank, world):
    data = batches("gpt", steps=3)
    model = shard(make("gpt"), "fsdp", mixed_precision="bf16")
    result = Trainer(model, dp_slice(data, model.wb_layout), lr=1e-2).run(steps=3)
    assert all(torch.isfinite(torch.tensor(s.loss)) for s in result.history)
    return [s.loss for s in result.history]


@pytest.mark.timeout(60)
def test_fsdp_bf16_mixed_precision_trains():
    losses = run_world(_fsdp_bf16, 2)
    assert losses[0] == losses[1] and len(losses[0]) == 3


def _shard_twice(rank, world):
    from torch.distributed import distributed_c10d as c10d

    first = shard(make("gpt"), dp=2, tp=2)
    groups = len(c10d._world.pg_map)
    second = shard(make("gpt"), dp=2, tp=2)
    return groups, len(c10d._world.pg_map), first.wb_layout.mesh is second.wb_layout.mesh


@pytest.mark.timeout(60)
def test_running_shard_again_reuses_the_mesh_and_its_communicators():
    for groups, after, same in run_world(_shard_twice, 4):
        assert after == groups and same, f"{after - groups} new process groups on the second shard()"
