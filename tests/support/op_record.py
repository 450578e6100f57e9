"""``OpRecord``: a ``TorchDispatchMode`` that lists the aten ops run inside it, by name, in order.

``PADDED_GRADIENT_OPS`` are the backward ops of indexing one piece out of a tensor (``w[e]``,
``x[a:b]``): each builds a zero tensor of the whole input's size and copies the piece's gradient
into it, so a loop that indexes k pieces builds and sums k whole-size gradients where one
``unbind`` or ``split`` stacks or concatenates them once."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

PADDED_GRADIENT_OPS = ("aten.select_backward.default", "aten.slice_backward.default")


class OpRecord(TorchDispatchMode):
    """Appends the name of every aten op dispatched while active to ``ops``."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

    def padded(self) -> list[str]:
        """The ops of ``PADDED_GRADIENT_OPS`` that ran."""
        return [op for op in self.ops if op in PADDED_GRADIENT_OPS]
