"""The training loop of one rank (the process group must already be initialized).

Per step: read this rank's share of the global batch (a pure function of step and position in
the global batch, whatever the layout), forward and backward over the micro-batches, the
global mean loss (stop with a message if it is not finite), clip by the global gradient norm,
AdamW step with the scheduled learning rate, metrics.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from plait.errors import PlaitError
from plait.run.checkpoint.dcp import Checkpointer, load_checkpoint
from plait.run.checkpoint.store import read_manifest
from plait.run.config import RunConfig
from plait.run.parallel.context.shard import sequence_shard_of
from plait.run.data.tokens import open_tokens
from plait.run.faults import injected_fault, kill_self
from plait.run.parallel.mesh import ParallelDims, build_parallel_dims
from plait.run.metrics import (
    Display,
    JsonlLog,
    RunSummary,
    StepRecord,
    median_step_time,
    mfu,
    steady_state,
)
from plait.run.optim import build_optimizer, clip_grad_norm, lr_at, set_lr
from plait.run.parallel.parallelize import ModelParts, build_model_parts
from plait.run.step import forward_backward, global_mean_loss
from plait.spec.hardware import get_gpu
from plait.spec.model import ModelSpec


def pick_device(config: RunConfig) -> torch.device:
    """cuda:<local rank> when asked for (or available with device=auto), else cpu."""
    want_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if not want_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise PlaitError("device=cuda but torch sees no GPU")
    index = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def seed_step(seed: int, step: int, pdims: ParallelDims) -> None:
    """Seed the RNG streams (dropout) of optimizer step ``step`` from (seed, step, dp rank, pp rank).

    Re-seeding every step makes the stream a function of the step alone, so a run resumed at
    any step draws exactly what the uninterrupted run drew (no generator state to save).
    Weights use their own seeds. Tensor-parallel ranks share a stream: dropout on activations
    they all hold (the residual stream without sequence parallelism) must drop the same
    elements on every one of them.
    """
    stream = ((seed * 1_000_003 + step) * 1_000_033 + pdims.dp_rank) * 1_009 + pdims.pp_rank
    torch.manual_seed(stream & ((1 << 63) - 1))
    np.random.seed(stream % 2**32)


def local_batch(source, config: RunConfig, pdims: ParallelDims, step: int, device: torch.device):
    """(inputs, labels) of this rank's data-parallel share of global step ``step``; with context
    parallelism, of its cp rank's two head-tail chunks of each sequence (labels alike)."""
    per_rank = config.global_batch // config.layout.dp
    start = pdims.dp_rank * per_rank
    rows = source.batch(step, range(start, start + per_rank), config.seq_len, config.global_batch)
    tokens = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    if config.layout.cp > 1:
        shard = sequence_shard_of(pdims.group("cp"))
        inputs, labels = shard.shard(inputs), shard.shard(labels)
    return inputs, labels


def peak_flops(config: RunConfig, device: torch.device) -> float | None:
    """Dense bf16 peak of the named GPU spec (never guessed from the device name)."""
    if device.type != "cuda" or not config.gpu:
        return None
    return get_gpu(config.gpu).peak_flops("bf16")


@dataclass
class TrainResult:
    """What a rank returns: every step's record and the summary (the same on every rank)."""

    records: list[StepRecord]
    summary: RunSummary
    parts: ModelParts = field(repr=False)
    pdims: ParallelDims = field(repr=False)
    optimizer: torch.optim.Optimizer | None = field(default=None, repr=False)


MAX_CONSECUTIVE_SKIPS = 5  # --on-nan skip: stop after this many bad steps in a row


def _nonfinite_message(what: str, value: float, step: int, loss: float, lr: float) -> str:
    return (f"{what} is {value} at step {step} (loss {loss:.4g}, lr {lr:.3g}); stopping before the optimizer "
            "step. Lower the learning rate, check the data, or pass --on-nan skip")


