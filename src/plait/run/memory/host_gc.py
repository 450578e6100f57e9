"""Python's garbage collector on a schedule: off during training, a full collection every N steps.

The automatic collector runs whenever allocations cross its thresholds, at a different moment
on every rank; with hundreds of ranks one collecting rank delays every collective (a
straggler). ``ScheduledGC`` turns the automatic collector off for the run and collects on every
rank at the same step instead (torchtitan's ``gc_freq``, default 50 steps). Reference cycles
still get freed, only later: the memory they hold is host memory (Python objects), not device
memory held by tensors, which reference counting frees at once.
"""

from __future__ import annotations

import gc


class ScheduledGC:
    """``with ScheduledGC(every):`` the collector is off inside and restored on exit; call
    ``after_step(steps_done)`` after each optimizer step. ``every=0`` leaves the collector alone."""

    def __init__(self, every: int) -> None:
        if every < 0:
            raise ValueError(f"gc every {every} steps: must be >= 0")
        self.every = every
        self.collections = 0  # scheduled collections run so far
        self._was_enabled = gc.isenabled()

    def __enter__(self) -> ScheduledGC:
        self._was_enabled = gc.isenabled()
        if self.every:
            gc.collect()  # start the run from a clean heap: set-up made plenty of garbage
            gc.disable()
        return self

    def after_step(self, steps_done: int) -> None:
        """A generation-1 collection every ``every`` optimizer steps (cheap: young objects only)."""
        if self.every and steps_done % self.every == 0:
            gc.collect(1)
            self.collections += 1

    def __exit__(self, *exc) -> None:
        if self.every and self._was_enabled:
            gc.enable()
