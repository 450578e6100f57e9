"""The GEMM roofline of ``plait profile`` (issue 34): the fit recovers the planner's own curve, the
calibration records what it measured, plan/sweep warn once when a model's GEMMs fall outside it,
and calibration files written before the roofline still load and price GEMMs as before. No torch.

Tolerances: the synthetic timings are the planner's formula evaluated in floating point, so the fit
is exact up to rounding (~1e-16 per operation, amplified by the least-squares normal equations,
whose condition number over these sizes stays below ~1e8): 1e-6 relative leaves a wide margin.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from plait.cli import main
from plait.measure.profile.fit import calibration_fields
from plait.measure.profile.gemm_fit import fit_roofline, predict
from plait.measure.profile.machine import REFERENCE_MODELS, Where, profile_config
from plait.plan.calibration import read_calibration
from plait.plan.coverage import GemmCoverage, gemm_bytes, model_gemms, planned_tokens
from plait.plan.kernels import gemm_time
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import GpuSpec
from plait.spec.models import get_model

EXACT = 1e-6
# a CPU-like device: 30 GFLOP/s peak at 0.8, 12 GB/s copies, 4 us launches, fp32
CPU = GpuSpec(name="cpu", bf16_flops=30e9, fp8_flops=0.0, hbm_bytes=8e9, hbm_bandwidth=12e9,
              gemm_efficiency=0.8, memory_efficiency=1.0, kernel_overhead=4e-6, element_bytes=4.0)
TRUE = replace(DEFAULT_PARAMS, gemm_half_flops=3e5, gemm_bandwidth_factor=1.5)


def _points(shapes, gpu=CPU, params=TRUE):
    out = []
    for m, k, n in shapes:
        seconds = gemm_time(gpu, params, m, k, n)
        out.append({"m": m, "k": k, "n": n, "flops": 2.0 * m * k * n, "time_s": seconds,
                    "flops_per_s": 2.0 * m * k * n / seconds})
    return out


def _shapes(models=("tiny", "llama3-8b"), tokens=(1, 4, 16, 64, 256, 1024)):
    return [(g["m"], g["k"], g["n"]) for name in models for g in model_gemms(get_model(name), list(tokens))]


def test_roofline_fit_recovers_rate_half_size_and_bandwidth():
    fit = fit_roofline(_points(_shapes()), CPU.kernel_overhead, CPU.element_bytes)
    assert fit["rate"] == pytest.approx(30e9 * 0.8, rel=EXACT)
    assert fit["half_flops"] == pytest.approx(3e5, rel=EXACT)
    assert fit["bytes_per_s"] == pytest.approx(12e9 * 1.5, rel=EXACT)
    assert fit["max_error"] < EXACT and fit["memory_bound"] > 0  # both sides of the roofline were measured
    # the same curve, point by point
    for m, k, n in _shapes(("tiny",), (2, 32)):
        seconds = predict(2.0 * m * k * n, gemm_bytes(m, k, n, 4.0), fit["rate"], fit["half_flops"],
                          fit["bytes_per_s"], CPU.kernel_overhead)
        assert seconds == pytest.approx(gemm_time(CPU, TRUE, m, k, n), rel=EXACT)


def test_roofline_without_bytes_bound_gemms_has_no_bytes_side():
    fast = replace(CPU, hbm_bandwidth=1e18)
    fit = fit_roofline(_points(_shapes(), gpu=fast), fast.kernel_overhead, 4.0)
    assert fit["bytes_per_s"] is None and fit["memory_bound"] == 0
    assert fit["rate"] == pytest.approx(24e9, rel=EXACT) and fit["half_flops"] == pytest.approx(3e5, rel=EXACT)


def test_cpu_profile_fields_give_back_the_planner_gemm_times_of_another_model():
    """A profile measured on 8B-sized GEMMs and the reference set prices a tiny model's GEMMs as the
    device does: the fitted fields, put back into the planner, reproduce gemm_time."""
    raw = {"dtype": "float32", "kernel_overhead_s": CPU.kernel_overhead, "gemm": _points(_shapes()),
           "memory": [{"bytes": 1 << 26, "time_s": 2 * (1 << 26) / 12e9, "bytes_per_s": 12e9}]}
    fields = calibration_fields(raw, None, link_efficiency=1.0)
    gpu = replace(CPU, **{k: v for k, v in fields["gpu_overrides"].items() if k != "hbm_bytes"})
    params = replace(DEFAULT_PARAMS, **{k: v for k, v in fields["params"].items()
                                        if k in ("gemm_half_flops", "gemm_bandwidth_factor")})
    assert params.gemm_bandwidth_factor == pytest.approx(1.5, rel=EXACT)
    for m, k, n in _shapes(("tiny",), (128, 512)):
        assert gemm_time(gpu, params, m, k, n) == pytest.approx(gemm_time(CPU, TRUE, m, k, n), rel=EXACT)
    coverage = fields["gemm_coverage"]
    assert coverage["m"] == [1.0, 1024.0] and coverage["element_bytes"] == 4.0
    assert coverage["flops"][0] == min(p["flops"] for p in raw["gemm"])


def test_default_profile_measures_tiny_through_8b_and_the_named_model_with_a_spread():
    config = profile_config(get_model("llama3-8b"), 4096, Where("cpu", 2), quick=False, timeout_s=300)
    models = {g["model"] for g in config["gemm"]}
    assert set(REFERENCE_MODELS) <= models
    scales = {g["scale"] for g in config["gemm"] if g["model"] == "llama3-8b"}
    assert scales == {0.25, 1.0}  # x4 of the 8B shapes is over the CPU's byte cap; x1/4 is kept
    tiny = [g for g in config["gemm"] if g["model"] == "tiny"]
    assert {g["name"] for g in tiny} == {"qkv", "attn_out", "mlp_up", "mlp_down", "head"}
    coverage = GemmCoverage.of(config["gemm"], 4.0)
    # tiny's micro-batches of 1 to 4 sequences of 128, and 8B's layers up to the CPU's caps, are covered
    assert not coverage.outside(model_gemms(get_model("tiny"), [128, 512]))
    assert not coverage.outside(model_gemms(get_model("llama3-8b"), [1, 8], head=False))


def _write(path, coverage: GemmCoverage | None, **params):
    data = {"device": "cpu", "gpu": None, "params": params,
            "gpu_overrides": {"bf16_flops": 30e9, "hbm_bandwidth": 12e9, "element_bytes": 4.0}}
    if coverage is not None:
        data["gemm_coverage"] = coverage.to_dict()
    path.write_text(json.dumps(data))
    return str(path)


def test_coverage_warning_fires_outside_the_measured_range_and_names_the_fix(tmp_path):
    big = GemmCoverage.of(model_gemms(get_model("llama3-8b"), [1, 4, 16, 64], head=False), 4.0)
    calibration = read_calibration(_write(tmp_path / "big.json", big))
    line = calibration.coverage_warning(get_model("tiny"), 128, 8, "tiny")
    assert "plait profile --model tiny --seq-len 128" in line and "\n" not in line
    # the model's own shapes, at the token counts the plan uses: covered, no warning
    tiny = get_model("tiny")
    own = GemmCoverage.of(model_gemms(tiny, planned_tokens(128, 8)), 4.0)
    assert read_calibration(_write(tmp_path / "own.json", own)).coverage_warning(tiny, 128, 8) == ""
    # inside the slack (x2) on both ends: still covered; far outside: not
    assert not own.outside(model_gemms(tiny, [128 * 8 * 2 - 1]))
    assert own.outside(model_gemms(tiny, [128 * 8 * 4]))


def test_plan_and_sweep_print_one_coverage_line(tmp_path, capsys):
    big = GemmCoverage.of(model_gemms(get_model("llama3-8b"), [1, 4, 16, 64], head=False), 4.0)
    path = _write(tmp_path / "big.json", big)
    plan = ["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "2", "--global-batch", "8",
            "--seq-len", "128", "--layout", "dp=2", "--calibration", path]
    assert main(plan) == 0
    err = capsys.readouterr().err
    assert sum("did not measure GEMMs like tiny's" in line for line in err.splitlines()) == 1, err
    own = GemmCoverage.of(model_gemms(get_model("tiny"), planned_tokens(128, 8)), 4.0)
    assert main(plan[:-1] + [_write(tmp_path / "own.json", own)]) == 0
    assert "did not measure" not in capsys.readouterr().err


def test_calibration_files_before_the_roofline_load_and_price_gemms_as_before(tmp_path):
    path = _write(tmp_path / "old.json", None, gemm_half_flops=1e8)  # no factor, no coverage
    calibration = read_calibration(path)
    assert calibration.gemm_coverage is None and calibration.params.gemm_bandwidth_factor == 1.0
    assert calibration.coverage_warning(get_model("tiny"), 128) == ""
    m, k, n = 1, 4096, 6144  # the old formula, written out: max(compute, bytes at the element-wise rate) + launch
    old = max(2.0 * m * k * n / (30e9 * CPU.gemm_efficiency) * (2.0 * m * k * n + 1e8) / (2.0 * m * k * n),
              4.0 * (m * k + k * n + m * n) / (12e9 * CPU.memory_efficiency)) + CPU.kernel_overhead
    gpu = replace(CPU, bf16_flops=30e9, hbm_bandwidth=12e9)
    assert gemm_time(gpu, calibration.params, m, k, n) == pytest.approx(old, rel=1e-12)
    (tmp_path / "bad.json").write_text(json.dumps({"params": {}, "gemm_coverage": {"flops": [2, 1]}}))
    assert main(["plan", "--model", "tiny", "--global-batch", "8", "--seq-len", "128",
                 "--calibration", str(tmp_path / "bad.json")]) == 2
