"""``OpRecord``: a ``TorchDispatchMode`` that lists the aten ops run inside it, by name, in order,
with the shape and element size of each op's (first) output.

``PADDED_GRADIENT_OPS`` are the backward ops of indexing one piece out of a tensor (``w[e]``,
``x[a:b]``): each builds a zero tensor of the whole input's size and copies the piece's gradient
into it, so a loop that indexes k pieces builds and sums k whole-size gradients where one
``unbind`` or ``split`` stacks or concatenates them once."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PADDED_GRADIENT_OPS = ("aten.select_backward.default", "aten.slice_backward.default")


class OpRecord(TorchDispatchMode):
    """Appends the name of every aten op dispatched while active to ``ops``, and (name, output shape,
    output element bytes) to ``outputs`` (shape None for an op that returns no tensor)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.outputs: list[tuple[str, tuple | None, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        shape, size = (tuple(first.shape), first.element_size()) if isinstance(first, torch.Tensor) else (None, 0)
        self.ops.append(str(func))
        self.outputs.append((str(func), shape, size))
        return out

    def count(self, name: str) -> int:
        """How many times the op ``name`` (e.g. ``aten.mm.default``) ran."""
        return self.ops.count(name)

    def bytes_of_adds(self, shapes: set) -> int:
        """Bytes the tensor additions (``aten.add`` / ``add_``) with an output of one of ``shapes``
        moved: two operands read and one result written, each of the output's size."""
        adds = [(shape, size) for name, shape, size in self.outputs
                if name.startswith(("aten.add.", "aten.add_.")) and shape in shapes]
        return sum(3 * size * torch.Size(shape).numel() for shape, size in adds)

    def padded(self) -> list[str]:
        """The ops of ``PADDED_GRADIENT_OPS`` that ran."""
        return [op for op in self.ops if op in PADDED_GRADIENT_OPS]
