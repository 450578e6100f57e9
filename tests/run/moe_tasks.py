"""Task bodies of the mixture-of-experts runtime tests (tests/run/test_moe_parity.py), run on every
rank of a DistPool and, for the reference, in one process.

``train_layouts`` trains ``tiny-moe`` under several layouts in one pool round trip (each layout a
run of its own on the same ranks; layouts needing fewer ranks than the pool are not given here).
"""

from __future__ import annotations

import torch.distributed as dist

from runtime_tasks import in_one_process, train_layout

MODEL = "tiny-moe"  # 4 layers (the first dense), hidden 128, 8 experts top-2, one shared expert
STEPS = 2


def train_layouts(layouts: list[str], steps: int = STEPS, **kwargs) -> list[dict]:
    """``runtime_tasks.train_layout`` of ``tiny-moe`` for each layout, in order; parameters on rank 0."""
    return [train_layout(layout, model=MODEL, steps=steps, part_fields=(), **kwargs) for layout in layouts]


def reference(steps: int = STEPS, **kwargs) -> dict:
    """The single-process run of ``tiny-moe``."""
    return in_one_process(train_layout, "dp=1", model=MODEL, steps=steps, part_fields=(), **kwargs)


def world_size() -> int:
    return dist.get_world_size()
