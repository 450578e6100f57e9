"""Eager attention with dropout moves, per element of the s×s probabilities, what the dropout op reads
and writes (2 + 2 + a 1-byte mask forward, 2 + 1 + 2 backward) on top of the softmax's; the GEMMs are
the same. Built from the bytes, never from the module's constant."""

from __future__ import annotations

import dataclasses

import pytest

from plait.plan.kernels import layer_times
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import get_gpu
from plait.spec.models import MODELS


@pytest.mark.parametrize("runtime", ["megatron", "torch"])
def test_dropout_adds_its_own_bytes_to_eager_attention(runtime):
    gpu = get_gpu("a100-80g")
    base = dataclasses.replace(MODELS["megatron-1.7b"], dropout=False)
    seq, mbs, tp = 2048, 4, 2
    tokens = seq * mbs
    args = (gpu, DEFAULT_PARAMS, tokens, seq, tp, 1, False, "eager", "bf16")
    plain = layer_times(base, *args, runtime=runtime)
    dropped = layer_times(dataclasses.replace(base, dropout=True), *args, runtime=runtime)
    elements = mbs * base.n_heads / tp * seq * seq  # probabilities on this rank
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
    forward = (2 + 2 + 1) * elements / bandwidth   # read the probabilities, write the output and the mask
    backward = (2 + 1 + 2) * elements / bandwidth  # read the gradient and the mask, write the gradient
    assert dropped.attn_fwd - plain.attn_fwd == pytest.approx(forward, rel=1e-9)
    assert dropped.attn_bwd - plain.attn_bwd == pytest.approx(backward, rel=1e-9)
    assert dropped.gemm_fwd == plain.gemm_fwd

