"""Step results that stay on the device until a logging step: no host sync on the other steps.

A step's loss, SIGTERM flag and gradient norm are one 3-element fp32 device tensor
(``PendingStep.values``; an MoE model's router figures follow them: ``plait.run.observe.router``). They are read on the host ("materialized": floats, a JSONL line and
the display) only at *sync steps*: every ``--log-every``-th step (0, n, 2n, ...), the step
before a checkpoint save, the last step, every step with ``--on-nan skip`` (which must decide
before each optimizer step) and every step of a GPU run with activation offload (its counters
are CUDA events read per step), and when the run stops. One device-to-host copy reads all
steps pending since the previous sync step.

The stop flag needs no collective of its own: it rides in the loss all-reduce
(``plait.run.step.reduce_loss_and_stop``). On a sync step it is read with the loss. On other
steps a non-blocking copy puts it in a host buffer (pinned on GPU, two of them, alternating),
whose event the loop waits on one step later: the stop request seen in step s ends the run
after step s+1 on every rank alike. By then the GPU has long finished step s's all-reduce, so
the wait costs nothing while the host stays at most a step ahead.

Step time: ``time.perf_counter`` on CPU; a pair of CUDA events on GPU (never
``torch.cuda.synchronize``), read at materialization.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from plait.errors import PlaitError
from plait.run.metrics import StepRecord, mfu
from plait.run.observe.router import health_fields

MAX_CONSECUTIVE_SKIPS = 5  # --on-nan skip: stop after this many bad steps in a row
LOSS, STOP, GRAD_NORM = 0, 1, 2  # positions in PendingStep.values


class StepTimer:
    """Marks the start and end of a step: perf_counter on CPU, timing events on CUDA."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start, end) -> float:
        """Seconds from ``start`` to ``end`` (CUDA events must be complete: call after a sync)."""
        if isinstance(start, float):
            return end - start
        end.synchronize()  # a sync step: the host waits for this step anyway
        return start.elapsed_time(end) / 1e3


@dataclass(eq=False)
class PendingStep:
    """One optimizer step whose numbers may still be on the device."""

    step: int
    lr: float
    values: torch.Tensor  # [mean loss, ranks asking to stop, gradient norm, *router figures], fp32 on the device
    start: object  # StepTimer marks
    end: object = None
    wall_time: float = 0.0  # time.time() at the end of the step (the JSONL "time")
    host: list[float] | None = None  # ``values`` read on the host (sync steps)
    checked: bool = False  # the --on-nan policy has seen it
    skipped: str | None = None  # what was not finite when the optimizer step was skipped
    offload: dict | None = None
    profiled: bool = False  # ran under the counted-memory profiler (plait.run.memory.counted): not timed

    @property
    def stop_requested(self) -> bool:
        """Some rank asked to stop in this step (needs ``host``: a sync step)."""
        return self.host is not None and self.host[STOP] > 0


