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
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils._pytree import tree_map

from workbench.train.events import Callback

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


def save_state(directory, state: dict, step: int) -> Path:
    """Save ``state`` (a DCP state dict) on every rank at once as ``step-NNNNNN``; move ``latest`` last."""
    root = Path(directory)
    target = root / f"step-{step:06d}"
    dcp.save(state, checkpoint_id=target)
    if dist.is_initialized():
        dist.barrier()  # every rank wrote its part: only now is the checkpoint complete
    if not dist.is_initialized() or dist.get_rank() == 0:
        tmp = root / f".{LATEST}.tmp"
        tmp.write_text(target.name)
        os.replace(tmp, root / LATEST)
    return target


def load_state(directory, template: dict) -> dict:
    """Load the latest complete checkpoint shaped like ``template``; returns a new state dict.

    Tensors load into copies, so a failure half-way leaves the caller's objects as they were.
    A missing, truncated or foreign checkpoint raises ``ValueError``.
    """
    path = latest(directory)
    if path is None:
        raise ValueError(f"no complete checkpoint in {directory} (no '{LATEST}' pointer): save one first.")
    state = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, template)
    reader = SafeReader(path)
    reader.read_metadata()  # refuse a truncated or foreign checkpoint before DCP starts
    try:
        dcp.load(state, storage_reader=reader)
    except (Exception, CheckpointException) as exc:  # DCP wraps per-rank failures (a BaseException)
        raise ValueError(f"cannot load the checkpoint {path}: {exc}") from None
    return state


def latest(directory) -> Path | None:
    """The last complete checkpoint folder under ``directory``, or None."""
    pointer = Path(directory) / LATEST
    if not pointer.is_file():
        return None
    return Path(directory) / pointer.read_text().strip()


def save(directory, *, model, optimizer=None, step: int, extra: dict | None = None) -> Path:
    """Save a model (and optimizer) on every rank at once; ``extra``: tensors only."""
    return save_state(directory, _state(model, optimizer, step, extra), step)


def load(directory, *, model, optimizer=None, extra: dict | None = None) -> int:
    """Load the latest complete checkpoint into ``model`` (and ``optimizer``); returns its step.

    A missing, truncated or foreign checkpoint raises ``ValueError`` and leaves the model as it was.
    """
    state = load_state(directory, _state(model, optimizer, 0, extra))
    set_state_dict(model, optimizer if optimizer is not None else [],
                   model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}))
    if extra is not None:
        extra.update(state.get("extra", {}))
    return int(state["step"])


def save_trainer(directory, trainer) -> Path:
    """Checkpoint a :class:`~workbench.train.Trainer`: model, optimizer, step, data position, RNG."""
    return save_state(directory, trainer.state_dict(), trainer.step)


def resume(directory, trainer) -> int:
    """Put ``trainer`` back at the latest complete checkpoint; returns the step it resumes from.

    >>> resume("ckpt", trainer)         # doctest: +SKIP
    20
    """
    template = trainer.state_dict()
    path = latest(directory)
    if path is not None and "rng" in template:
        # at another world size a rank may have no RNG state of its own saved: it keeps its own
        saved = SafeReader(path).read_metadata().state_dict_metadata
        if not any(k.startswith(f"rng.{key}.") for key in template["rng"] for k in saved):
            del template["rng"]
    trainer.load_state_dict(load_state(directory, template))
    return trainer.step


class Checkpoint(Callback):
    """Save the trainer every ``every`` steps; ``stalls`` holds the seconds each save added to its step.

    >>> trainer = Trainer(model, data, callbacks=[Checkpoint("ckpt", every=20)])   # doctest: +SKIP
    """

    def __init__(self, directory, every: int):
        if every < 1:
            raise ValueError(f"every must be at least 1 step (got {every}).")
        self.directory, self.every = Path(directory), every
        self.stalls: list[float] = []

    def on_step_end(self, trainer, stats) -> None:
        if trainer.step % self.every == 0:
            t0 = time.perf_counter()
            save_trainer(self.directory, trainer)
            self.stalls.append(time.perf_counter() - t0)
