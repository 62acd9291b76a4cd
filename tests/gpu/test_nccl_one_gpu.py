"""The NCCL paths on one GPU: a world of 1 joined in this process the way an engine joins (issue 15).

Skipped without CUDA. Every strategy's numbers equal a single process on the same GPU; bf16 where the GPU
does it natively; a CPU model reaches the GPU, under FSDP only as shards; communication time from CUDA
events; per-step peak memory; the abort, from a background thread, ends every group and the process
joins again.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from bench.gpu_cells import CASES, STEPS, TOLERANCE, batches, make_model, reference, train_sharded  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


@pytest.fixture()
def gpu_rank():
    """Rank 0 of a world of 1 on cuda:0, joined through the engine's own rendezvous."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import torch.distributed as dist

    from workbench.engine import rendezvous

    port = rendezvous.open_store("127.0.0.1", 30)
    joined = rendezvous.join(rank=0, local_rank=0, world_size=1, address="127.0.0.1", port=port,
                             backend="cpu:gloo,cuda:nccl", device="cuda:0", timeout_s=30, ifname="lo")
    assert joined["backend"] == "cpu:gloo,cuda:nccl" and joined["gpu_uuid"]
    yield torch.device("cuda", 0)
    if dist.is_initialized():
        dist.destroy_process_group()
    rendezvous.close()


@pytest.mark.parametrize(("kind", "strategy"), CASES)
def test_every_strategy_on_nccl_equals_a_single_process(gpu_rank, kind, strategy):
    from workbench.strategies import shard, unwrap

    sharded = shard(make_model(kind), strategy)  # built on the CPU: shard puts it on this rank's GPU
    assert next(unwrap(sharded).parameters()).device.type == "cuda"
    torch.testing.assert_close(train_sharded(kind, strategy, gpu_rank), reference(kind, gpu_rank),
                               **TOLERANCE["fp32"])


def test_bf16_only_where_the_gpu_does_it_natively(gpu_rank):
    from workbench.strategies import shard
    from workbench.train import Trainer

    model = shard(make_model("mlp"), "fsdp")
    seen = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    result = Trainer(model, batches("mlp", gpu_rank), lr=1e-2, precision="auto").run(steps=STEPS)
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert set(seen) == {torch.bfloat16 if native else torch.float32}
    assert all(torch.isfinite(torch.tensor(s.loss)) for s in result.history)


def test_fsdp_never_puts_the_whole_cpu_model_on_the_gpu_twice(gpu_rank):
    from workbench.strategies import shard
    from workbench.train import MLP, MLPConfig

    model = MLP(MLPConfig(d_in=256, d_hidden=1024, d_out=16, n_layers=8, expansion=4))
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    shard(model, "fsdp")
    peak = torch.cuda.max_memory_allocated() - before
    # a world of 1 holds the whole model as its shard; moving it first and then sharding holds it twice
    assert peak < 1.5 * size, f"peak {peak / size:.2f} x the model while sharding"


def test_steps_report_communication_and_peak_memory(gpu_rank):
    from workbench.strategies import shard
    from workbench.train import Trainer

    model = shard(make_model("mlp"), "ddp")
    trainer = Trainer(model, batches("mlp", gpu_rank), lr=1e-2)
    assert trainer._flag_device.type == "cuda"
    history = trainer.run(steps=STEPS).history
    assert all(s.comm_time > 0 for s in history)  # CUDA events: the all-reduces' own time, not enqueue time
    assert all(s.mem_peak and s.mem_reserved_peak >= s.mem_peak for s in history)


def test_shard_again_reuses_the_mesh(gpu_rank):
    from workbench.strategies import shard

    assert shard(make_model("gpt"), "fsdp").wb_layout.mesh is shard(make_model("gpt"), "fsdp").wb_layout.mesh


def test_abort_from_a_background_thread_ends_every_group_and_the_rank_joins_again(gpu_rank):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from workbench.engine import guard, rendezvous
    from workbench.strategies import shard

    kept = torch.arange(4.0, device=gpu_rank)
    model = shard(make_model("gpt"), "fsdp")  # a mesh, and a subgroup made after the join
    sub = dist.new_group([0])
    dist.all_reduce(torch.ones(1, device=gpu_rank), group=sub)
    assert len(c10d._world.pg_map) >= 2
    aborter = threading.Thread(target=guard.abort, args=([],))  # what the engine's agent thread does
    aborter.start()
    aborter.join(30)
    assert not aborter.is_alive() and not dist.is_initialized() and not c10d._world.pg_map
    assert kept.sum().item() == 6.0 and model is not None  # the process and its state go on
    port = rendezvous.open_store("127.0.0.1", 30)
    rendezvous.join(rank=0, local_rank=0, world_size=1, address="127.0.0.1", port=port,
                    backend="cpu:gloo,cuda:nccl", device="cuda:0", timeout_s=30, ifname="lo")
    t = torch.ones(2, device=gpu_rank)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]


def test_the_sampler_reads_the_gpu_recorded_at_join(gpu_rank):
    from workbench.engine import rendezvous
    from workbench.metrics.sampler import NvmlSampler, make_sampler
    from workbench.pool.machine.devices import bare_uuid

    uuid = rendezvous.identity()["gpu_uuid"]
    s = make_sampler("cuda:0", uuid=uuid)
    assert isinstance(s, NvmlSampler)
    try:
        assert bare_uuid(s.nvml.nvmlDeviceGetUUID(s.handle)) == bare_uuid(uuid)
        assert s.info()["mem_total"] > 0
    finally:
        s.close()
