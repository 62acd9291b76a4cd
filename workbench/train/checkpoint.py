"""Checkpoints with torch.distributed.checkpoint: complete or not at all, damage noticed, no pickle run.

``directory`` holds ``step-000020/`` folders (what one holds: :mod:`workbench.train.checkpoint_io`)
and ``latest``, the name of the newest complete one. A save writes every rank's part at once into
``.step-000020.partial``; each rank records the SHA-256 of the files it wrote, and only once every rank
has, rank 0 writes ``SHA256SUMS``, renames the folder to ``step-000020``, moves ``latest`` and removes all
but the last ``keep`` (3) checkpoints below it. A rank killed mid-save leaves the previous one latest.

Loading checks every file it reads against ``SHA256SUMS`` and unpickles nothing but DCP's metadata
classes (exact allow-list); tensors load with ``weights_only=True``, plain values (step, optimizer
settings) from JSON. Damaged, truncated, missing or foreign files raise one ``ValueError`` naming the
file; ``fallback=True`` then loads the previous complete checkpoint instead, with a warning saying so.
Resume may use another world size: DCP reshards the tensors; plain values are kept per rank, and a rank
the checkpoint did not have takes rank 0's.

>>> save("ckpt", model=model, optimizer=opt, step=20)        # doctest: +SKIP
PosixPath('ckpt/step-000020')
>>> load("ckpt", model=model, optimizer=opt)                  # doctest: +SKIP
20
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from workbench.train import checkpoint_io as on_disk
from workbench.train.events import Callback

LATEST = "latest"
KEEP = 3
_STEP = re.compile(r"step-(\d{6,})")


def save_state(directory, state: dict, step: int, *, keep: int = KEEP) -> Path:
    """Save ``state`` (tensors and plain values in dicts and lists) on every rank at once as ``step-NNNNNN``.

    >>> save_state("ckpt", {"model": model.state_dict(), "epoch": 3}, step=20)   # doctest: +SKIP
    PosixPath('ckpt/step-000020')
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1 checkpoint (got {keep}).")
    tensors, values = _split(state)
    root, rank = Path(directory), _rank()
    final = root / f"step-{step:06d}"
    partial = root / f".{final.name}.partial"
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # left by a save that died
    _barrier()  # no rank writes into it before it is empty
    partial.mkdir(parents=True, exist_ok=True)
    writer = on_disk.SealingWriter(partial)
    _single_process_quietly(dcp.save, tensors, storage_writer=writer)
    name = on_disk.values_name(rank)
    on_disk.write_atomic(partial / name, json.dumps(values))
    sealed = _gather({**writer.digests, name: on_disk.sha256_of(partial / name)})
    if rank == 0:  # every rank has written and sealed its files: only now is the checkpoint complete
        digests = {on_disk.METADATA: on_disk.sha256_of(partial / on_disk.METADATA)}
        for each_rank in sealed:
            digests.update(each_rank)
        on_disk.write_sums(partial, digests)
        _replace(partial, final)
        on_disk.write_atomic(root / LATEST, final.name)
        _prune(root, final, keep)
    _barrier()  # no rank goes on before `latest` names the new checkpoint
    return final


def load_state(directory, template: dict, *, fallback: bool = False, optional: tuple[str, ...] = ()) -> dict:
    """Load the latest complete checkpoint shaped like ``template``; returns a new state dict.

    Tensors load into copies, so a failure half-way leaves the caller's objects as they were. Anything
    missing, damaged or foreign raises one ``ValueError``; with ``fallback=True`` the previous complete
    checkpoint loads instead, with a warning. Tensors whose dotted key starts with one of ``optional``
    may be absent (they are then left out of the result).
    """
    candidates = _candidates(directory)
    first_error = None
    for folder in candidates if fallback else candidates[:1]:
        try:
            state = _load_folder(folder, template, optional)
        except ValueError as exc:
            if not fallback:
                raise
            first_error = first_error or exc
            continue
        if first_error is not None:
            warnings.warn(f"{first_error} Loaded {folder.name}, the previous complete checkpoint, instead "
                          "(fallback=True).", stacklevel=3)
        return state
    raise ValueError(f"{first_error} No older complete checkpoint in {directory} loads either.")


def latest(directory) -> Path | None:
    """The last complete checkpoint folder under ``directory``, or None."""
    pointer = Path(directory) / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    if not _STEP.fullmatch(name):
        raise ValueError(f"refusing to load {pointer}: it names {name[:60]!r}, not a checkpoint folder "
                         "(step-NNNNNN) of this directory.")
    return Path(directory) / name


