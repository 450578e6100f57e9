"""One optimizer step on one rank (``train_step``): seed, batch, forward and backward with or
without a pipeline, global loss, gradient clipping, the --on-nan policy, the optimizer step.

Nothing here reads a device value on the host unless the step is a sync step: the loss, the
SIGTERM flag and the gradient norm stay on the device (``plait.run.pending``).

Loss normalization: every micro-batch holds the same number of tokens, so the mean token loss
of the rank's batch is the mean of the micro-batch means. Without a pipeline each micro-batch's
mean loss is divided by the number of micro-batches before its backward; the pipeline schedule
does the same division on the gradients (``scale_grads``). Data parallelism then averages the
gradients over dp ranks: the step's gradient is that of the mean token loss of the global batch.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from plait.run.config import RunConfig, TrainJob
from plait.run.data.prefetch import to_device
from plait.run.faults import FaultPlan
from plait.run.modules.documents import document_ids
from plait.run.observe.router import local_health, summarize
from plait.run.optim import clip_grad_norm, lr_at, set_lr
from plait.run.parallel.context.shard import sequence_shard_of
from plait.run.parallel.expert import balance_routers
from plait.run.parallel.mesh import ParallelDims
from plait.run.parallel.parallelize import ModelParts
from plait.run.pending import MAX_CONSECUTIVE_SKIPS, NonFinitePolicy, PendingStep, StepLedger  # noqa: F401 (re-exported)


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


def _gradient_sync(module: torch.nn.Module, enabled: bool, zero: int):
    """Gradient reduction of one micro-batch (``enabled``: it is the step's last).

    DDP skips the all-reduce on all but the last micro-batch (gradients are full anyway). FSDP2
    under zero=1 (ZeRO-1: full gradients, sharded optimizer states) does the same: all but the
    last micro-batch accumulate unsharded gradients and keep the parameters gathered, so a step
    gathers each unit once and reduce-scatters it once. Under zero=2 and 3 FSDP2 reduce-scatters
    after every micro-batch (and gathers again for the next), so that only sharded gradients are
    kept between micro-batches. (Pipeline stages are left to torch's schedule, which reduces once
    per step under any zero.)
    """
    if isinstance(module, DistributedDataParallel) and not enabled:
        return module.no_sync()
    if zero == 1 and isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(enabled)
        module.set_reshard_after_backward(enabled)
    return contextlib.nullcontext()


def forward_backward(parts: ModelParts, pdims: ParallelDims, inputs: torch.Tensor, labels: torch.Tensor,
                     n_microbatches: int, documents: torch.Tensor | None = None) -> torch.Tensor | None:
    """Accumulate this rank's gradients for one step; returns its mean token loss (a 0-d tensor)
    on ranks that compute the loss (the last pipeline stage) and None elsewhere. ``documents``
    (--doc-mask): the document ids of the rows' whole sequences (``batch_of``)."""
    if parts.schedule is not None:
        return pipeline_loss(parts, pdims, inputs, labels, "step", documents)
    model = parts.chunks[0]
    positions = parts.token_positions(inputs.shape[1], inputs.device)
    total = torch.zeros((), device=inputs.device)
    docs = [None] * n_microbatches if documents is None else documents.chunk(n_microbatches)
    with loss_context(pdims), compute_context(parts, inputs.device):
        for index, (x, y) in enumerate(zip(inputs.chunk(n_microbatches), labels.chunk(n_microbatches))):
            with _gradient_sync(model, index == n_microbatches - 1, pdims.layout.zero):
                extra = {} if docs[index] is None else {"documents": docs[index]}
                loss = parts.loss_fn(model(x, positions=positions, **extra), y) / n_microbatches
                loss.backward()
            total += loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()
    return total


def pipeline_loss(parts: ModelParts, pdims: ParallelDims, inputs: torch.Tensor, labels: torch.Tensor,
                  call: str, documents: torch.Tensor | None = None) -> torch.Tensor | None:
    """Run the pipeline schedule's ``call`` ("step": forward and backward; "eval": forward only) on
    one batch; the mean of the micro-batch losses on the rank holding the last stage, else None.
    ``documents`` (--doc-mask) is a keyword of the step, which torch splits into micro-batches and
    passes to every stage (each stage masks its own attention and takes its own positions)."""
    layout = pdims.layout
    n_stages = layout.pp * layout.vpp
    first, last = 0 in parts.stage_ids, n_stages - 1 in parts.stage_ids
    losses: list[torch.Tensor] = []
    kwargs = {"target": labels, "losses": losses} if last else {}
    if documents is not None:
        kwargs["documents"] = documents
    run = getattr(parts.schedule, call)
    if call == "step" and "return_outputs" in inspect.signature(run).parameters:
        # the losses are all plait reads; kept outputs would hold every micro-batch's logits on
        # the last stage until the step ends (torch.distributed.pipelining's output chunks)
        kwargs["return_outputs"] = False
    with loss_context(pdims), compute_context(parts, inputs.device):
        if first:
            run(inputs, **kwargs)
        else:
            run(**kwargs)
    if not last:
        return None
    values = [loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach() for loss in losses]
    return torch.stack(values).mean()


def reduce_loss_and_stop(local_loss: torch.Tensor | None, pdims: ParallelDims, device: torch.device,
                         stop: bool, extra: torch.Tensor | None = None) -> torch.Tensor:
    """[the global batch's mean token loss, the number of ranks asking to stop, *``extra`` summed over
    every rank], the same on every rank: one all-reduce of fp32 values, left on the device (no host
    read). ``extra``: the MoE routers' figures (``plait.run.observe.router.local_health``)."""
    value = torch.zeros(2 + (0 if extra is None else extra.numel()), device=device, dtype=torch.float32)
    if local_loss is not None and pdims.loss_owner:
        value[0] += local_loss.float()
    if stop:
        value[1].fill_(1.0)
    if extra is not None:
        value[2:] = extra
    dist.all_reduce(value)
    value[0].div_(pdims.grad_sync_size)  # dp·cp loss owners, each with an equal share of tokens
    return value


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


def batch_of(source, job: TrainJob, pdims: ParallelDims, step: int, device: torch.device):
    """(inputs, labels, documents) of this rank's data-parallel share of global step ``step``; with
    context parallelism, inputs and labels of its cp rank's two head-tail chunks of each sequence.
    ``documents`` (--doc-mask, else None): the document ids (batch, seq) of the whole rows' inputs
    (``plait.run.modules.documents``), which every cp rank keeps whole."""
    per_rank = job.global_batch // job.layout.dp
    start = pdims.dp_rank * per_rank
    rows = source.batch(step, range(start, start + per_rank), job.seq_len, job.global_batch)
    tokens = to_device(rows, device)  # non-blocking from the prefetcher's pinned buffer on GPU
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    documents = document_ids(inputs, job.eos_id) if job.doc_mask else None
    if job.layout.cp > 1:
        shard = sequence_shard_of(pdims.group("cp"))
        inputs, labels = shard.shard(inputs), shard.shard(labels)
    return inputs, labels, documents


def local_batch(source, job: TrainJob, pdims: ParallelDims, step: int, device: torch.device):
    """(inputs, labels) of ``batch_of``."""
    return batch_of(source, job, pdims, step, device)[:2]


@dataclass
class StepSetup:
    """What every training step of one rank uses, fixed for the whole run."""

    config: RunConfig
    pdims: ParallelDims
    parts: ModelParts
    optimizer: torch.optim.Optimizer
    source: object  # the token source (``plait.run.data.tokens.open_tokens``)
    device: torch.device
    n_micro: int  # micro-batches per step on each data-parallel rank
    peak_flops: float | None  # the GPU's dense bf16 peak (FLOP/s) for MFU; None on CPU or an unknown GPU
    faults: FaultPlan


def train_step(setup: StepSetup, step: int, ledger: StepLedger, stop=None, sync: bool = True) -> PendingStep:
    """Optimizer step ``step`` (0-based) on this rank, a collective; returns its pending numbers.

    ``stop`` (the SIGTERM request) is polled once and rides in the loss all-reduce. ``sync``:
    read this step's numbers (and every step still pending in ``ledger``) on the host before the
    optimizer step and apply --on-nan to them; otherwise nothing is read on the host here.
    """
    config, pdims, device = setup.config, setup.pdims, setup.device
    job = config.job
    pending = PendingStep(step=step, lr=lr_at(step, job.steps, config.optim), values=None,
                          start=ledger.timer.mark())
    setup.faults.at(step, "before-step")
    seed_step(job.seed, step, pdims)
    inputs, labels, documents = batch_of(setup.source, job, pdims, step, device)
    set_lr(setup.optimizer, pending.lr)
    local = forward_backward(setup.parts, pdims, inputs, labels, setup.n_micro, documents)
    setup.parts.sync_expert_gradients()
    local = setup.faults.at(step, "after-backward", local)
    health = local_health(setup.parts.chunks, job.model, device)  # MoE: router figures, None otherwise
    reduced = reduce_loss_and_stop(local, pdims, device, stop is not None and stop.is_set(), health)
    grad_norm = clip_grad_norm(setup.parts.parameters(), config.optim.grad_clip, pdims)
    routers = [summarize(reduced[2:], job.model, pdims)] if health is not None else []
    pending.values = torch.cat([reduced[:2], grad_norm.reshape(1).float(), *routers])
    if sync:
        ledger.read(step, pending)
    if pending.skipped is None:
        setup.optimizer.step()
    balance_routers(setup.parts.chunks, pdims, update=pending.skipped is None)  # MoE: sigmoid routers' biases
    setup.optimizer.zero_grad(set_to_none=True)
    pending.end = ledger.timer.mark()
    pending.wall_time = time.time()
    offloader = setup.parts.offloader
    if offloader is not None and device.type == "cuda":
        torch.cuda.synchronize(device)  # its counters are CUDA events on its own streams (a sync step anyway)
    pending.offload = offloader.step_stats().to_dict() if offloader else None
    return pending
