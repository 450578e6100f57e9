"""Data off the critical path: the next step's rows are made in a background thread.

``PrefetchingSource`` wraps a token source (``plait.run.data.tokens``) and has the same
``batch(step, positions, seq_len, global_batch)``. When step ``s`` is asked for, it hands back
the rows that were made in the background (or makes them now, the first time) and starts making
step ``s + 1`` with the same positions in its thread, while step ``s`` trains. The rows are a
pure function of the request (the sources' sampling contract), so which thread makes them, and
when, changes nothing: a run with prefetching reads exactly the tokens of a run without, and a
resumed run exactly those of the uninterrupted one.

On GPU the rows come back as a pinned (page-locked) int64 CPU tensor, so that ``to_device``
copies them with ``non_blocking=True`` (the copy overlaps the previous step's kernels; the
caching host allocator keeps the buffer until the copy has run). On CPU they stay a numpy array.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch


class PrefetchingSource:
    """A token source that makes the next step's batch in a background thread (see module doc)."""

    def __init__(self, source, pin_memory: bool = False) -> None:
        self.source = source
        self.pin_memory = pin_memory
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-prefetch")
        self._lock = threading.Lock()
        self._pending: tuple[tuple, Future] | None = None  # (request key, its future)
        self._closed = False
        self.hits = 0  # batches that were ready (or being made) when asked for
        self.misses = 0  # batches made on the caller's thread

    @property
    def description(self) -> str:
        return self.source.description

    def __getattr__(self, name: str):  # vocab_size, path, n_samples, ... of the wrapped source
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    def _make(self, step: int, positions: tuple[int, ...], seq_len: int, global_batch: int | None):
        rows = np.ascontiguousarray(self.source.batch(step, positions, seq_len, global_batch), dtype=np.int64)
        if self.pin_memory:
            return torch.from_numpy(rows).pin_memory()
        return rows

    def batch(self, step: int, positions: Sequence[int], seq_len: int, global_batch: int | None = None):
        """The rows of ``source.batch(step, positions, seq_len, global_batch)``: an int64 array, or a
        pinned int64 tensor with ``pin_memory``. Errors of the source are raised here, by the step
        that asked."""
        key = (step, tuple(int(p) for p in positions), seq_len, global_batch)
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None and pending[0] == key:
            self.hits += 1
            rows = pending[1].result()
        else:
            if pending is not None:
                pending[1].cancel()
            self.misses += 1
            rows = self._make(*key)
        following = (step + 1, *key[1:])
        with self._lock:
            if not self._closed:
                self._pending = (following, self._pool.submit(self._make, *following))
        return rows

    def close(self) -> None:
        """Stop the thread (a batch being made is finished and dropped)."""
        with self._lock:
            if self._pending is not None:
                self._pending[1].cancel()
            self._pending = None
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)
        close = getattr(self.source, "close", None)
        if close is not None:  # a mixture's streams: their tokenizing threads
            close()


def prefetching(source, device: torch.device) -> PrefetchingSource:
    """``source`` wrapped for prefetching; pinned host buffers when ``device`` is a GPU."""
    return PrefetchingSource(source, pin_memory=device.type == "cuda")


def to_device(rows, device: torch.device) -> torch.Tensor:
    """int64 token rows (numpy array or CPU tensor) on ``device``; asynchronous from pinned memory."""
    tokens = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
    if tokens.device == device:
        return tokens
    return tokens.to(device, non_blocking=tokens.is_pinned())
