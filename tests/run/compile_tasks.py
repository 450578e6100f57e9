"""Task bodies of tests/run/test_compile.py run on every rank of a DistPool."""

from __future__ import annotations

import torch

from plait.errors import PlaitError


def async_tp_refusal(layout: str) -> str:
    """The error ``build_model_parts(..., async_tp=True)`` raises on this CPU rank ('' if none)."""
    from plait.run.parallel.mesh import build_parallel_dims
    from plait.run.parallel.parallelize import build_model_parts
    from plait.spec.layout import Layout
    from plait.spec.models import get_model

    lay = Layout.parse(layout)
    try:
        build_model_parts(get_model("tiny"), build_parallel_dims(lay, "cpu"), torch.device("cpu"), 0,
                          lay.micro_batches(8), compile_blocks=True, async_tp=True)
    except PlaitError as exc:
        return str(exc)
    return ""


def train_compiled(layout: str, **kwargs) -> dict:
    """``runtime_tasks.train_layout`` with compiled blocks, after clearing the compile caches that
    earlier tests left in this pool process (each test compiles as a fresh run would)."""
    import runtime_tasks

    torch._dynamo.reset()
    return runtime_tasks.train_layout(layout, compile=True, **kwargs)
