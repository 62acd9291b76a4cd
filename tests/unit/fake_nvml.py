"""A fake ``pynvml`` over a described topology: whole GPUs and GPUs in MIG mode (pure data, no driver)."""

from __future__ import annotations

from types import SimpleNamespace


class FakeNVML:
    """``FakeNVML({"GPU-a": [], "GPU-b": ["MIG-b1", "MIG-b2"]})``: GPU a whole, GPU b in two MIG instances.

    A MIG instance reports memory but not utilisation, power or clocks (as real MIG instances do).
    """

    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self, topology: dict[str, list[str]]):
        self.gpus = list(topology)
        self.mig = topology
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise self.NVMLError("Invalid Argument")
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for gpu in self.gpus:
            for h in [gpu, *self.mig[gpu]]:
                if h == uuid:
                    return h
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, h):
        return h.encode()  # older pynvml returns bytes

    def nvmlDeviceGetMigMode(self, h):
        if h not in self.mig:
            raise self.NVMLError("Not Supported")
        return (1, 1) if self.mig[h] else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        if i >= len(self.mig[h]):
            raise self.NVMLError("Not Found")
        return self.mig[h][i]

    def _whole(self, h):
        if h.startswith("MIG-"):
            raise self.NVMLError("Not Supported")

    def nvmlDeviceGetName(self, h):
        return b"Fake H200" + (b" MIG 3g.71gb" if h.startswith("MIG-") else b"")

    def nvmlDeviceGetUtilizationRates(self, h):
        self._whole(h)
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        total = 70 * 2**30 if h.startswith("MIG-") else 140 * 2**30
        return SimpleNamespace(used=30 * 2**30, total=total, free=total - 30 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        self._whole(h)
        return 412_000  # milliwatts

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._whole(h)
        return 61

    def nvmlDeviceGetClockInfo(self, h, clock):
        raise self.NVMLError("Not Supported")
