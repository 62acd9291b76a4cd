"""Checkpoints with torch.distributed.checkpoint: complete or not at all.

Each save goes to its own folder ``step-000020``; the ``latest`` pointer is replaced
(atomically) only after every rank finished writing, so a rank killed mid-save leaves
the previous checkpoint as the latest. Loading never unpickles anything but the
checkpoint's own metadata classes, and tensors load with ``weights_only`` semantics.
Resume may use another world size: DCP reshards.

>>> save("ckpt", model=model, optimizer=opt, step=20)        # doctest: +SKIP
>>> load("ckpt", model=model, optimizer=opt)                  # doctest: +SKIP
20
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils._pytree import tree_map

LATEST = "latest"

# The only globals a DCP metadata file refers to; anything else is refused, never executed.
_ALLOWED_PREFIXES = ("torch.distributed.checkpoint.",)
_ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
            ("pathlib", "WindowsPath"), ("collections", "OrderedDict"), ("builtins", "set"),
            ("builtins", "frozenset"), ("builtins", "slice")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith(_ALLOWED_PREFIXES) or (module, name) in _ALLOWED or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"checkpoint metadata refers to {module}.{name}, which a checkpoint never needs: "
            "refusing to load it (it may be a foreign or tampered file).")


class SafeReader(dcp.FileSystemReader):
    """A FileSystemReader whose metadata loading executes no foreign pickle."""

    def read_metadata(self, *args, **kwargs):
        path = Path(self.path) / ".metadata"
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"{self.path} is not a complete checkpoint: {exc}") from None
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise ValueError(f"{self.path} holds no readable checkpoint metadata: {exc}") from None
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _state(model, optimizer, step, extra) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_sd, "step": torch.tensor(step, dtype=torch.int64)}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    if extra:
        state["extra"] = dict(extra)
    return state


def save(directory, *, model, optimizer=None, step: int, extra: dict | None = None) -> Path:
    """Save on every rank at once; returns the new checkpoint folder. ``extra``: tensors only."""
    root = Path(directory)
    target = root / f"step-{step:06d}"
    dcp.save(_state(model, optimizer, step, extra), checkpoint_id=target)
    if dist.is_initialized():
        dist.barrier()  # every rank wrote its part: only now is the checkpoint complete
    if not dist.is_initialized() or dist.get_rank() == 0:
        tmp = root / f".{LATEST}.tmp"
        tmp.write_text(target.name)
        os.replace(tmp, root / LATEST)
    return target


def latest(directory) -> Path | None:
    """The last complete checkpoint folder under ``directory``, or None."""
    pointer = Path(directory) / LATEST
    if not pointer.is_file():
        return None
    return Path(directory) / pointer.read_text().strip()


def load(directory, *, model, optimizer=None, extra: dict | None = None) -> int:
    """Load the latest complete checkpoint into ``model`` (and ``optimizer``); returns its step.

    A missing, truncated or foreign checkpoint raises ``ValueError`` and leaves the model as it was.
    """
    path = latest(directory)
    if path is None:
        raise ValueError(f"no complete checkpoint in {directory} (no '{LATEST}' pointer): save one first.")
    # load into copies: a failure half-way must leave the model as it was
    state = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v,
                     _state(model, optimizer, 0, extra))
    reader = SafeReader(path)
    reader.read_metadata()  # refuse a truncated or foreign checkpoint before DCP starts
    try:
        dcp.load(state, storage_reader=reader)
    except (Exception, CheckpointException) as exc:  # DCP wraps per-rank failures (a BaseException)
        raise ValueError(f"cannot load the checkpoint {path}: {exc}") from None
    set_state_dict(model, optimizer if optimizer is not None else [],
                   model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}))
    if extra is not None:
        extra.update(state.get("extra", {}))
    return int(state["step"])
