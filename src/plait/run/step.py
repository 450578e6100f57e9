"""Forward and backward of one optimizer step on one rank, with or without a pipeline.

Loss normalization: every micro-batch holds the same number of tokens, so the mean token loss
of the rank's batch is the mean of the micro-batch means. Without a pipeline each micro-batch's
mean loss is divided by the number of micro-batches before its backward; the pipeline schedule
does the same division on the gradients (``scale_grads``). Data parallelism then averages the
gradients over dp ranks: the step's gradient is that of the mean token loss of the global batch.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from plait.run.parallel.mesh import ParallelDims
from plait.run.parallel.parallelize import ModelParts, token_loss


def loss_context(pdims: ParallelDims):
    """``loss_parallel()`` with tensor parallelism (vocabulary-sharded cross entropy), else nothing."""
    return loss_parallel() if pdims.layout.tp > 1 else contextlib.nullcontext()


def compute_context(parts: ModelParts, device: torch.device):
    """bf16 autocast on GPU when FSDP's mixed-precision policy does not already cast.

    Weights, gradients and optimizer states stay fp32 (the master copy); matmuls and attention
    run in bf16; data-parallel reductions are fp32. On CPU everything is fp32.
    """
    if device.type == "cuda" and not parts.fsdp:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _gradient_sync(module: torch.nn.Module, enabled: bool):
    """DDP: skip the all-reduce on all but the last micro-batch (gradients are full anyway).

    FSDP reduce-scatters after every micro-batch, so that only sharded gradients are kept
    between micro-batches (skipping it would hold the full fp32 gradient of the whole model).
    """
    if isinstance(module, DistributedDataParallel) and not enabled:
        return module.no_sync()
    return contextlib.nullcontext()


def forward_backward(parts: ModelParts, pdims: ParallelDims, inputs: torch.Tensor, labels: torch.Tensor,
                     n_microbatches: int) -> torch.Tensor | None:
    """Accumulate this rank's gradients for one step; returns its mean token loss (a 0-d tensor)
    on ranks that compute the loss (the last pipeline stage) and None elsewhere."""
    if parts.schedule is not None:
        return _pipelined(parts, pdims, inputs, labels)
    model = parts.chunks[0]
    total = torch.zeros((), device=inputs.device)
    with loss_context(pdims), compute_context(parts, inputs.device):
        for index, (x, y) in enumerate(zip(inputs.chunk(n_microbatches), labels.chunk(n_microbatches))):
            with _gradient_sync(model, index == n_microbatches - 1):
                loss = token_loss(model(x), y) / n_microbatches
                loss.backward()
            total += loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()
    return total


def _pipelined(parts: ModelParts, pdims: ParallelDims, inputs: torch.Tensor, labels: torch.Tensor):
    layout = pdims.layout
    n_stages = layout.pp * layout.vpp
    first, last = 0 in parts.stage_ids, n_stages - 1 in parts.stage_ids
    losses: list[torch.Tensor] = []
    kwargs = {"target": labels, "losses": losses} if last else {}
    with loss_context(pdims), compute_context(parts, inputs.device):
        if first:
            parts.schedule.step(inputs, **kwargs)
        else:
            parts.schedule.step(**kwargs)
    if not last:
        return None
    values = [loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach() for loss in losses]
    return torch.stack(values).mean()


def global_mean_loss(local_loss: torch.Tensor | None, pdims: ParallelDims, device: torch.device) -> float:
    """The global batch's mean token loss, the same on every rank (one all-reduce)."""
    value = torch.zeros((), device=device, dtype=torch.float32)
    if local_loss is not None and pdims.loss_owner:
        value += local_loss.float()
    dist.all_reduce(value)
    return float(value) / pdims.grad_sync_size  # dp·cp loss owners, each with an equal share of tokens