def _stop_requested(stop, device: torch.device) -> bool:
    """True on every rank when any rank was asked to stop (SIGTERM); one tiny all-reduce."""
    flag = torch.tensor([1 if stop.is_set() else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def offload_directory(config: RunConfig, rank: int) -> str | None:
    """This rank's fresh directory for ``offload=disk:α`` (under ``--offload-dir`` or the temp dir)."""
    if config.layout.offload <= 0 or config.layout.offload_target != "disk":
        return None
    return tempfile.mkdtemp(prefix=f"plait-offload-rank{rank}-", dir=config.offload_dir)


def offload_summary(records: list[StepRecord], device: torch.device) -> dict:
    """Steady-state activation offload per step, max over ranks: bytes moved out, seconds of
    transfer hidden behind compute and exposed (``plait.run.memory.offload.OffloadStats``)."""
    steady = [r for r in (steady_state(records) or records) if r.offload]
    keys = ("offload_bytes_out", "offload_hidden_s", "offload_exposed_s")
    medians = [statistics.median(r.offload[k] for r in steady) if steady else 0.0 for k in keys]
    values = torch.tensor(medians, dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return {"offload_bytes_per_step": int(values[0]), "offload_hidden_s": float(values[1]),
            "offload_exposed_s": float(values[2])}


def run_training(config: RunConfig, device: torch.device | None = None, stop=None) -> TrainResult:
    """Train from ``config.resume_from`` (or step 0) to ``config.steps``; every rank returns the same records.

    ``stop`` (a threading.Event, set by the worker's SIGTERM handler) ends the run after the
    current step, with a checkpoint when ``config.checkpoint_dir`` is set.
    """
    rank = dist.get_rank()
    device = device or pick_device(config)
    layout = config.layout
    pdims = build_parallel_dims(layout, device.type)
    source = open_tokens(config.data, config.model.vocab, config.seed)
    n_micro = layout.micro_batches(config.global_batch)
    parts = build_model_parts(config.model, pdims, device, config.seed, n_micro, compile_blocks=config.compile,
                              compile_backend=config.compile_backend, offload_dir=offload_directory(config, rank))
    params = parts.parameters()
    optimizer = build_optimizer(params, config.optim)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    is_rank0 = rank == 0
    start_step, events = 0, []
    if config.resume_from:
        load_start = time.perf_counter()
        manifest = read_manifest(Path(config.resume_from))
        start_step = int(manifest["step"])
        saved_model = ModelSpec.from_dict(manifest["run"]["model"])
        if saved_model != config.model:
            raise PlaitError(f"checkpoint {config.resume_from} holds model {saved_model.name}, "
                             f"not {config.model.name}")
        load_checkpoint(config.resume_from, parts, optimizer)
        events.append({"event": "resume", "step": start_step, "checkpoint": config.resume_from,
                       "layout": str(layout), "world_size": layout.world_size, "restart": restart,
                       "load_s": time.perf_counter() - load_start, "time": time.time()})
    if start_step >= config.steps:
        raise PlaitError(f"the checkpoint is at step {start_step} and the run has {config.steps} steps: "
                         "nothing to train; pass a larger --steps")
    checkpointer = None
    if config.checkpoint_dir:
        use_async = config.async_checkpoint if config.async_checkpoint is not None else device.type == "cuda"
        kill_in_save = injected_fault(rank, "kill-in-save")
        checkpointer = Checkpointer(config.checkpoint_dir, config.checkpoint_every, config.keep_checkpoints,
                                    run=config.to_dict(), layout=str(layout), use_async=use_async, device=device,
                                    fault_step=kill_in_save.step if kill_in_save else None)
    peak = peak_flops(config, device)
    log = JsonlLog(config.log if is_rank0 else None, append=start_step > 0 or restart > 0)
    for event in events:
        log.write(event)
    display = Display(config.steps, is_rank0, config.log_every, start_step)
    records: list[StepRecord] = []
    fault = injected_fault(rank, "raise", "kill", "nan")
    skipped_in_a_row, stopped_at = 0, None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        parts.train()
        for step in range(start_step, config.steps):
            start = time.perf_counter()
            if fault and fault.step == step and fault.kind == "raise":
                raise RuntimeError(f"injected fault (PLAIT_INJECT_FAULT) on rank {rank} at step {step}")
            seed_step(config.seed, step, pdims)
            inputs, labels = local_batch(source, config, pdims, step, device)
            lr = lr_at(step, config.steps, config.optim)
            set_lr(optimizer, lr)
            local = forward_backward(parts, pdims, inputs, labels, n_micro)
            if fault and fault.step == step and fault.kind == "nan":
                local = local * float("nan")
            if fault and fault.step == step and fault.kind == "kill":
                kill_self()  # mid-step: gradients computed, optimizer not stepped
            loss = global_mean_loss(local, pdims, device)
            grad_norm = clip_grad_norm(params, config.optim.grad_clip, pdims) if math.isfinite(loss) else loss
            bad = None if math.isfinite(loss) else "loss"
            if bad is None and not math.isfinite(grad_norm):
                bad = "gradient norm"
            skipped = False
            if bad:
                skipped_in_a_row += 1
                if config.on_nan == "stop" or skipped_in_a_row > MAX_CONSECUTIVE_SKIPS:
                    value = loss if bad == "loss" else grad_norm
                    text = _nonfinite_message(bad, value, step, loss, lr)
                    if config.on_nan == "skip":
                        text = f"{MAX_CONSECUTIVE_SKIPS + 1} steps in a row skipped; " + text
                    raise PlaitError(text)
                optimizer.zero_grad(set_to_none=True)
                skipped = True
                display.message(f"step {step}: {bad} is not finite; optimizer step skipped (--on-nan skip)")
            else:
                skipped_in_a_row = 0
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            tokens_per_s = config.tokens_per_step / elapsed
            record = StepRecord(step=step, loss=loss, lr=lr, grad_norm=grad_norm, step_time_s=elapsed,
                                tokens_per_s=tokens_per_s,
                                mfu=mfu(config.model, config.seq_len, tokens_per_s, layout.world_size, peak),
                                offload=parts.offloader.step_stats().to_dict() if parts.offloader else None)
            records.append(record)
            log.write({**record.to_dict(), "time": time.time(), **({"skipped": True} if skipped else {})})
            display.step(record)
            steps_done = step + 1
            if stop is not None and _stop_requested(stop, device):
                stopped_at = steps_done
            if checkpointer is not None:
                if stopped_at is not None or steps_done == config.steps:
                    checkpointer.save(steps_done, parts, optimizer)
                    checkpointer.finish()
                elif checkpointer.due(steps_done, config.steps):
                    checkpointer.save(steps_done, parts, optimizer)
                    log.write({"event": "checkpoint", "step": steps_done, "stall_s": checkpointer.stall_s[-1]})
                else:
                    checkpointer.poll()
            if stopped_at is not None:
                display.message(f"stopped by SIGTERM after step {step}" + (
                    f"; checkpoint {config.checkpoint_dir}/step_{steps_done:08d} saved" if checkpointer
                    else " (no --checkpoint-dir: nothing saved)"))
                break
        display.close()
        summary = _summarize(config, records, pdims, device, peak)
        summary.offload = offload_summary(records, device) if parts.offloader else None
        summary.start_step = start_step
        summary.stopped_early = stopped_at is not None
        if checkpointer is not None:
            summary.checkpoints = checkpointer.saved
            summary.checkpoint_stall_s = max(checkpointer.stall_s, default=None)
        log.write(summary.to_dict())
        display.message(summary.comparison_line())
    finally:
        display.close()
        log.close()
        if parts.offloader is not None:
            parts.offloader.close()
    return TrainResult(records=records, summary=summary, parts=parts, pdims=pdims, optimizer=optimizer)


def _summarize(config: RunConfig, records: list[StepRecord], pdims: ParallelDims, device: torch.device,
               peak: float | None) -> RunSummary:
    step_time = median_step_time(records)
    tokens_per_s = config.tokens_per_step / step_time
    rss = torch.tensor(float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024), device=device)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    peak_memory = None
    if device.type == "cuda":
        gpu_peak = torch.tensor(float(torch.cuda.max_memory_allocated(device)), device=device)
        dist.all_reduce(gpu_peak, op=dist.ReduceOp.MAX)
        peak_memory = int(gpu_peak)
    prediction = config.prediction or {}
    return RunSummary(
        steps=len(records), final_loss=records[-1].loss, step_time_s=step_time, tokens_per_s=tokens_per_s,
        mfu=mfu(config.model, config.seq_len, tokens_per_s, config.layout.world_size, peak),
        peak_memory_bytes=peak_memory, peak_host_rss_bytes=int(rss), device=device.type,
        world_size=config.layout.world_size, layout=str(config.layout),
        predicted_step_time_s=prediction.get("step_time_s") if device.type == "cuda" else None,
        predicted_memory_bytes=prediction.get("allocated_bytes") if device.type == "cuda" else None,
    )
