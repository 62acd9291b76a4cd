"""What one checkpoint folder holds, and how it is written and read without running anything in it.

A folder ``step-000020`` holds DCP's ``.metadata`` and ``__R_N.distcp`` files (tensors only), one
``values-R.json`` per rank (the plain values: counters, optimizer settings) and ``SHA256SUMS`` in the
format of ``sha256sum``, so ``cd step-000020 && sha256sum -c SHA256SUMS`` checks it by hand as well.

Reading trusts nothing in the folder:

- every file is checked against ``SHA256SUMS`` before it is used: damage is named, never loaded;
- ``.metadata`` is unpickled with an exact allow-list of (module, name) pairs (the DCP metadata classes,
  ``torch.Size``, dtypes, layouts, paths); anything else, dotted names such as ``os.system`` included,
  is refused before it is looked up;
- metadata naming a pickled (non-tensor) item, a file without a checksum or a stream transform is refused;
- tensors load through ``torch.load(weights_only=True)`` (DCP's reader), so a crafted data file is refused.

>>> read_sums(folder)                                   # doctest: +SKIP
{'.metadata': '9f2c...', '__0_0.distcp': '41d0...', 'values-0.json': '77ab...'}
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future

SUMS = "SHA256SUMS"
METADATA = ".metadata"

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
# Exactly the globals a DCP metadata file refers to. Exact pairs, never prefixes: pickle resolves a
# dotted name ("os.system") through the module's globals, so any name with a dot is refused too.
_ALLOWED = frozenset({
    *((_METADATA_MODULE, name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    *((module, cls) for module in ("pathlib", "pathlib._local") for cls in ("PosixPath", "WindowsPath")),
    *(("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)),
})


def values_name(rank: int) -> str:
    return f"values-{rank}.json"


def sha256_of(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """``path`` holds either its old content or all of ``text``, also after a crash."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_sums(folder: Path, digests: dict[str, str]) -> None:
    write_atomic(folder / SUMS, "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items())))


def read_sums(folder: Path) -> dict[str, str]:
    """{file name: SHA-256} as recorded at save; a folder without them was never completed."""
    try:
        text = (folder / SUMS).read_text()
    except FileNotFoundError:
        raise ValueError(f"refusing to load {folder}: it has no {SUMS}, so it is not a complete checkpoint "
                         "(a save that did not finish, or one from an older workbench).") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"refusing to load {folder}: cannot read its {SUMS} ({exc}).") from None
    sums = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not _is_plain_name(name) or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"refusing to load {folder}: its {SUMS} is malformed ({line[:80]!r}).")
        sums[name] = digest
    return sums


def verify(folder: Path, name: str, sums: dict[str, str]) -> Path:
    """The path of ``name`` in ``folder``, once its SHA-256 is the one recorded at save."""
    path = folder / name
    if name not in sums:
        raise ValueError(f"refusing to load the checkpoint: {path} has no checksum recorded at save.")
    try:
        digest = sha256_of(path)
    except FileNotFoundError:
        raise ValueError(f"refusing to load the checkpoint: {path} is missing.") from None
    if digest != sums[name]:
        raise ValueError(f"refusing to load the checkpoint: {path} is damaged (its SHA-256 is not the "
                         f"one recorded in {SUMS} when it was saved).")
    return path


def read_metadata(folder: Path, sums: dict[str, str]) -> Metadata:
    """DCP's metadata of ``folder``, checked against its sums and unpickled with the exact allow-list."""
    path = verify(folder, METADATA, sums)
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except _Refused as exc:
        raise ValueError(f"refusing to load {path}: it refers to {exc}, which DCP metadata never holds "
                         "(a foreign or tampered file; nothing of it was run).") from None
    except Exception as exc:  # truncated or foreign bytes fail in many ways; none of them is run
        raise ValueError(f"refusing to load {path}: it is not DCP metadata ({first_line(exc)}).") from None
    if not isinstance(metadata, Metadata):
        raise ValueError(f"refusing to load {path}: it holds a {type(metadata).__name__}, not DCP metadata.")
    try:
        items, files = metadata.state_dict_metadata.items(), metadata.storage_data.values()
        for key, item in items:
            if not isinstance(item, TensorStorageMetadata):
                raise ValueError(f"refusing to load {folder}: its item {key!r} is a pickled object, not a "
                                 "tensor (workbench checkpoints keep plain values in JSON, unpickle none).")
        for info in files:
            if info.relative_path not in sums or getattr(info, "transform_descriptors", None):  # torch >= 2.7
                raise ValueError(f"refusing to load {path}: it refers to {info.relative_path!r}, a file "
                                 "without a recorded checksum, or to a stream transform.")
    except (AttributeError, TypeError) as exc:
        raise ValueError(f"refusing to load {path}: malformed DCP metadata ({exc}).") from None
    return metadata


def read_values(folder: Path, sums: dict[str, str], rank: int) -> dict:
    """This rank's plain values (rank 0's for a rank the checkpoint did not have).

    Every rank checks every rank's file (they are small): ranks then agree on whether a checkpoint loads.
    """
    names = sorted(name for name in sums if name.startswith("values-"))
    data = {name: verify(folder, name, sums).read_bytes() for name in names}
    name = values_name(rank) if values_name(rank) in data else values_name(0)
    if name not in data:
        raise ValueError(f"refusing to load {folder}: it has no {name}, so no workbench save wrote it.")
    try:
        values = json.loads(data[name])
    except ValueError as exc:  # also UnicodeDecodeError
        raise ValueError(f"refusing to load {folder / name}: not the JSON a save writes ({exc}).") from None
    if not isinstance(values, dict):
        raise ValueError(f"refusing to load {folder / name}: it holds no {{key: value}} object.")
    return values


class SealingWriter(dcp.FileSystemWriter):
    """DCP's file writer that records the SHA-256 of each file this rank wrote, in ``digests``."""

    def __init__(self, path):
        super().__init__(path)
        self.digests: dict[str, str] = {}

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        names = {result.storage_data.relative_path for result in written.wait()}
        self.digests = {name: sha256_of(Path(self.path) / name) for name in sorted(names)}
        return written


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader for a folder that :func:`read_metadata` passed: tensors only, each file verified."""

    def __init__(self, folder: Path, sums: dict[str, str], metadata: Metadata):
        super().__init__(folder)
        self.folder, self.sums, self.metadata = folder, sums, metadata

    def read_metadata(self, *args, **kwargs) -> Metadata:
        self.metadata.storage_meta = self.metadata.storage_meta or StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id
        return self.metadata

    def read_data(self, plan, planner) -> Future:
        per_file: dict[str, list] = {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:  # read_metadata refused these already
                raise ValueError(f"refusing to load {self.folder}: {item.dest_index.fqn} is pickled.")
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in sorted(per_file.items()):
            path = verify(self.folder, name, self.sums)
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except pickle.UnpicklingError:
                raise ValueError(f"refusing to load {path}: it holds pickled objects other than tensors "
                                 "(torch.load with weights_only=True refused them).") from None
            except (RuntimeError, OSError, EOFError, AssertionError) as exc:
                raise ValueError(f"refusing to load {path}: it is not a tensor file DCP wrote "
                                 f"({first_line(exc)}).") from None
        done: Future = Future()
        done.set_result(None)
        return done


class _Refused(pickle.UnpicklingError):
    """A global outside the allow-list: refused before it is looked up."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise _Refused(f"{module}.{name}")
        return super().find_class(module, name)


def _is_plain_name(name: str) -> bool:
    return bool(name) and name == Path(name).name and name not in (".", "..") and name != SUMS


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
