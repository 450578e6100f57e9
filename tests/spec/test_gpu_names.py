"""GPU names as published sources write them map to presets by explicit rules (plait.spec.gpu_names)."""

import pytest

from plait.errors import PlaitError
from plait.spec.hardware import DEFAULT_CLUSTER_FOR_GPU, GPUS, get_gpu

NAMES = [
    ("H100 80GB HBM3", "h100-sxm"),
    ("H100 SXM5", "h100-sxm"),
    ("NVIDIA H100-SXM5-80GB", "h100-sxm"),
    ("h100_80gb (as given)", "h100-sxm"),
    ("h100-sxm (DGX-H100)", "h100-sxm"),
    ("h100 (96GB HBM2e, 500W)", "h100-96g-500w"),
    ("h100 (95GB HBM2e, lower-TDP SXM variant)", "h100-96g-500w"),
    ("H100 NVL", "h100-nvl"),
    ("H100 PCIe", "h100-pcie"),
    ("H800", "h800"),
    ("A100-SXM4-40GB", "a100-40g"),
    ("a100-40g", "a100-40g"),
    ("A100 80GB PCIe", "a100-80g-pcie"),
    ("A100-SXM4-80GB", "a100-80g"),
    ("a100", "a100-80g"),
    ("A800", "a800"),
    ("H200", "h200"),
    ("B200", "b200"),
    ("b200 (DGX-B200)", "b200"),
    ("GB200", "gb200"),
    ("gb200 (DGX-GB200)", "gb200"),
    ("GB300", "gb300"),
    ("gb300 (DGX-GB300)", "gb300"),
    ("MI300X", "mi300x"),
    ("AMD Instinct MI250X", "mi250x"),
    ("V100-SXM2-32GB", "v100-32g"),
    ("Tesla V100 16GB", "v100-16g"),
]


@pytest.mark.parametrize("name,preset", NAMES)
def test_source_names_map_to_presets(name, preset):
    assert get_gpu(name).name == preset


def test_unknown_names_are_refused_not_guessed():
    for name in ("P100", "TPU v5p", "Gaudi 2", ""):
        with pytest.raises(PlaitError, match="unknown GPU"):
            get_gpu(name)


def test_every_preset_has_a_cluster_and_sane_numbers():
    for name, gpu in GPUS.items():
        assert name in DEFAULT_CLUSTER_FOR_GPU
        assert 100e12 < gpu.bf16_flops < 5e15
        assert gpu.fp8_flops == 0.0 or gpu.fp8_flops >= gpu.bf16_flops
        assert 16 * 2**30 <= gpu.hbm_bytes < 300e9 and 0.8e12 <= gpu.hbm_bandwidth <= 10e12
    # the variants differ where the data sheets say they do
    assert get_gpu("H100 NVL").bf16_flops < get_gpu("H100 SXM5").bf16_flops
    assert get_gpu("h100 (96GB HBM2e, 500W)").hbm_bandwidth < get_gpu("H100 SXM5").hbm_bandwidth
    assert get_gpu("A100 80GB PCIe").hbm_bandwidth < get_gpu("A100-SXM4-80GB").hbm_bandwidth
