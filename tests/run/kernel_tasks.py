"""Task bodies for tests/run/test_kernel_knobs.py, run on every rank of a DistPool (and in one process).

``train_with_chunks`` trains the tiny model like ``runtime_tasks.train_layout`` with the chunked
cross entropy's chunk size set small (``chunk_tokens``), so that a micro-batch of a few hundred
tokens is split into several chunks, the last one shorter.
"""

from __future__ import annotations

import runtime_tasks


def train_with_chunks(layout: str, chunk_tokens: int = 24, **kwargs) -> dict:
    from plait.run import loss

    previous, loss.CHUNK_TOKENS = loss.CHUNK_TOKENS, chunk_tokens
    try:
        return runtime_tasks.train_layout(layout, **kwargs)
    finally:
        loss.CHUNK_TOKENS = previous


def reference(layout: str = "dp=1", **kwargs) -> dict:
    """One process, ``layout`` (a kernel-knob variant of dp=1)."""
    return runtime_tasks.in_one_process(train_with_chunks, layout, **kwargs)
