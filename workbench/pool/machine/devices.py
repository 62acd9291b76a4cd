"""The GPUs this machine shows, through NVML, without touching CUDA (the kernel never does).

A GPU in MIG mode shows as its MIG instances, as CUDA shows it; ``CUDA_VISIBLE_DEVICES`` narrows the list
(indices, ``GPU-`` or ``MIG-`` UUIDs). A GPU is named by its UUID everywhere: torch's UUID (no prefix) and
NVML's (``GPU-...``, ``MIG-...``) are the same identity once the prefix is dropped. ``nvml`` is the
``pynvml`` module, or a fake one in unit tests.
"""

from __future__ import annotations

import os
import warnings


class SharedGpuWarning(UserWarning):
    """Ranks share a GPU (``share_gpus``): fine for trying things out, not for training speed."""


def check_gpu_fit(n: int, gpus: int, *, share: bool = False, backend: str = "auto") -> None:
    """Refuse ``n`` ranks on ``gpus`` GPUs (0: a CPU pool, any ``n``) before anything starts.

    >>> check_gpu_fit(2, 2)
    >>> check_gpu_fit(3, 2)
    Traceback (most recent call last):
    ...
    ValueError: 3 ranks on 2 GPUs: NCCL cannot run two ranks of a group on one GPU. Start -n 2 or ...
    >>> check_gpu_fit(2, 0, backend="nccl")
    Traceback (most recent call last):
    ...
    ValueError: --backend nccl needs a GPU per rank, and this machine shows none: use --backend gloo.
    """
    if backend == "nccl" and not gpus:
        raise ValueError("--backend nccl needs a GPU per rank, and this machine shows none: "
                         "use --backend gloo.")
    if not gpus or n <= gpus:
        return
    text = f"{n} ranks on {gpus} GPU{'s' * (gpus > 1)}"
    if not share:
        raise ValueError(f"{text}: NCCL cannot run two ranks of a group on one GPU. Start -n {gpus} or "
                         "fewer, or share the GPUs (share_gpus=True, --share-gpus) to try things out over "
                         "gloo.")
    warnings.warn(f"{text}: ranks share GPUs and the group talks over gloo.", SharedGpuWarning, stacklevel=2)


def bare_uuid(uuid: str | None) -> str | None:
    """A GPU UUID without NVML's ``GPU-``/``MIG-`` prefix, as torch reports it.

    >>> bare_uuid("MIG-4a1b"), bare_uuid("GPU-4a1b"), bare_uuid("4a1b")
    ('4a1b', '4a1b', '4a1b')
    """
    if not uuid:
        return None
    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    for prefix in ("GPU-", "MIG-"):
        uuid = uuid.removeprefix(prefix)
    return uuid


def _uuid(nvml, handle) -> str:
    uuid = nvml.nvmlDeviceGetUUID(handle)
    return uuid.decode() if isinstance(uuid, bytes) else uuid


def _instances(nvml, gpu) -> list:
    """The CUDA devices one physical GPU shows: its MIG instances in MIG mode, else itself."""
    try:
        current, _ = nvml.nvmlDeviceGetMigMode(gpu)
    except nvml.NVMLError:  # not MIG-capable
        return [gpu]
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return [gpu]
    found = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            found.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i))
        except nvml.NVMLError:  # an empty slot
            continue
    return found


def visible_devices(nvml, mask: str | None) -> list:
    """NVML handles of the devices CUDA shows under ``mask`` (``CUDA_VISIBLE_DEVICES``), in its order.

    Like CUDA, an entry that names no device ends the list.
    """
    if mask is not None and mask.strip() in ("", "-1"):
        return []
    gpus = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    if mask is None:
        return [d for g in gpus for d in _instances(nvml, g)]
    out = []
    for entry in (e.strip() for e in mask.split(",")):
        if entry.isdigit() and int(entry) < len(gpus):
            picked = _instances(nvml, gpus[int(entry)])
        elif entry.startswith("MIG-"):
            picked = [m for g in gpus for m in _instances(nvml, g) if _uuid(nvml, m).startswith(entry)]
        elif entry.startswith("GPU-"):
            picked = [d for g in gpus if _uuid(nvml, g).startswith(entry) for d in _instances(nvml, g)]
        else:
            picked = []
        if not picked:
            break
        out += [d for d in picked if d not in out]
    return out


def find_device(nvml, uuid: str):
    """The NVML handle (a whole GPU or a MIG instance) whose UUID is ``uuid``, with or without prefix.

    Raises ``LookupError`` when no device has it.
    """
    want = bare_uuid(uuid)
    for i in range(nvml.nvmlDeviceGetCount()):
        gpu = nvml.nvmlDeviceGetHandleByIndex(i)
        for handle in [gpu, *_instances(nvml, gpu)]:
            if bare_uuid(_uuid(nvml, handle)) == want:
                return handle
    raise LookupError(f"no GPU or MIG instance with UUID {uuid} here")


def visible_gpu_count(nvml=None) -> int:
    """GPUs (or MIG instances) visible to processes started from here, narrowed by CUDA_VISIBLE_DEVICES.

    Returns 0 where there is no NVIDIA driver.
    """
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None and mask.strip() in ("", "-1"):
        return 0
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound and friends: no GPU here
        return 0
    try:
        return len(visible_devices(nvml, mask))
    except nvml.NVMLError:
        return 0
    finally:
        nvml.nvmlShutdown()