class StopFlags:
    """Host copies of non-sync steps' values, filled without a sync; read one step later."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.buffers = [torch.zeros(3, dtype=torch.float32, pin_memory=self.cuda) for _ in range(2)]
        self.views = [buffer.numpy() for buffer in self.buffers]  # host memory, read without a dispatch
        self.events: list = [None, None]
        self.steps: list[int | None] = [None, None]

    def post(self, step: int, values: torch.Tensor) -> None:
        slot = step % 2
        self.buffers[slot].copy_(values[:3], non_blocking=True)
        if self.cuda:
            self.events[slot] = torch.cuda.Event()
            self.events[slot].record()
        self.steps[slot] = step

    def requested(self, step: int) -> bool:
        """Whether a rank asked to stop in non-sync step ``step`` (False if it was not posted)."""
        slot = step % 2
        if self.steps[slot] != step:
            return False
        if self.events[slot] is not None:
            self.events[slot].synchronize()  # step ``step``'s copy: done long before the next step ends
        return bool(self.views[slot][STOP] > 0)


class NonFinitePolicy:
    """--on-nan: stop at a step whose loss or gradient norm is not finite, or skip its optimizer
    step (``skip``), stopping after ``MAX_CONSECUTIVE_SKIPS`` skipped steps in a row.

    ``skip`` decides before each optimizer step, so it reads the loss every step (a host sync
    per step). ``stop`` checks each step when it is read: before its optimizer step on a sync
    step, otherwise at the next sync step (always before a checkpoint is saved), naming the
    first non-finite step.
    """

    def __init__(self, on_nan: str):
        self.on_nan = on_nan
        self.skipped_in_a_row = 0

    @property
    def syncs_every_step(self) -> bool:
        return self.on_nan == "skip"

    def check(self, step: int, loss: float, grad_norm: float, lr: float, read_at: int | None = None) -> str | None:
        """None for a finite step; "loss" or "gradient norm" for one to skip; raises PlaitError to
        stop. ``read_at``: the later step at which a non-sync step's numbers were read (None: now,
        before its optimizer step)."""
        bad = None if math.isfinite(loss) else "loss"
        if bad is None and not math.isfinite(grad_norm):
            bad = "gradient norm"
        if bad is None:
            self.skipped_in_a_row = 0
            return None
        self.skipped_in_a_row += 1
        if self.on_nan == "stop" or self.skipped_in_a_row > MAX_CONSECUTIVE_SKIPS:
            value = loss if bad == "loss" else grad_norm
            when = ("stopping before the optimizer step" if read_at is None else
                    f"read at step {read_at + 1} (--log-every reads losses only on logging steps); stopping "
                    "without saving the weights of any later step")
            text = (f"{bad} is {value} at step {step + 1} (loss {loss:.4g}, lr {lr:.3g}); {when}. Lower the learning "
                    "rate, check the data, or pass --on-nan skip")
            if self.on_nan == "skip":
                text = f"{MAX_CONSECUTIVE_SKIPS + 1} steps in a row skipped; " + text
            raise PlaitError(text)
        return bad


class StepLedger:
    """The loop's pending steps: which steps sync, and turning pending steps into records."""

    def __init__(self, setup, log, display):
        config = setup.config
        self.setup, self.log, self.display = setup, log, display
        self.policy = NonFinitePolicy(config.runtime.on_nan)
        self.flags = StopFlags(setup.device)
        self.timer = StepTimer(setup.device)
        self.log_every = config.observe.log_every_on(setup.device.type)
        self.steps = config.job.steps
        self.offload_events = setup.parts.offloader is not None and setup.device.type == "cuda"
        self.pending: list[PendingStep] = []
        self.records: list[StepRecord] = []

    def syncs_at(self, step: int, save_due: bool = False) -> bool:
        """Whether 0-based ``step`` reads its numbers on the host (``save_due``: a checkpoint follows):
        the first step, every ``log_every``-th counted from 1 (steps 1, N, 2N, ... as printed, the
        cadence of --checkpoint-every and --eval-every) and the last."""
        return (step == 0 or (step + 1) % self.log_every == 0 or step == self.steps - 1 or save_due
                or self.policy.syncs_every_step or self.offload_events)

    def add(self, pending: PendingStep) -> None:
        if pending.host is None:
            self.flags.post(pending.step, pending.values)
        self.pending.append(pending)

    def read(self, now: int, current: PendingStep | None = None) -> str | None:
        """Read every pending step and ``current`` (step ``now``, before its optimizer step) on the
        host with one device-to-host copy, and run the --on-nan check on them in step order (the
        first non-finite step is the one named). Returns what ``current`` skips (--on-nan skip)."""
        steps = self.pending + ([current] if current is not None else [])
        unread = [p for p in steps if p.host is None]
        if unread:
            values = torch.stack([p.values for p in unread]).tolist()
            for pending, host in zip(unread, values, strict=True):
                pending.host = host
        for index, pending in enumerate(steps):
            if not pending.checked:
                read_at = None if pending is current else now
                try:
                    pending.skipped = self.policy.check(pending.step, pending.host[LOSS], pending.host[GRAD_NORM],
                                                        pending.lr, read_at=read_at)
                except PlaitError:
                    self._emit([p for p in steps[:index] if p is not current])  # the good steps keep their lines
                    raise
                pending.checked = True
        return current.skipped if current is not None else None

    def materialize(self, now: int) -> list[StepRecord]:
        """Read and check every pending step (``read``), then write its JSONL line and show it."""
        self.read(now)
        return self._emit(list(self.pending))

    def _data_tokens(self, steps_done: int) -> dict[str, int]:
        """A data mixture's input tokens per source after ``steps_done`` steps, as JSONL fields
        ``data_tokens/NAME`` (TensorBoard scalars of that name); {} for one token file or synthetic data."""
        consumed = getattr(self.setup.source, "tokens_consumed", None)
        if consumed is None:
            return {}
        job = self.setup.config.job
        return {f"data_tokens/{name}": n for name, n in consumed(steps_done, job.global_batch, job.seq_len).items()}

    def _emit(self, steps: list[PendingStep]) -> list[StepRecord]:
        """Records, JSONL lines and display lines of ``steps`` (read and checked), in order."""
        job = self.setup.config.job
        out = []
        for pending in steps:
            loss, grad_norm = pending.host[LOSS], pending.host[GRAD_NORM]
            elapsed = StepTimer.seconds(pending.start, pending.end)
            tokens_per_s = job.tokens_per_step / elapsed
            record = StepRecord(step=pending.step, loss=loss, lr=pending.lr, grad_norm=grad_norm,
                                step_time_s=elapsed, tokens_per_s=tokens_per_s,
                                mfu=mfu(job.model, job.seq_len, tokens_per_s, job.layout.world_size,
                                        self.setup.peak_flops),
                                offload=pending.offload, profiled=pending.profiled,
                                router=health_fields(pending.host[GRAD_NORM + 1:], job.model))
            if pending.skipped:
                self.display.message(f"step {pending.step + 1}: {pending.skipped} is not finite; optimizer step "
                                     "skipped (--on-nan skip)")
            self.log.write({**record.to_dict(), "time": pending.wall_time,
                            **({"skipped": True} if pending.skipped else {}), **self._data_tokens(pending.step + 1)})
            self.display.step(record)
            out.append(record)
        emitted = {id(p) for p in steps}
        self.pending = [p for p in self.pending if id(p) not in emitted]
        self.records.extend(out)
        return out
