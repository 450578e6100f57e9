"""Counted tensor memory of a CPU run: the peak bytes of torch tensor storage one process holds
during one steady-state training step (the *memory window*), for comparison with the planner's
itemized memory (``MemoryBreakdown.allocated``). A GPU run uses ``torch.cuda.max_memory_allocated``.

How: torch's CPU allocator reports every allocation and free to the profiler when memory
profiling is on (``torch.profiler.profile(profile_memory=True)``). The counter starts the
profiler once the model, its parallel wrappers and the optimizer are built (and a checkpoint
loaded), and switches its operator recording off at once, so that only the allocator's events
are kept (2-3% on a loop of small operators, against 25-50% with operator recording).
Bytes alive = the *baseline* - the storages of the parameters (a DTensor's local shard), the
module buffers (RoPE tables) and the optimizer state that exist when it starts - plus every
allocation since then that was not freed: gradients, Adam's lazily made state, DDP's gradient
buckets (rebuilt in the second step), FSDP2's all-gather and reduce-scatter buffers, pipeline
send/receive buffers, autograd's saved tensors, all made in C++ or Python alike. The window is
the second step of the run (``start_step + WINDOW_OFFSET``: the first creates Adam's state; none
in a one-step run); its peak is the largest number of bytes alive from its
start to its end, i.e. "bytes alive at the start of the window + the peak increase during
it". The profiler stops when the window ends; the later steps run without it. The two profiled
steps (about 5% slower on the tiny model, bench/results/cpu_memory.md) are marked ``profiled``
in the step log, and ``plait train``'s median and ``plait sweep`` leave them out of the step
time (a short run's only post-warm-up step excepted).

Why the profiler starts after the set-up, not before: a buffer made during set-up and freed on a
gloo worker thread (DDP's initial parameter broadcast: a flat copy of all parameters) is freed
where the profiler does not look, and would stay "alive" in the count on some runs and not on
others. Not counted, for the same reason: allocations and frees on foreign threads (the data
prefetch thread's token rows are numpy arrays on CPU anyway).

While the profiler runs, the process's native stderr goes to a temporary file, replayed when it
stops without the profiler's own chatter (``PROFILER_NOISE``: kineto's start/stop lines, its GPU
track warning and the allocator's note about blocks made before it started), so a CPU run prints
what it printed before; anything else written meanwhile (warnings, a traceback) comes out then.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch

WINDOW_OFFSET = 1  # the memory window: the second step of the run (the first makes Adam's state)


class TensorMemoryCounter:
    """Counts a CPU process's tensor bytes; ``peak_bytes`` is set once the window step has run.

    Use: ``start(tensors)`` once the model and optimizer are built (``tensors``: the parameters,
    buffers and optimizer state alive then), ``before_step(step)`` and ``after_step(step)`` around
    every training step, ``close()`` at the end (stops a profiler still running)."""

    def __init__(self, enabled: bool, start_step: int = 0, end_step: int | None = None):
        """``start_step``: the run's first step (> 0 when resumed); ``end_step``: one past its last."""
        self.window_step = window_step(start_step, end_step)
        self.enabled = enabled and self.window_step is not None
        self.peak_bytes: int | None = None
        self._stderr: NativeStderrFilter | None = None
        self.baseline_bytes = 0  # storage bytes of the tensors alive when the profiler started
        self._profiler = None
        self._marker: torch.Tensor | None = None

    def start(self, tensors) -> None:
        """Start counting; ``tensors``: what is alive already (each distinct storage counted once)."""
        if not self.enabled:
            return
        from torch.profiler import ProfilerActivity, profile

        self.baseline_bytes = storage_bytes(tensors)
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._stderr = NativeStderrFilter(PROFILER_NOISE)
        self._profiler.start()
        self._profiler.toggle_collection_dynamic(False, [ProfilerActivity.CPU])  # allocator events only

    @property
    def profiling(self) -> bool:
        """Whether the profiler is running (from ``start`` to the end of the window step)."""
        return self._profiler is not None

    def before_step(self, step: int) -> None:
        if self._profiler is not None and step == self.window_step:
            # a one-byte tensor whose allocation event marks where the window starts
            self._marker = torch.empty(1, dtype=torch.uint8)

    def after_step(self, step: int) -> None:
        if self._profiler is not None and step == self.window_step:
            self.peak_bytes = self._finish()

    def close(self) -> None:
        """Stop the profiler when the run ended before the window (no count: ``peak_bytes`` None)."""
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
            self._marker = None
        self._release_stderr()

    def _release_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _finish(self) -> int | None:
        profiler, marker = self._profiler, self._marker
        profiler.stop()
        self._profiler = None
        self._release_stderr()
        events = [event for event in _walk(profiler.profiler.kineto_results.experimental_event_tree())
                  if type(event.typed[1]).__name__ == "_ExtraFields_Allocation"]
        self._marker = None
        peak = window_peak([(event.start_time_ns, event.typed[1]) for event in events], marker.data_ptr(),
                           marker.untyped_storage().nbytes())
        return None if peak is None else self.baseline_bytes + peak


