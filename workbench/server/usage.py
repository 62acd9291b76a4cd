"""Live figures per rank for the sidebar: CPU and memory of the engine process, GPU where there is one.

Read from outside the engines (psutil, NVML), so a busy or hung rank is still measured.
Nothing here touches CUDA. Processes on other hosts cannot be measured from here:
their figures are ``None``.
"""

from __future__ import annotations

import socket
import threading

import psutil

_FIGURES = ("cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes", "gpu_memory_total_bytes")


class UsageSampler:
    """Samples engine processes by pid; keeps one ``psutil.Process`` per pid so CPU % has a baseline.

    >>> import os
    >>> s = UsageSampler()
    >>> sorted(s.sample(os.getpid(), socket.gethostname(), "cpu"))
    ['alive', 'cpu_percent', 'gpu_memory_bytes', 'gpu_memory_total_bytes', 'gpu_util', 'memory_bytes']
    >>> s.sample(os.getpid(), "elsewhere.example", "cpu")["alive"] is None
    True
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._host = socket.gethostname()
        self._nvml_lock = threading.Lock()
        self._nvml: object | None = None  # the pynvml module once initialised; False when unavailable
        self._gpu_count: int | None = None

    def alive(self, pid: int, host: str, device: str = "cpu", gpu_uuid: str | None = None) -> dict:
        """Only whether engine ``pid`` lives (``None``: on another host), for a rank that is counted, not
        shown: the figures are ``None`` and nothing is read for them.

        >>> import os
        >>> seen = UsageSampler().alive(os.getpid(), socket.gethostname())
        >>> seen["alive"], seen["cpu_percent"]
        (True, None)
        """
        out: dict = {"alive": None, **dict.fromkeys(_FIGURES)}
        if host != self._host:
            return out
        try:
            out["alive"] = _running(self._process(pid))
        except psutil.Error:
            self._procs.pop(pid, None)
            out["alive"] = False
        return out

    def _process(self, pid: int) -> psutil.Process:
        """The kept ``psutil.Process`` of ``pid``, made with its CPU baseline (its first reading is 0)."""
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
            proc.cpu_percent(None)
        return proc

    def sample(self, pid: int, host: str, device: str, gpu_uuid: str | None = None) -> dict:
        """CPU and memory of engine ``pid``; for a GPU rank, its GPU's figures, found by the UUID the rank
        recorded when it joined (the server's own CUDA_VISIBLE_DEVICES says nothing about the engine's)."""
        out: dict = {"alive": None, **dict.fromkeys(_FIGURES)}
        if host != self._host:
            return out
        try:
            proc = self._process(pid)
            with proc.oneshot():
                out["alive"] = _running(proc)
                out["cpu_percent"] = round(proc.cpu_percent(None), 1)
                out["memory_bytes"] = proc.memory_info().rss
        except psutil.Error:
            self._procs.pop(pid, None)
            out["alive"] = False
            return out
        if not out["alive"]:  # a zombie's figures are its last ones: a dead rank shows none
            return {"alive": False, **dict.fromkeys(_FIGURES)}
        if device.startswith("cuda") and gpu_uuid:
            out.update(self._gpu(gpu_uuid))
        return out

    # -- NVML ---------------------------------------------------------------------------
    def _nvml_module(self):
        with self._nvml_lock:
            if self._nvml is None:
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self._nvml = pynvml
                except Exception:  # NVMLError_LibraryNotFound and friends: no GPU here
                    self._nvml = False
            return self._nvml or None

    def gpu_count(self) -> int:
        if self._gpu_count is None:
            from workbench.pool.machine.devices import visible_gpu_count

            self._gpu_count = visible_gpu_count()
        return self._gpu_count

    def _gpu(self, uuid: str) -> dict:
        from workbench.pool.machine.devices import find_device

        nvml = self._nvml_module()
        if nvml is None:
            return {}
        try:
            handle = find_device(nvml, uuid)  # a whole GPU or a MIG instance
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        except (LookupError, nvml.NVMLError):
            return {}
        try:
            util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:  # a MIG instance has no utilisation of its own: unknown, not 0
            util = None
        return {"gpu_util": util, "gpu_memory_bytes": int(mem.used), "gpu_memory_total_bytes": int(mem.total)}


def _running(proc: psutil.Process) -> bool:
    return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
