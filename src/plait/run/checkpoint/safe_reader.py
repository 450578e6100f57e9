"""Reading a DCP checkpoint without running what its files say: ``SafeFileSystemReader``.

torch.distributed.checkpoint keeps a checkpoint's index in ``.metadata``, a Python pickle that
``FileSystemReader`` loads with ``pickle.load``: a crafted checkpoint (with its manifest's
checksums recomputed) ran arbitrary code under ``plait train --resume`` and ``plait export``.
This reader unpickles only the classes DCP metadata is made of - the dataclasses of
``torch.distributed.checkpoint.metadata`` and the file reader's ``_StorageInfo``, ``torch.Size``,
the torch dtypes and layouts, paths - and refuses anything else in one line, naming the class.
The tensor files themselves are raw bytes read into tensors (no pickle). What is trusted, then:
a checkpoint's tensors are data; nothing in it is executed.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from plait.errors import PlaitError

METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in ("Metadata", "ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata",
                 "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class MetadataUnpickler(pickle.Unpickler):
    """A pickle reader that builds only the classes of ``METADATA_CLASSES`` (and torch dtypes)."""

    def find_class(self, module: str, name: str):
        if (module, name) in METADATA_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                 torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata")


def read_metadata_file(path: str | Path) -> Metadata:
    """The DCP ``Metadata`` in the file ``path``; PlaitError (one line) for anything else."""
    try:
        with open(path, "rb") as handle:
            metadata = MetadataUnpickler(handle).load()
    except OSError as exc:
        raise PlaitError(f"cannot read {path} ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001 - any malformed pickle: one line
        raise PlaitError(f"{path} is not a checkpoint's DCP metadata ({type(exc).__name__}: {exc}); plait does not "
                         "load it (a checkpoint's metadata holds only DCP's own classes)") from None
    if not isinstance(metadata, Metadata):
        raise PlaitError(f"{path} is not a checkpoint's DCP metadata (it holds a {type(metadata).__name__})")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` goes through ``MetadataUnpickler``."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        locate = getattr(self, "_get_metadata_path", None)
        path = locate(kwargs.get("rank")) if locate is not None else Path(self.path) / ".metadata"
        metadata = read_metadata_file(path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
