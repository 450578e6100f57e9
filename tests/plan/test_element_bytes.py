"""The planner's memory in the device's compute dtype (``GpuSpec.element_bytes``): bf16 (2, every
GPU preset) keeps ZeRO's accounting exactly; fp32 (4, plait's runtime on a CPU) prices what that
runtime allocates (``plait.plan.states``, ``plait.plan.activations``)."""

from __future__ import annotations

import dataclasses

from plait.plan.memory import estimate_memory
from plait.plan.states import ddp_accumulation_bytes, gradients_at_peak, sharded_states
from plait.spec.hardware import cluster_for_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

P = 1000.0  # parameters


def test_bf16_states_are_zero_accounting_and_fp32_has_no_master_copy():
    layout = Layout()
    assert sharded_states(P, layout, 1, 0.0) == (2 * P, 2 * P, 12 * P, 0.0, 0.0)
    assert sharded_states(P, layout, 1, 0.0, element_bytes=4) == (4 * P, 4 * P, 8 * P, 0.0, 0.0)
    zero3 = Layout(dp=2, zero=3)
    weights, grads, optim, buffers, _ = sharded_states(P, zero3, 2, 100.0, element_bytes=4)
    assert (weights, grads, optim, buffers) == (2 * P, 2 * P, 4 * P, 3 * 4 * 100.0)  # gathered in fp32


def test_ddp_second_gradient_copy_only_when_accumulating_in_fp32():
    ddp = Layout(dp=2, mbs=1)
    assert ddp_accumulation_bytes(P, ddp, 4, 4) == 4 * P
    assert ddp_accumulation_bytes(P, ddp, 1, 4) == 0.0  # one micro-batch: gradients are bucket views
    assert ddp_accumulation_bytes(P, ddp, 4, 2) == 0.0  # bf16: comm_buffer_bytes stands for the buckets
    assert ddp_accumulation_bytes(P, Layout(dp=2, zero=2), 4, 4) == 0.0  # FSDP, not DDP
    assert ddp_accumulation_bytes(P, Layout(dp=2, tp=2), 4, 4) == 0.0  # FSDP replicate with tp


def test_gradients_at_peak():
    alone = Layout()
    assert gradients_at_peak(4 * P, alone, 1, 4, dynamic=3 * P) == P  # only what exceeds the activations
    assert gradients_at_peak(4 * P, alone, 1, 4, dynamic=10 * P) == 0.0
    assert gradients_at_peak(4 * P, alone, 2, 4, dynamic=10 * P) == 4 * P  # earlier micro-batches' gradients
    assert gradients_at_peak(4 * P, Layout(dp=2), 1, 4, dynamic=10 * P) == 4 * P  # DDP buckets stay
    assert gradients_at_peak(2 * P, alone, 1, 2, dynamic=10 * P) == 2 * P  # bf16: unchanged


def test_gpu_memory_unchanged_and_fp32_doubles_the_compute_dtype_items():
    model, job = get_model("tiny"), JobSpec(global_batch=8, seq_len=128)
    cluster = cluster_for_gpu("h100-sxm", 2)
    fp32 = dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu, element_bytes=4.0))
    layout = Layout(dp=2, mbs=4)
    bf16_memory = estimate_memory(model, cluster, job, layout)
    assert bf16_memory == estimate_memory(model, dataclasses.replace(
        cluster, gpu=dataclasses.replace(cluster.gpu, element_bytes=2.0)), job, layout)
    fp32_memory = estimate_memory(model, fp32, job, layout)
    assert fp32_memory.embedding_activations == 2 * bf16_memory.embedding_activations
    assert fp32_memory.weights == 2 * bf16_memory.weights and fp32_memory.optimizer == bf16_memory.optimizer * 8 / 12
    # logits: PyTorch's cross entropy keeps fp32 tensors only at its peak (4 + 4 + 4), in either dtype
    # (tests/plan/test_loss_peak.py counts both)
    assert fp32_memory.logits == bf16_memory.logits
