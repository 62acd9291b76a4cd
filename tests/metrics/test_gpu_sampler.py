"""The NVML path on a real GPU (skipped without CUDA)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(60)]


def test_real_nvml_readings():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    from workbench.metrics.sampler import NvmlSampler, make_sampler

    s = make_sampler("cuda:0")
    assert isinstance(s, NvmlSampler), "NVML did not load on a machine with a CUDA GPU"
    try:
        info, r = s.info(), s.read()
        assert info["kind"] == "gpu" and info["name"] and info["mem_total"] > 0
        assert 0 <= r["util"] <= 100
        assert 0 < r["mem_used"] <= r["mem_total"] == info["mem_total"]
        assert r["temp_c"] is None or 0 < r["temp_c"] < 120
        assert r["power_w"] is None or 0 < r["power_w"] < 2000
        # the handle is torch's device 0 (by UUID), not simply NVML's index 0
        props = torch.cuda.get_device_properties(0)
        if getattr(props, "uuid", None):
            uuid = str(props.uuid)
            nv_uuid = s.nvml.nvmlDeviceGetUUID(s.handle)
            nv_uuid = nv_uuid.decode() if isinstance(nv_uuid, bytes) else nv_uuid
            assert nv_uuid.removeprefix("GPU-") == uuid.removeprefix("GPU-")
    finally:
        s.close()
