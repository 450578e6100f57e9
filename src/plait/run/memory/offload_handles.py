"""What the activation-offload hooks keep (``plait.run.memory.offload``): per-step counters, the handle
of a storage moved off the device, the handle of one saved view of it, and which saved tensors
are parameters (never moved)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass
class OffloadStats:
    """One step's offload traffic. Bytes; seconds."""

    bytes_out: int = 0  # device -> host / disk
    bytes_in: int = 0  # host / disk -> device
    tensors: int = 0  # storages moved out
    deduplicated: int = 0  # saves that reused a storage already moved
    transfer_s: float = 0.0  # time the copies / file I/O took
    exposed_s: float = 0.0  # time training waited for them

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.transfer_s - self.exposed_s)

    def to_dict(self) -> dict:
        return {"offload_bytes_out": self.bytes_out, "offload_bytes_in": self.bytes_in,
                "offload_tensors": self.tensors, "offload_dedup": self.deduplicated,
                "offload_transfer_s": self.transfer_s, "offload_exposed_s": self.exposed_s,
                "offload_hidden_s": self.hidden_s}


def is_parameter(t: torch.Tensor) -> bool:
    """A parameter, a view of one, or autocast's cast copy of one (never offloaded)."""
    base = t
    while base._base is not None:
        base = base._base
    if isinstance(base, nn.Parameter):
        return True
    fn = base.grad_fn
    if fn is not None and fn.name().startswith("ToCopyBackward"):
        return any(nxt is not None and isinstance(getattr(nxt, "variable", None), nn.Parameter)
                   for nxt, _ in fn.next_functions)
    return False


def bytes_of(storage) -> torch.Tensor:
    """A 1-D uint8 tensor over the whole ``storage``."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class Stored:
    """One storage moved off the device (shared by every saved view of it)."""

    __slots__ = ("__weakref__", "device", "event", "host", "loaded", "nbytes", "path", "read", "source", "write")

    def __init__(self, nbytes: int, device: torch.device):
        self.nbytes = nbytes
        self.device = device
        self.host: torch.Tensor | None = None  # cpu target: the host copy
        self.event = None  # GPU: copy-out finished
        self.path: Path | None = None  # disk target
        self.write: Future | None = None
        self.read: Future | None = None
        self.loaded: torch.Tensor | None = None  # back on the device (uint8, nbytes)
        self.source: torch.Tensor | None = None  # the device bytes, held while their copy-out may run


class Saved:
    """What pack returns: the storage handle and how to rebuild the saved view."""

    __slots__ = ("dtensor", "dtype", "offset", "size", "stored", "stride")

    def __init__(self, stored, offset, size, stride, dtype, dtensor):
        self.stored, self.offset, self.size, self.stride, self.dtype = stored, offset, size, stride, dtype
        self.dtensor = dtensor  # (mesh, placements, shape, stride) of a DTensor, else None
