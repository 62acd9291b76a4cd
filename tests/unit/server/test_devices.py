"""Which GPUs and MIG instances a process sees, and which one a rank samples: a fake NVML topology."""

import pytest

from tests.unit.fake_nvml import FakeNVML
from workbench.metrics.sampler import make_sampler
from workbench.pool.machine.devices import bare_uuid, find_device, visible_devices, visible_gpu_count

pytestmark = pytest.mark.timeout(10)

TOPOLOGY = {"GPU-a": [], "GPU-b": ["MIG-b1", "MIG-b2"], "GPU-c": []}


@pytest.mark.parametrize(("mask", "seen"), [
    (None, ["GPU-a", "MIG-b1", "MIG-b2", "GPU-c"]),  # a GPU in MIG mode shows as its instances
    ("2,0", ["GPU-c", "GPU-a"]),
    ("MIG-b2", ["MIG-b2"]),
    ("GPU-b", ["MIG-b1", "MIG-b2"]),
    ("0,7,2", ["GPU-a"]),  # like CUDA: a bad entry ends the list
    ("", []), ("-1", []),
])
def test_visible_devices_count_mig_instances_and_follow_the_mask(mask, seen):
    assert visible_devices(FakeNVML(TOPOLOGY), mask) == seen


def test_visible_gpu_count_counts_mig_instances(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-b1,MIG-b2")
    nv = FakeNVML(TOPOLOGY)
    assert visible_gpu_count(nv) == 2
    assert nv.calls == ["init", "shutdown"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpu_count(FakeNVML(TOPOLOGY)) == 4


def test_a_device_is_found_by_uuid_with_or_without_prefix():
    nv = FakeNVML(TOPOLOGY)
    assert find_device(nv, "b2") == "MIG-b2"  # torch's UUID of a MIG instance has no prefix
    assert find_device(nv, "GPU-c") == "GPU-c"
    with pytest.raises(LookupError):
        find_device(nv, "zz")
    assert bare_uuid(b"GPU-a") == "a"


def test_a_mig_rank_samples_its_own_instance_and_says_what_it_cannot_read():
    nv = FakeNVML(TOPOLOGY)
    s = make_sampler("cuda:0", nvml=nv, uuid="b2")
    assert s.handle == "MIG-b2"  # not "GPU-" + the UUID, nor NVML's index 0 (GPU a)
    info = s.info()
    assert info["name"].endswith("MIG 3g.71gb") and info["mem_total"] == 70 * 2**30
    assert info["unsupported"] == ["util", "power_w", "temp_c", "clock_mhz"]
    r = s.read()
    assert r["util"] is None and r["mem_used"] == 30 * 2**30


def test_the_sidebar_finds_a_ranks_gpu_by_the_uuid_recorded_at_join(monkeypatch):
    import os
    import socket

    from workbench.server.usage import UsageSampler

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")  # the server's own mask says nothing about the engine's
    usage = UsageSampler()
    usage._nvml = FakeNVML(TOPOLOGY)
    got = usage.sample(os.getpid(), socket.gethostname(), "cuda:0", gpu_uuid="b2")
    assert got["gpu_memory_total_bytes"] == 70 * 2**30  # MIG instance b2, not GPU c (index 2), not GPU a
    assert got["gpu_util"] is None  # not supported on a MIG instance: unknown, not 0
    whole = usage.sample(os.getpid(), socket.gethostname(), "cuda:0", gpu_uuid="GPU-a")
    assert (whole["gpu_util"], whole["gpu_memory_total_bytes"]) == (87.0, 140 * 2**30)