def save(directory, *, model, optimizer=None, step: int, extra: dict | None = None, keep: int = KEEP) -> Path:
    """Save a model (and optimizer) on every rank at once; ``extra``: tensors and plain values."""
    return save_state(directory, _state(model, optimizer, step, extra), step, keep=keep)


def load(directory, *, model, optimizer=None, extra: dict | None = None, fallback: bool = False) -> int:
    """Load the latest complete checkpoint into ``model`` (and ``optimizer``); returns its step.

    Anything missing, damaged or foreign raises ``ValueError`` and leaves the model as it was;
    ``fallback=True`` loads the previous complete checkpoint instead (see :func:`load_state`).
    """
    state = load_state(directory, _state(model, optimizer, 0, extra), fallback=fallback)
    set_state_dict(model, optimizer if optimizer is not None else [],
                   model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}))
    if extra is not None:
        extra.update(state.get("extra", {}))
    return int(state["step"])


def save_trainer(directory, trainer, *, keep: int = KEEP) -> Path:
    """Checkpoint a :class:`~workbench.train.Trainer`: model, optimizer, step, data position, RNG."""
    return save_state(directory, trainer.state_dict(), trainer.step, keep=keep)


def resume(directory, trainer, *, fallback: bool = False) -> int:
    """Put ``trainer`` back at the latest complete checkpoint; returns the step it resumes from.

    With ``fallback=True`` a damaged latest checkpoint gives a warning and the previous complete one.
    At another world size a rank whose RNG state was not saved keeps its own.

    >>> resume("ckpt", trainer)                         # doctest: +SKIP
    20
    >>> resume("ckpt", trainer, fallback=True)          # doctest: +SKIP
    UserWarning: refusing to load the checkpoint: ckpt/step-000040/__1_0.distcp is damaged (...). Loaded ...
    20
    """
    state = load_state(directory, trainer.state_dict(), fallback=fallback, optional=("rng.",))
    trainer.load_state_dict(state)
    return trainer.step


