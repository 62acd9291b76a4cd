import pytest

from workbench.config import PoolConfig
from workbench.engine.rendezvous import threads_for
from workbench.pool.machine.devices import SharedGpuWarning, check_gpu_fit
from workbench.pool.rankmap import (
    EngineInfo,
    build_rank_map,
    extend_rank_map,
    format_ranks,
    group_backend,
    parse_ranks,
    remap_engines,
)


def test_ranks_contiguous_per_host_and_devices_pinned():
    engines = [EngineInfo(i, host, 100 + i, gpus=2) for i, host in enumerate(["n1", "n2", "n1", "n2"])]
    ranks = build_rank_map(engines)
    assert [(r.rank, r.host, r.local_rank, r.node_rank, r.device) for r in ranks] == [
        (0, "n1", 0, 0, "cuda:0"), (1, "n1", 1, 0, "cuda:1"),
        (2, "n2", 0, 1, "cuda:0"), (3, "n2", 1, 1, "cuda:1"),
    ]
    assert [r.engine_id for r in ranks] == [0, 2, 1, 3]


def test_cpu_pool():
    ranks = build_rank_map([EngineInfo(1, "h", 2), EngineInfo(0, "h", 1)])
    assert [(r.rank, r.engine_id, r.device) for r in ranks] == [(0, 0, "cpu"), (1, 1, "cpu")]


def test_remap_keeps_rank_on_host_and_device():
    old = build_rank_map([EngineInfo(0, "a", 1, 1), EngineInfo(1, "b", 2, 1)])
    new = remap_engines(old, [EngineInfo(9, "b", 5, 1), EngineInfo(8, "a", 6, 1)])
    assert [(r.rank, r.host, r.device, r.engine_id, r.pid) for r in new] == [
        (0, "a", "cuda:0", 8, 6), (1, "b", "cuda:0", 9, 5)]
    with pytest.raises(ValueError, match="no new engine on host 'b'"):
        remap_engines(old, [EngineInfo(3, "a", 7)])


@pytest.mark.parametrize("spec, ranks", [("0", [0]), ("0,2-3", [0, 2, 3]), ("3,1", [1, 3]),
                                         (" all ", [0, 1, 2, 3])])
def test_parse_ranks(spec, ranks):
    assert parse_ranks(spec, 4) == ranks


@pytest.mark.parametrize("spec, message", [("4", "out of range"), ("a", "bad rank list"),
                                           ("3-1", "bad rank list"),
                                           ("", "bad rank list"), ("-1", "bad rank list")])
