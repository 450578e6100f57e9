"""Plain tensor parallelism repeats on every rank the element-wise work outside its GEMMs; sequence
parallelism shards it. For Megatron's fused kernels that part is its two LayerNorms and two
bias-dropout-adds (counted in bytes here, Korthikanti et al. 2022 Table 4); for plait's eager blocks
half of the element-wise passes. The difference is built from the bytes, never from the module's constant."""

from __future__ import annotations

import pytest

from plait.plan.kernels import layer_times
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import get_gpu
from plait.spec.models import MODELS


# Megatron's fused kernels outside the TP GEMMs, in passes of 2 bytes per element of h: two LayerNorms
# (read x, write y) and two bias-dropout-adds (read the input and the residual, write the sum and a
# 1-byte mask)
MEGATRON_OUTSIDE = 2 * (2 + 2) / 2 + 2 * (2 + 2 + 2 + 1) / 2


@pytest.mark.parametrize("runtime, outside", [
    ("megatron", MEGATRON_OUTSIDE),
    ("megatron-core", MEGATRON_OUTSIDE),
    ("torch", DEFAULT_PARAMS.elementwise_passes / 2),
])
def test_sequence_parallelism_shards_only_the_work_outside_the_tp_gemms(runtime, outside):
    gpu, model = get_gpu("a100-80g"), MODELS["megatron-18b"]
    seq, mbs, tp = 2048, 4, 8
    tokens = seq * mbs

    def elementwise(sp: bool) -> float:
        return layer_times(model, gpu, DEFAULT_PARAMS, tokens, seq, tp, 1, sp, "eager", "bf16",
                           runtime=runtime).elementwise_fwd

    pass_bytes = gpu.element_bytes * tokens * model.hidden  # one pass over s·b·h
    repeated = outside * pass_bytes * (1 - 1 / tp) / (gpu.hbm_bandwidth * gpu.memory_efficiency)
    assert elementwise(False) - elementwise(True) == pytest.approx(repeated, rel=1e-9)

