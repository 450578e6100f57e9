"""Counted tensor memory of a CPU run: the peak bytes of torch tensor storage one process holds
during one steady-state training step (the *memory window*), for comparison with the planner's
itemized memory (``MemoryBreakdown.allocated``). A GPU run uses ``torch.cuda.max_memory_allocated``.

How: torch's CPU allocator reports every allocation and free to the profiler when memory
profiling is on (``torch.profiler.profile(profile_memory=True)``), with the running total of the
bytes it handed out and has not taken back (``total_allocated``). The counter starts the
profiler before the model is built - so parameters, gradients, optimizer state, the RoPE tables,
DDP's gradient buckets and every buffer made in C++ (FSDP2's all-gather and reduce-scatter
buffers, pipeline send/receive buffers, autograd's saved tensors) are in the running total - and
switches the profiler's operator recording off at once, so that only the allocator's events are
kept (about 2% of a step of small operators, against 25-50% with operator recording). The
window is the second step of the run (``start_step + 1``): the first creates Adam's state
lazily. The peak is the largest running total from the start of the window to its end,
``bytes alive at the start + peak increase during it``; the profiler stops when the window ends,
and the later steps run without it. ``plait train`` drops the first two steps of a run of six or
more from its median step time (``plait.run.metrics.steady_state``), so the window is timed only
in shorter runs.

Counted: allocations on the training thread and on threads that inherit its profiler state
(autograd's CPU backward runs on the calling thread). Not counted: tensors made before the
counter starts (process-group state), allocations on foreign threads (the data prefetch thread:
its token rows, a few KiB, are numpy arrays on CPU anyway).
"""

from __future__ import annotations

import torch

WINDOW_OFFSET = 1  # the memory window is this many steps after the run's first step


class TensorMemoryCounter:
    """Counts a CPU process's tensor bytes; ``peak_bytes`` is set once the window step has run.

    Use: ``start()`` before the model is built, ``before_step(step)`` and ``after_step(step)``
    around every training step, ``close()`` at the end (stops a profiler still running)."""

    def __init__(self, enabled: bool, start_step: int = 0):
        self.enabled = enabled
        self.window_step = start_step + WINDOW_OFFSET
        self.peak_bytes: int | None = None
        self._profiler = None
        self._marker: torch.Tensor | None = None

    def start(self) -> None:
        if not self.enabled:
            return
        from torch.profiler import ProfilerActivity, profile

        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profiler.start()
        self._profiler.toggle_collection_dynamic(False, [ProfilerActivity.CPU])  # allocator events only

    def run_starts_at(self, start_step: int) -> None:
        """The run's first step (> 0 when resumed): the window is the step after it."""
        self.window_step = start_step + WINDOW_OFFSET

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

    def _finish(self) -> int | None:
        profiler, marker = self._profiler, self._marker
        profiler.stop()
        self._profiler = None
        events = [event for event in _walk(profiler.profiler.kineto_results.experimental_event_tree())
                  if type(event.typed[1]).__name__ == "_ExtraFields_Allocation"]
        self._marker = None
        return window_peak([(event.start_time_ns, event.typed[1]) for event in events], marker.data_ptr(),
                           marker.untyped_storage().nbytes())


def window_peak(events: list[tuple[int, object]], marker_ptr: int, marker_bytes: int) -> int | None:
    """Peak running total of allocated bytes over allocation events ``(start time ns, fields)``
    (``fields``: ``ptr``, ``alloc_size`` and ``total_allocated``, bytes, as the profiler's
    allocation events have them) from the marker's allocation on, less the marker's own bytes;
    None when the marker's event is missing."""
    marks = [time_ns for time_ns, fields in events if fields.ptr == marker_ptr and fields.alloc_size > 0]
    if not marks:
        return None
    start = max(marks)
    totals = [fields.total_allocated for time_ns, fields in events if time_ns >= start]
    return int(max(totals)) - marker_bytes


def _walk(events):
    for event in events:
        yield event
        yield from _walk(event.children)
