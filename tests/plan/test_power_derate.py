"""A power-capped part (the 500 W H100 of Meta's Grand Teton) runs every tensor-core rate at its
derate: bf16 and attention through its preset's efficiencies, fp8 and a stack's attention through
``GpuSpec.power_derate`` (the number is declared once, ``H100_500W_DERATE``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plait.errors import PlaitError
from plait.plan.kernels import gemm_time
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import GPUS, H100_500W_DERATE
from plait.spec.stack import get_stack


def test_the_500w_preset_is_the_h100_derated():
    full, capped = GPUS["h100-sxm"], GPUS["h100-96g-500w"]
    assert full.power_derate == 1.0 and capped.power_derate == H100_500W_DERATE == 0.85
    assert capped.gemm_efficiency == pytest.approx(full.gemm_efficiency * H100_500W_DERATE, abs=0.005)
    assert capped.attention_efficiency == pytest.approx(full.attention_efficiency * H100_500W_DERATE, abs=0.005)
    assert capped.fp8_flops == full.fp8_flops  # the datasheet peak; the cap is in the derate


def test_fp8_gemms_run_at_the_derate_and_the_default_is_a_full_power_parts():
    full = GPUS["h100-sxm"]
    capped = replace(full, name="h100-capped", power_derate=H100_500W_DERATE)  # nothing else differs
    m = k = n = 8192.0  # compute-bound: 2·m·k·n FLOPs over 3·m·k bytes
    flops = 2 * m * k * n
    times = [gemm_time(gpu, DEFAULT_PARAMS, m, k, n, "fp8") - gpu.kernel_overhead for gpu in (full, capped)]
    rate = full.fp8_flops * DEFAULT_PARAMS.fp8_gemm_efficiency
    assert times[0] == pytest.approx((flops + DEFAULT_PARAMS.gemm_half_flops) / rate)
    assert times[1] == pytest.approx(times[0] / H100_500W_DERATE)
    # torchao's float8 rate chosen on torchtitan's 500 W runs (0.5 of the fp8 peak) is where the default lands there
    assert DEFAULT_PARAMS.fp8_gemm_efficiency * H100_500W_DERATE == pytest.approx(0.5)
    bf16 = [gemm_time(gpu, DEFAULT_PARAMS, m, k, n) for gpu in (full, capped)]
    assert bf16[0] == bf16[1]  # bf16 is derated through the preset's own gemm_efficiency, not twice


def test_a_stacks_attention_efficiency_is_derated_on_a_capped_part():
    stack = get_stack("megatron-core")
    full, capped = stack.gpu(GPUS["h100-sxm"]), stack.gpu(GPUS["h100-96g-500w"])
    assert full.attention_efficiency == 0.5
    assert capped.attention_efficiency == pytest.approx(0.5 * H100_500W_DERATE)


@pytest.mark.parametrize("derate", [0.0, 1.2, -0.1])
def test_a_derate_outside_0_1_is_refused(derate):
    with pytest.raises(PlaitError, match="power_derate"):
        replace(GPUS["h100-sxm"], power_derate=derate)
