"""Step metrics: tokens/s, MFU, memory; the records of the JSONL log (written and read by
``plait.run.observe.jsonl``; the other metrics sinks: ``plait.run.observe.sinks``) and the rank-0
console display.

MFU has one definition in plait: model FLOPs (``ModelSpec.model_flops_per_token``: 6·N per
token plus the causal attention term, no recomputation) times tokens per second, over the
dense bf16 peak of the GPU spec times the number of GPUs. On CPU, or when the GPU is not a
known spec, MFU is reported as null rather than guessed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from plait.progress import ProgressBar
from plait.spec.model import ModelSpec
from plait.spec.units import GIB, MIB


def mfu(model: ModelSpec, seq_len: int, tokens_per_s: float, n_gpus: int, peak_flops: float | None) -> float | None:
    """Model FLOPs utilization (0..1) or None without a peak."""
    if not peak_flops:
        return None
    return model.model_flops_per_token(seq_len) * tokens_per_s / (n_gpus * peak_flops)


@dataclass
class StepRecord:
    step: int
    loss: float
    lr: float
    grad_norm: float
    step_time_s: float
    tokens_per_s: float
    mfu: float | None
    offload: dict | None = None  # activation offload counters (OffloadStats.to_dict), written flat
    profiled: bool = False  # ran under the counted-memory profiler: slower, left out of step times
    router: dict | None = None  # MoE router health (plait.run.observe.router.FIELDS), written flat

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out["step"] = self.step + 1  # the JSONL counts optimizer steps from 1, as the console does
        out.update(out.pop("offload") or {})
        out.update(out.pop("router") or {})
        if not out.pop("profiled"):
            return out
        return {**out, "profiled": True}


@dataclass
class RunSummary:
    """What the last JSONL line says. Steady-state figures skip the first (warm-up) steps."""

    steps: int
    final_loss: float
    step_time_s: float  # median over the steady-state steps
    tokens_per_s: float
    mfu: float | None
    peak_memory_bytes: int | None  # max over ranks of torch.cuda.max_memory_allocated
    peak_host_rss_bytes: int  # max over ranks of the process's peak resident memory
    device: str
    world_size: int
    layout: str
    predicted_step_time_s: float | None = None
    predicted_memory_bytes: float | None = None  # planner's peak minus CUDA context, NCCL, fragmentation
    start_step: int = 0  # first step of this run (> 0 when resumed from a checkpoint)
    stopped_early: bool = False  # stopped by SIGTERM before the last step
    checkpoints: list[int] | None = None  # steps of the checkpoints this run committed
    checkpoint_stall_s: float | None = None  # longest time training waited for one checkpoint save
    offload: dict | None = None  # activation offload per step (bytes, hidden and exposed seconds), max over ranks
    eval_loss: float | None = None  # the last held-out loss (--eval-data), mean per token; None: not evaluated
    # CPU runs: max over ranks of the counted peak of torch tensor storage, bytes, in the memory window
    # (the run's second step; plait.run.memory.counted); None on GPU or when the run ended before it
    peak_tensor_bytes: int | None = None
    data_tokens: dict | None = None  # a data mixture's input tokens per source after the last step (cumulative)

    def to_dict(self) -> dict:
        out = {"summary": True, **self.__dict__}
        out.update(out.pop("offload") or {})
        if out["data_tokens"] is None:  # not a data mixture: the line as before mixtures
            del out["data_tokens"]
        return out

    def comparison_line(self) -> str:
        """One line of predicted vs measured step time and memory."""
        parts = [f"step time {self.step_time_s:.3f} s measured"]
        if self.predicted_step_time_s:
            ratio = self.step_time_s / self.predicted_step_time_s
            parts[0] += f" vs {self.predicted_step_time_s:.3f} s predicted ({ratio:.2f}×)"
        if self.peak_memory_bytes is not None:
            text = f"peak allocated {self.peak_memory_bytes / GIB:.2f} GiB measured"
            if self.predicted_memory_bytes:
                text += (f" vs {self.predicted_memory_bytes / GIB:.2f} GiB predicted "
                         f"({self.peak_memory_bytes / self.predicted_memory_bytes:.2f}×)")
            parts.append(text)
        elif self.peak_tensor_bytes is not None:
            parts.append(f"peak tensor memory {self.peak_tensor_bytes / MIB:.1f} MiB counted "
                         f"(host RSS {self.peak_host_rss_bytes / GIB:.2f} GiB)")
        else:
            parts.append(f"peak host RSS {self.peak_host_rss_bytes / GIB:.2f} GiB (CPU run: no GPU prediction)")
        mfu_text = f"MFU {100 * self.mfu:.1f}%" if self.mfu is not None else "MFU n/a (no GPU peak)"
        return "; ".join(parts) + f"; {self.tokens_per_s:,.0f} tokens/s; {mfu_text}"


def steady_state(records: list[StepRecord]) -> list[StepRecord]:
    """Steps after warm-up: drop the first step, and the first two when there are at least six;
    then a step that ran under the counted-memory profiler, unless it is the only one left."""
    skip = 2 if len(records) >= 6 else 1 if len(records) >= 2 else 0
    after = records[skip:]
    return [r for r in after if not r.profiled] or after


def median_step_time(records: list[StepRecord]) -> float:
    return statistics.median(r.step_time_s for r in steady_state(records))


def status_text(record: StepRecord, memory_bytes: float | None = None) -> str:
    """A step's console status: loss, learning rate, gradient norm, tokens/s, step time, MFU (GPU
    runs with a known peak) and ``memory_bytes`` (the peak so far, GiB) when given."""
    parts = [f"loss {record.loss:.4f}", f"lr {record.lr:.2e}", f"gnorm {record.grad_norm:#.3g}",
             f"{record.tokens_per_s:,.0f} tok/s", f"{record.step_time_s * 1e3:.0f} ms"]
    if record.mfu is not None:
        parts.append(f"mfu {100 * record.mfu:.1f}%")
    if memory_bytes is not None:
        parts.append(f"mem {memory_bytes / GIB:.2f} GiB")
    return " | ".join(parts)


class Display:
    """Rank 0's console during training: ``plait.progress.ProgressBar`` with one item per step
    (plain lines every ``log_every`` steps when not on a terminal). ``memory``: ``() -> bytes``,
    the peak memory to show (``plait.run.trainer.peak_memory_reader``); None shows none."""

    def __init__(self, total_steps: int, enabled: bool, log_every: int, start_step: int = 0, memory=None):
        self.bar = ProgressBar("train", total_steps, enabled, done=start_step, every=log_every, unit="step",
                               clock="remaining")
        self.memory = memory if enabled else None

    def step(self, record: StepRecord) -> None:
        self.bar.advance(status_text(record, self.memory() if self.memory is not None else None))

    def message(self, text: str) -> None:
        self.bar.message(text)

    def close(self) -> None:
        self.bar.close()