# Lines the profiler itself writes to native stderr (kineto 2.11-2.13, c10's CPU allocator).
PROFILER_NOISE = ("SyncActivityProfilerHandler", "Toggling CPU activity", "allocated before the profiling started")


class NativeStderrFilter:
    """Sends file descriptor 2 to a temporary file until ``close()``, then writes what arrived
    there back to the real stderr, less the lines containing any of ``noise``."""

    def __init__(self, noise: tuple[str, ...]):
        self.noise = noise
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._file = tempfile.TemporaryFile()
        os.dup2(self._file.fileno(), 2)

    def close(self) -> None:
        if self._file is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        text = self._file.read().decode(errors="replace")
        self._file.close()
        self._file = None
        kept = [line for line in text.splitlines(keepends=True) if not any(n in line for n in self.noise)]
        if kept:
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor: its local shard; a wrapper
    subclass such as torchao's fp8 / MX weights: the tensors it wraps)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        for key, nbytes in _storages(tensor):
            seen[key] = nbytes
    return sum(seen.values())


def _storages(tensor):
    """(storage address, bytes) of each plain tensor behind ``tensor``."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    if is_traceable_wrapper_subclass(local):
        names, _ = local.__tensor_flatten__()
        for name in names:
            yield from _storages(getattr(local, name))
        return
    try:
        storage = local.untyped_storage()
        yield storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # no storage of its own: its elements
        yield id(local), local.numel() * local.element_size()


def window_step(start_step: int, end_step: int | None) -> int | None:
    """The memory window of a run of steps ``start_step .. end_step - 1``: its second step; None
    for a one-step run (its only step makes Adam's state)."""
    window = start_step + WINDOW_OFFSET
    return window if end_step is None or window < end_step else None


def window_peak(events: list[tuple[int, object]], marker_ptr: int, marker_bytes: int) -> int | None:
    """Peak bytes alive over allocation events ``(start time ns, fields)`` (``fields``: ``ptr`` and
    ``alloc_size``, bytes, negative for a free, as the profiler's allocation events have them)
    from the marker's allocation on, less the marker's own bytes; None when the marker's event is
    missing. Bytes alive: every allocation since the profiler started that was not freed (the
    baseline before it is the caller's). A free
    made on a thread the profiler does not follow (a gloo worker dropping the last reference to
    a buffer) is not reported: an allocation at an address that is still alive means the block
    there was freed meanwhile, and it is taken off then (``FREED_UNSEEN``)."""
    ordered = sorted(events, key=lambda item: item[0])
    marks = [i for i, (_, fields) in enumerate(ordered) if fields.ptr == marker_ptr and fields.alloc_size > 0]
    if not marks:
        return None
    live: dict[int, int] = {}
    alive = peak = 0
    for index, (_, fields) in enumerate(ordered):
        if fields.alloc_size > 0:
            alive += fields.alloc_size - live.get(fields.ptr, 0)  # FREED_UNSEEN: the old block is gone
            live[fields.ptr] = fields.alloc_size
        else:
            alive -= live.pop(fields.ptr, 0)
        if index >= marks[-1]:
            peak = max(peak, alive)
    return peak - marker_bytes


def _walk(events):
    for event in events:
        yield event
        yield from _walk(event.children)
