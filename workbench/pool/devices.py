"""Count the GPUs this machine shows, without touching CUDA (the kernel never does)."""

from __future__ import annotations

import os


def visible_gpu_count() -> int:
    """GPUs visible to processes started from here: NVML's count, narrowed by CUDA_VISIBLE_DEVICES.

    Returns 0 where there is no NVIDIA driver.
    """
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None and mask.strip() in ("", "-1"):
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVMLError_LibraryNotFound and friends: no GPU here
        return 0
    if mask is not None:
        return min(count, len([d for d in mask.split(",") if d.strip()]))
    return count
