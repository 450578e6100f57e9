"""The loss's memory at its peak for the PyTorch stacks (``CostParams.loss_peak_bytes``, plait's and
torchtitan's): 12 bytes per logit, counted.

Both compute ``F.cross_entropy`` on the fp32 copy of the bf16 logits (plait's ``token_loss``,
torchtitan's ``cross_entropy_loss``). A dispatch mode follows every logit-shaped tensor (N tokens x V
vocabulary entries) that the forward and the backward make, and the most bytes of them alive at once:
the forward holds the bf16 logits, their fp32 copy and the log-softmax (10 bytes, the bf16 logits and
the fp32 copy gone once the loss is taken); the backward the saved log-softmax, nll_loss's dense fp32
gradient and the log-softmax's fp32 input gradient (12 bytes), which is the peak. The GPU proof's eager
sweep and torchtitan's reported memory both ran above a 10-byte count (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import weakref

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from plait.plan.memory import estimate_memory  # noqa: E402
from plait.plan.params import DEFAULT_PARAMS, params_for_stack  # noqa: E402
from plait.run.loss import token_loss  # noqa: E402
from plait.spec.hardware import cluster_for_gpu, get_gpu  # noqa: E402
from plait.spec.layout import JobSpec, Layout  # noqa: E402
from plait.spec.models import get_model  # noqa: E402
from plait.spec.stack import get_stack  # noqa: E402

TOKENS, VOCAB, HIDDEN = 64, 1000, 32  # the vocabulary unlike every other width: logit-shaped is unambiguous


class LogitTensors(TorchDispatchMode):
    """The most bytes of (TOKENS·VOCAB)-element storages alive at once while it runs."""

    def __init__(self):
        super().__init__()
        self.made: list[tuple[weakref.ref, int, int]] = []
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.numel() == TOKENS * VOCAB:
                storage = tensor.untyped_storage()
                self.made.append((weakref.ref(tensor), storage.data_ptr(), storage.nbytes()))
        alive = {ptr: n for ref, ptr, n in self.made if ref() is not None}  # views (detach) share a storage
        self.peak = max(self.peak, sum(alive.values()))
        return out


@pytest.mark.parametrize("dtype,element_bytes", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_the_loss_keeps_12_bytes_per_logit_at_its_peak(dtype, element_bytes):
    """bf16 logits (a GPU under autocast) and fp32 ones (a CPU): the peak is the backward's three fp32
    tensors either way, and the planner's logits item is that per logit (``rank_memory``)."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, TOKENS, HIDDEN, generator=generator, requires_grad=True)
    head = torch.randn(VOCAB, HIDDEN, generator=generator, requires_grad=True)
    labels = torch.randint(0, VOCAB, (1, TOKENS), generator=generator)
    mode = LogitTensors()
    with mode:
        logits = F.linear(hidden, head).to(dtype)  # what the head gives (under autocast on a GPU)
        loss = token_loss(logits, labels)
        del logits
        loss.backward()
    counted = mode.peak / (TOKENS * VOCAB)
    assert counted == DEFAULT_PARAMS.loss_peak_bytes == 12
    for stack in ("plait", "torchtitan"):  # the PyTorch stacks keep the default
        assert params_for_stack(get_stack(stack)).loss_peak_bytes == counted
    model = dataclasses.replace(get_model("tiny"), vocab=VOCAB)
    gpu = dataclasses.replace(get_gpu("h100-sxm"), element_bytes=element_bytes)
    cluster = dataclasses.replace(cluster_for_gpu("h100-sxm", 1), gpu=gpu)
    layout, job = Layout(dp=1, mbs=1), JobSpec(global_batch=1, seq_len=TOKENS)
    assert estimate_memory(model, cluster, job, layout).logits == counted * TOKENS * VOCAB
