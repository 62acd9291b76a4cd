import pytest

from workbench.config import PoolConfig
from workbench.pool.rankmap import EngineInfo, build_rank_map, format_ranks, parse_ranks, remap_engines


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


@pytest.mark.parametrize("spec, ranks", [("0", [0]), ("0,2-3", [0, 2, 3]), ("3,1", [1, 3]), (" all ", [0, 1, 2, 3])])
def test_parse_ranks(spec, ranks):
    assert parse_ranks(spec, 4) == ranks


@pytest.mark.parametrize("spec, message", [("4", "out of range"), ("a", "bad rank list"), ("3-1", "bad rank list"),
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
