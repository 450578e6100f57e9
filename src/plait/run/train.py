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
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from plait.errors import PlaitError
from plait.run.config import RunConfig
from plait.run.data import open_tokens
from plait.run.mesh import ParallelDims, build_parallel_dims
from plait.run.metrics import (
    Display,
    JsonlLog,
    RunSummary,
    StepRecord,
    median_step_time,
    mfu,
)
from plait.run.optim import build_optimizer, clip_grad_norm, lr_at, set_lr
from plait.run.parallelize import ModelParts, build_model_parts
from plait.run.step import forward_backward, global_mean_loss
from plait.spec.hardware import get_gpu


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


def seed_everything(seed: int, pdims: ParallelDims) -> None:
    """RNG streams (dropout) from (seed, dp rank, pp rank); weights use their own seeds.

    Tensor-parallel ranks share a stream: dropout on activations they all hold (the residual
    stream without sequence parallelism) must drop the same elements on every one of them.
    """
    stream = (seed * 1_000_003 + pdims.dp_rank) * 1_009 + pdims.pp_rank
    torch.manual_seed(stream)
    np.random.seed(stream % 2**32)


def local_batch(source, config: RunConfig, pdims: ParallelDims, step: int, device: torch.device):
    """(inputs, labels) of this rank's data-parallel share of global step ``step``."""
    per_rank = config.global_batch // config.layout.dp
    start = pdims.dp_rank * per_rank
    rows = source.batch(step, range(start, start + per_rank), config.seq_len, config.global_batch)
    tokens = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def injected_fault(rank: int) -> int | None:
    """The step at which this rank must fail, from ``PLAIT_INJECT_FAULT="rank=R,step=S"`` (tests)."""
    spec = os.environ.get("PLAIT_INJECT_FAULT")
    if not spec:
        return None
    fields = dict(item.split("=", 1) for item in spec.split(","))
    return int(fields["step"]) if int(fields["rank"]) == rank else None


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


def run_training(config: RunConfig, device: torch.device | None = None) -> TrainResult:
    """Train ``config.steps`` steps on this rank; every rank returns the same records."""
    rank = dist.get_rank()
    device = device or pick_device(config)
    layout = config.layout
    pdims = build_parallel_dims(layout, device.type)
    seed_everything(config.seed, pdims)
    source = open_tokens(config.data, config.model.vocab, config.seed)
    n_micro = layout.micro_batches(config.global_batch)
    parts = build_model_parts(config.model, pdims, device, config.seed, n_micro, compile_blocks=config.compile,
                              compile_backend=config.compile_backend)
    params = parts.parameters()
    optimizer = build_optimizer(params, config.optim)
    peak = peak_flops(config, device)
    is_rank0 = rank == 0
    log = JsonlLog(config.log if is_rank0 else None)
    display = Display(config.steps, is_rank0, config.log_every)
    records: list[StepRecord] = []
    fault_step = injected_fault(rank)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        parts.train()
        for step in range(config.steps):
            start = time.perf_counter()
            if step == fault_step:
                raise RuntimeError(f"injected fault (PLAIT_INJECT_FAULT) on rank {rank} at step {step}")
            inputs, labels = local_batch(source, config, pdims, step, device)
            lr = lr_at(step, config.steps, config.optim)
            set_lr(optimizer, lr)
            local = forward_backward(parts, pdims, inputs, labels, n_micro)
            loss = global_mean_loss(local, pdims, device)
            if not math.isfinite(loss):
                raise PlaitError(f"loss is {loss} at step {step} (lr {lr:.3g}); stopping before the "
                                 "optimizer step. Lower the learning rate or check the data")
            grad_norm = clip_grad_norm(params, config.optim.grad_clip, pdims)
            if not math.isfinite(grad_norm):
                raise PlaitError(f"gradient norm is {grad_norm} at step {step} (loss {loss:.4g}, lr {lr:.3g}); "
                                 "stopping before the optimizer step. Lower the learning rate or check the data")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            tokens_per_s = config.tokens_per_step / elapsed
            record = StepRecord(step=step, loss=loss, lr=lr, grad_norm=grad_norm, step_time_s=elapsed,
                                tokens_per_s=tokens_per_s,
                                mfu=mfu(config.model, config.seq_len, tokens_per_s, layout.world_size, peak))
            records.append(record)
            log.write(record.to_dict())
            display.step(record)
        display.close()
        summary = _summarize(config, records, pdims, device, peak)
        log.write(summary.to_dict())
        display.message(summary.comparison_line())
    finally:
        display.close()
        log.close()
    return TrainResult(records=records, summary=summary, parts=parts, pdims=pdims)


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
