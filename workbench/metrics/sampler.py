"""Engine side: read one device's utilisation, memory, power, temperature and clock.

A GPU rank reads NVML (nvidia-ml-py); a CPU rank, or a machine without NVML, reads psutil
(this engine's CPU share and resident memory). Imports no UI code and no torch at import time.

>>> s = PsutilSampler(threads=1)
>>> sorted(s.read())
['clock_mhz', 'mem_total', 'mem_used', 'power_w', 'temp_c', 'util']
>>> s.info()["kind"]
'cpu'
"""

from __future__ import annotations

import os


class PsutilSampler:
    """This engine process on the CPU: CPU share (percent of its threads' cores) and resident memory."""

    def __init__(self, threads: int = 1, pid: int | None = None):
        import psutil

        self._psutil = psutil
        self.proc = psutil.Process(pid or os.getpid())
        self.threads = max(1, threads)
        self.proc.cpu_percent(None)  # the first call only sets the baseline

    def info(self) -> dict:
        """What the device is: kind ``cpu``, a name, total memory."""
        return {"kind": "cpu", "name": f"CPU ({self.threads} thread{'s' * (self.threads > 1)})",
                "mem_total": self._psutil.virtual_memory().total}

    def read(self) -> dict:
        """One sample: util (0-100, share of this engine's cores), mem_used (RSS bytes), mem_total."""
        util = min(100.0, self.proc.cpu_percent(None) / self.threads)
        return {"util": util, "mem_used": self.proc.memory_info().rss,
                "mem_total": self._psutil.virtual_memory().total,
                "power_w": None, "temp_c": None, "clock_mhz": None}

    def close(self) -> None:
        pass


class NvmlSampler:
    """One GPU, or one MIG instance, through NVML. ``nvml``: the ``pynvml`` module (a fake in unit tests).

    The device is found by its UUID (torch's, as recorded when the rank joined), else as the ``index``-th
    device CUDA shows here. Readings the device cannot give (a MIG instance has no utilisation, power or
    clock of its own) are listed in ``info()["unsupported"]`` and read as None.
    """

    def __init__(self, nvml, *, index: int = 0, uuid: str | None = None):
        from workbench.pool.machine.devices import find_device, visible_devices

        self.nvml = nvml
        nvml.nvmlInit()
        handle = None
        if uuid:
            try:
                handle = find_device(nvml, uuid)
            except LookupError:
                handle = None
        if handle is None:
            handle = visible_devices(nvml, os.environ.get("CUDA_VISIBLE_DEVICES"))[index]
        self.handle = handle
        self.unsupported = [k for k, v in self.read().items() if v is None]

    def _get(self, fn, *args):
        try:
            return fn(self.handle, *args)
        except self.nvml.NVMLError:
            return None

    def info(self) -> dict:
        """What the device is: kind ``gpu``, its name, total memory, the readings it cannot give."""
        name = self._get(self.nvml.nvmlDeviceGetName)
        if isinstance(name, bytes):
            name = name.decode()
        mem = self._get(self.nvml.nvmlDeviceGetMemoryInfo)
        return {"kind": "gpu", "name": name or "GPU", "mem_total": getattr(mem, "total", None),
                "unsupported": list(self.unsupported)}

    def read(self) -> dict:
        """One sample: util (%), mem_used/mem_total (bytes), power_w, temp_c, clock_mhz (SM)."""
        nv = self.nvml
        rates = self._get(nv.nvmlDeviceGetUtilizationRates)
        mem = self._get(nv.nvmlDeviceGetMemoryInfo)
        power = self._get(nv.nvmlDeviceGetPowerUsage)
        return {
            "util": getattr(rates, "gpu", None),
            "mem_used": getattr(mem, "used", None),
            "mem_total": getattr(mem, "total", None),
            "power_w": power / 1000.0 if power is not None else None,  # NVML reports milliwatts
            "temp_c": self._get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
            "clock_mhz": self._get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
        }

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def make_sampler(device: str = "cpu", threads: int = 1, nvml=None, uuid: str | None = None):
    """The sampler for ``device`` (``"cuda:N"`` or ``"cpu"``): NVML for a GPU, psutil otherwise.

    ``uuid``: the GPU's UUID (recorded at join); without it, torch's UUID of ``device``. Falls back to
    psutil when NVML is missing or fails (no driver, no GPU).

    >>> make_sampler("cpu").info()["kind"]
    'cpu'
    """
    if str(device).startswith("cuda"):
        index = int(str(device).split(":", 1)[1]) if ":" in str(device) else 0
        try:
            if nvml is None:
                import pynvml as nvml
            return NvmlSampler(nvml, index=index, uuid=uuid or _torch_uuid(index))
        except Exception:  # NVMLError_LibraryNotFound and friends: no usable NVML here
            pass
    return PsutilSampler(threads=threads)


def _torch_uuid(index: int) -> str | None:
    """torch's UUID of its CUDA device ``index`` (a MIG instance's own UUID on MIG), or None."""
    try:
        import torch

        return str(torch.cuda.get_device_properties(index).uuid) or None
    except Exception:
        return None
