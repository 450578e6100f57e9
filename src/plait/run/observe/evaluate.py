"""Held-out loss during training: ``--eval-data FILE --eval-every N --eval-steps K``.

**What is measured.** Evaluation ``k`` (k = 0..K-1) reads global batch ``k`` of the eval token
file with the data seed ``EVAL_SEED`` (``plait.run.data.tokens``: a row is a pure function of
the seed, the batch index, the position and the sizes), so every evaluation reads the same
``K·global_batch`` windows of ``seq_len + 1`` tokens, whatever the layout, the process count or
the training seed. When the file holds fewer windows than that, the windows repeat (the next
epoch's order). The eval loss is the mean token loss over the ``K·global_batch·seq_len`` label
tokens: each batch has the same number of tokens, so it is the mean of the K global-batch means.

**How.** Each rank computes its data-parallel share of each batch exactly as a training step
does (the same micro-batches, tensor/context/sequence parallelism, fused loss and precision),
forward only: under ``torch.no_grad()``, with the model parts in eval mode (no dropout), and
with a pipeline through the schedule's forward-only ``eval`` (every schedule). The loss owners'
sums are added with one all-reduce and divided by ``dp·cp·K``, as the training loss is.
Evaluating changes no weight, optimizer state or random stream the training reads (every
training step re-seeds its own), so a run with evaluation trains exactly as one without.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from plait.run.config import EVAL_SEED
from plait.run.data.tokens import open_tokens
from plait.run.parallel.mesh import ParallelDims
from plait.run.parallel.parallelize import ModelParts
from plait.run.step import batch_of, compute_context, loss_context, pipeline_loss


def _full(loss: torch.Tensor) -> torch.Tensor:
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss


def forward_loss(parts: ModelParts, pdims: ParallelDims, inputs: torch.Tensor, labels: torch.Tensor,
                 n_microbatches: int, documents: torch.Tensor | None = None) -> torch.Tensor | None:
    """This rank's mean token loss of one batch, forward only (call under ``torch.no_grad()``); None
    on ranks that compute no loss (pipeline stages before the last). ``documents``: --doc-mask's
    document ids of the rows (``plait.run.step.batch_of``)."""
    if parts.schedule is not None:
        loss = pipeline_loss(parts, pdims, inputs, labels, "eval", documents)
        return None if loss is None else loss.float()
    model = parts.chunks[0]
    positions = parts.token_positions(inputs.shape[1], inputs.device)
    total = torch.zeros((), device=inputs.device)
    docs = [None] * n_microbatches if documents is None else documents.chunk(n_microbatches)
    with loss_context(pdims), compute_context(parts, inputs.device):
        for x, y, d in zip(inputs.chunk(n_microbatches), labels.chunk(n_microbatches), docs):
            extra = {} if d is None else {"documents": d}
            total += _full(parts.loss_fn(model(x, positions=positions, **extra), y)).float() / n_microbatches
    return total


class Evaluator:
    """The eval batches of one run and the collective that computes their loss (every rank)."""

    def __init__(self, setup):
        """``setup``: the rank's ``plait.run.step.StepSetup``; its config's ``eval.data`` must be set."""
        config = setup.config
        job = config.job
        self.setup = setup
        self.batches = config.eval.steps
        self.source = open_tokens(config.eval.data, job.model.vocab, EVAL_SEED, seq_len=job.seq_len,
                                  model_name=job.model.name)
        self.tokens = self.batches * job.tokens_per_step  # label tokens per evaluation
        self.last: float | None = None  # the latest eval loss

    def loss(self) -> float:
        """The eval loss (mean token loss of the eval batches), the same value on every rank; a collective."""
        setup = self.setup
        parts, pdims, device = setup.parts, setup.pdims, setup.device
        training = parts.chunks[0].training
        total = torch.zeros((), device=device, dtype=torch.float32)
        parts.train(False)
        try:
            with torch.no_grad():
                for k in range(self.batches):
                    inputs, labels, documents = batch_of(self.source, setup.config.job, pdims, k, device)
                    local = forward_loss(parts, pdims, inputs, labels, setup.n_micro, documents)
                    if local is not None and pdims.loss_owner:
                        total += local
        finally:
            parts.train(training)
            parts.reshard()  # ZeRO units that keep their parameters gathered after a forward
        dist.all_reduce(total)
        return float(total) / (pdims.grad_sync_size * self.batches)

    def record(self, steps_done: int) -> dict:
        """Evaluate now (a collective) and return the JSONL line: ``step`` (optimizer steps done, the
        console's count), ``eval_loss``, ``eval_tokens`` (label tokens read) and ``eval_s`` (seconds)."""
        start = time.perf_counter()
        value = self.last = self.loss()
        return {"step": steps_done, "eval_loss": value, "eval_tokens": self.tokens,
                "eval_s": time.perf_counter() - start, "time": time.time()}