def test_parse_ranks_rejects(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_ranks(spec, 4)


def test_format_ranks():
    assert format_ranks([]) == ""
    assert format_ranks([3, 0, 1, 7, 8]) == "0-1,3,7-8"


def test_config_validation():
    with pytest.raises(ValueError, match="launcher"):
        PoolConfig(launcher="k8s")
    with pytest.raises(ValueError, match="timeout"):
        PoolConfig(timeout=0)
    with pytest.raises(ValueError, match="collective_timeout"):
        PoolConfig(collective_timeout=-1)


# -- device placement on a fake topology (issue 15) -------------------------------------------------------


def _bound(n: int, host: str = "n1", first_id: int = 0) -> list[EngineInfo]:
    """Slurm per-task binding: every engine sees exactly one GPU, each a different one."""
    return [EngineInfo(first_id + i, host, 100 + i, gpus=1, gpu_uuids=(f"GPU-{host}-{i}",)) for i in range(n)]


def test_per_task_binding_puts_every_rank_on_its_only_gpu():
    ranks = build_rank_map(_bound(4))
    assert [(r.local_rank, r.device, r.gpu_uuid) for r in ranks] == [
        (0, "cuda:0", "GPU-n1-0"), (1, "cuda:0", "GPU-n1-1"),
        (2, "cuda:0", "GPU-n1-2"), (3, "cuda:0", "GPU-n1-3")]
    assert group_backend("auto", ranks) == "cpu:gloo,cuda:nccl"


def test_engines_that_see_every_gpu_take_the_gpu_of_their_local_rank():
    uuids = ("GPU-a", "GPU-b")
    ranks = build_rank_map([EngineInfo(i, "n1", 100 + i, gpus=2, gpu_uuids=uuids) for i in range(2)])
    assert [(r.device, r.gpu_uuid) for r in ranks] == [("cuda:0", "GPU-a"), ("cuda:1", "GPU-b")]


@pytest.mark.parametrize("engines", [
    [EngineInfo(i, "n1", 100 + i, gpus=2, gpu_uuids=("GPU-a", "GPU-b")) for i in range(3)],  # -n 3 on 2 GPUs
    [EngineInfo(i, "n1", 100 + i, gpus=1, gpu_uuids=("GPU-a",)) for i in range(2)],  # two engines, one GPU
], ids=["n3-on-2-gpus", "two-engines-one-gpu"])
def test_more_ranks_than_gpus_is_refused_or_shared_on_request(engines):
    with pytest.raises(ValueError, match=r"ranks? .* share|more ranks than GPUs"):
        build_rank_map(engines)
    with pytest.warns(SharedGpuWarning, match="share"):
        ranks = build_rank_map(engines, share_gpus=True)
    assert all(r.device.startswith("cuda:") for r in ranks)
    assert group_backend("auto", ranks, shared=True) == "gloo"  # NCCL refuses two ranks on one GPU
    with pytest.raises(ValueError, match="nccl"):
        group_backend("nccl", ranks, shared=True)


def test_every_rank_gets_the_same_backend_string():
    cpu = build_rank_map([EngineInfo(0, "a", 1), EngineInfo(1, "a", 2)])
    assert group_backend("auto", cpu) == "gloo"
    gpu = build_rank_map(_bound(2))
    assert group_backend("nccl", gpu) == "cpu:gloo,cuda:nccl"  # CPU tensors (flags, broadcasts) need gloo
    assert group_backend("gloo", gpu) == "gloo"
    mixed = build_rank_map([*_bound(1, "a"), EngineInfo(5, "b", 3)])
    with pytest.raises(ValueError, match=r"rank 1 \(b, cpu\) has no GPU"):
        group_backend("auto", mixed)
    assert group_backend("gloo", mixed) == "gloo"
    with pytest.raises(ValueError, match="nccl"):
        group_backend("nccl", cpu)


def test_scale_after_restart_keeps_every_rank_on_its_engine_and_device():
    # two ranks, then rank 0 restarted: its new engine (id 5) is now above rank 1's (id 1)
    four = tuple(f"G{k}" for k in range(4))
    ranks = build_rank_map([EngineInfo(i, "n1", 100 + i, gpus=4, gpu_uuids=four) for i in range(2)])
    ranks = remap_engines(ranks[:1], [EngineInfo(5, "n1", 200, gpus=4)]) + ranks[1:]
    before = [(r.rank, r.engine_id, r.device) for r in ranks]
    grown = extend_rank_map(ranks, [EngineInfo(7, "n1", 300, gpus=4, gpu_uuids=four),
                                    EngineInfo(6, "n2", 301, gpus=1, gpu_uuids=("H0",))])
    assert [(r.rank, r.engine_id, r.device) for r in grown[:2]] == before
    assert before == [(0, 5, "cuda:0"), (1, 1, "cuda:1")]
    assert [(r.rank, r.host, r.local_rank, r.node_rank, r.device, r.engine_id) for r in grown[2:]] == [
        (2, "n1", 2, 0, "cuda:2", 7), (3, "n2", 0, 1, "cuda:0", 6)]


def test_a_new_engine_on_a_full_host_is_refused():
    ranks = build_rank_map(_bound(2))
    with pytest.raises(ValueError, match="more ranks than GPUs"):
        extend_rank_map(ranks, [EngineInfo(9, "n1", 300, gpus=1, gpu_uuids=("GPU-n1-0",))])


def test_more_ranks_than_local_gpus_is_refused_before_anything_starts():
    check_gpu_fit(2, 2)
    check_gpu_fit(3, 0)  # no GPU here: a CPU pool
    with pytest.raises(ValueError, match="3 ranks on 2 GPUs"):
        check_gpu_fit(3, 2)
    with pytest.warns(SharedGpuWarning):
        check_gpu_fit(3, 2, share=True)


def test_cpu_threads_from_the_engines_own_affinity():
    # a local pool: two engines on the same 8 CPUs take 4 each; Slurm binding: disjoint sets, all of its own
    assert threads_for(set(range(8)), [set(range(8))]) == 4
    assert threads_for({0, 1}, [{2, 3}, {4, 5}]) == 2
    assert threads_for({3}, [{3}, {3}, {3}]) == 1