def save_file(state, path) -> str:
    """One rank's ``state`` (a model's ``state_dict()``, say) as one ``torch.save`` file at ``path``, complete
    or not at all: written beside it, flushed to disk, then renamed over it. ``torch.load(path,
    weights_only=True)`` reads it back. What a sweep's trial returns as its ``"checkpoint"`` is written so,
    by rank 0 of its sub-mesh (:mod:`workbench.session.sweep`); returns the path written."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.name}.partial")
    with open(partial, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, final)
    return str(final)


class Checkpoint(Callback):
    """Save the trainer every ``every`` steps, keeping the last ``keep``; ``stalls``: seconds each save took.
    Also at the step where the notebook asked every rank to checkpoint (the pool's Slurm job ends soon:
    ``trainer.checkpoint_asked``); ``asked``: the steps saved so.

    >>> trainer = Trainer(model, data, callbacks=[Checkpoint("ckpt", every=20)])   # doctest: +SKIP
    """

    saves_when_asked = True  # the Trainer says so when none of its callbacks does

    def __init__(self, directory, every: int, keep: int = KEEP):
        if every < 1:
            raise ValueError(f"every must be at least 1 step (got {every}).")
        if keep < 1:
            raise ValueError(f"keep must be at least 1 checkpoint (got {keep}).")
        self.directory, self.every, self.keep = Path(directory), every, keep
        self.stalls: list[float] = []
        self.asked: list[int] = []

    def on_step_end(self, trainer, stats) -> None:
        asked = getattr(trainer, "checkpoint_asked", False)
        if trainer.step % self.every == 0 or asked:
            t0 = time.perf_counter()
            path = save_trainer(self.directory, trainer, keep=self.keep)
            self.stalls.append(time.perf_counter() - t0)
            if asked:
                self.asked.append(trainer.step)
                if _rank() == 0:
                    print(f"workbench: saved {path} at step {trainer.step}, as the notebook asked (the "
                          "pool's Slurm job ends soon); wb.resume() continues from it.", flush=True)


# -- one folder ---------------------------------------------------------------------------------------
def _load_folder(folder: Path, template: dict, optional: tuple[str, ...]) -> dict:
    sums = on_disk.read_sums(folder)
    metadata = on_disk.read_metadata(folder, sums)
    values = on_disk.read_values(folder, sums, _rank())
    tensors, wanted = _split(template)
    saved = metadata.state_dict_metadata
    missing = [k for k in tensors if k not in saved and not k.startswith(optional)]
    missing += [k for k in wanted if k not in values]
    if missing:
        raise ValueError(f"{folder} does not fit what is being loaded: it has no {', '.join(missing[:3])}"
                         f"{' (and more)' if len(missing) > 3 else ''}.")
    state = {k: t.detach().clone() for k, t in tensors.items() if k in saved}
    try:
        _single_process_quietly(dcp.load, state, storage_reader=on_disk.SafeReader(folder, sums, metadata))
    except CheckpointException as exc:  # every rank gets every rank's failure: all fail alike
        errors = [error for _, (error, _) in sorted(exc.failures.items(), key=lambda failure: failure[0])]
        if not all(isinstance(error, Exception) for error in errors):
            raise  # Ctrl-C, not a bad file: never a reason to fall back
        if isinstance(errors[0], ValueError):
            raise ValueError(str(errors[0])) from None
        raise ValueError(f"cannot load the checkpoint {folder}: {on_disk.first_line(errors[0])}") from None
    return _fill(template, {**state, **{k: values[k] for k in wanted}})


def _candidates(directory) -> list[Path]:
    """The folder ``latest`` names, then the older ones, newest first."""
    target = latest(directory)
    if target is None:
        raise ValueError(f"no complete checkpoint in {directory} (no '{LATEST}' pointer): save one first.")
    return [target, *_older(Path(directory), target)]


def _replace(partial: Path, final: Path) -> None:
    old = final.with_name(f".{final.name}.old")
    if final.exists():  # the same step saved again
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _prune(root: Path, newest: Path, keep: int) -> None:
    """Keep ``newest`` and the ``keep - 1`` checkpoints below it (what ``fallback`` needs); remove leftovers.

    Checkpoints with a higher step (an abandoned later run) are left alone.
    """
    leftovers = [*root.glob(".step-*.partial"), *root.glob(".step-*.old")]  # of saves that died
    for folder in [*_older(root, newest)[keep - 1:], *leftovers]:
        shutil.rmtree(folder, ignore_errors=True)


def _older(root: Path, than: Path) -> list[Path]:
    """The checkpoint folders in ``root`` with a lower step than ``than``, newest first."""
    return sorted((p for p in root.glob("step-*") if _step(p) is not None and _step(p) < _step(than)),
                  key=_step, reverse=True)


def _step(folder: Path) -> int | None:
    match = _STEP.fullmatch(folder.name)
    return int(match[1]) if match else None


# -- tensors for DCP, plain values for JSON ---------------------------------------------------------------
def _split(state) -> tuple[dict[str, torch.Tensor], dict]:
    """Every leaf of ``state`` by dotted key: ({key: tensor}, {key: plain value})."""
    tensors, values = {}, {}
    for key, leaf in _leaves(state, ""):
        if isinstance(leaf, torch.Tensor):
            tensors[key] = leaf
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            values[key] = leaf
        else:
            raise ValueError(f"cannot checkpoint {key} (a {type(leaf).__name__}): a checkpoint holds tensors "
                             "and plain values (numbers, strings, None) in dicts, lists and tuples.")
    return tensors, values


def _leaves(tree, prefix: str):
    if isinstance(tree, Mapping):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        yield prefix, tree
        return
    for key, value in items:
        yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))


def _fill(template, loaded: dict, prefix: str = ""):
    """``template``'s shape with each leaf taken from ``loaded`` (leaves not there are left out)."""
    if isinstance(template, Mapping):
        pairs = ((k, v, f"{prefix}.{k}" if prefix else str(k)) for k, v in template.items())
        return {k: _fill(v, loaded, key) for k, v, key in pairs if _has(v, loaded, key)}
    if isinstance(template, (list, tuple)):
        filled = [_fill(v, loaded, f"{prefix}.{i}" if prefix else str(i)) for i, v in enumerate(template)]
        return tuple(filled) if isinstance(template, tuple) else filled
    return loaded[prefix]


def _has(value, loaded: dict, key: str) -> bool:
    return isinstance(value, (Mapping, list, tuple)) or key in loaded


# -- the world ------------------------------------------------------------------------------------------
def _state(model, optimizer, step, extra) -> dict:
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_sd, "step": step}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    if extra:
        state["extra"] = dict(extra)
    return state


def _single_process_quietly(fn, *args, **kwargs):
    with warnings.catch_warnings():  # DCP warns on every call outside a process group
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return fn(*args, **kwargs)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _gather(obj) -> list:
    """``obj`` of every rank, on rank 0 (elsewhere an empty list)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out or []
