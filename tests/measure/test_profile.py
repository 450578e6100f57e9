"""``plait profile``: the fits recover the planner's numbers from synthetic timings (no torch), one
real profile on CPU with 2 gloo processes (--quick) writes a calibration file of the promised
schema, and ``plait plan --calibration`` uses it (with the CPU-profile warning); bad input gives one line.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from plait.cli import main
from plait.measure.profile.machine import OPS, Where, gemm_cases, profile_config, scope_groups
from plait.measure.profile.fit import calibration_fields, fit_collective, fit_gemm
from plait.plan import comm
from plait.plan.kernels import gemm_time
from plait.plan.calibration import DEVICE_MEASURED_PARAMS, read_calibration
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import CLUSTERS, GPUS, get_cluster
from plait.spec.layout import GroupPlacement
from plait.spec.models import get_model

PLAN = ["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "2", "--global-batch", "8",
        "--seq-len", "64", "--layout", "dp=2", "--json"]


def error_line(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("plait: error: ") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------- fits (no torch)
def test_gemm_fit_recovers_the_planner_curve():
    """Timings made by plait.plan.kernels.gemm_time give back its efficiency and half-rate size."""
    gpu = replace(GPUS["h100-sxm"], gemm_efficiency=0.71, hbm_bandwidth=1e18)  # no roofline: pure curve
    params = replace(DEFAULT_PARAMS, gemm_half_flops=3.0e9)
    points = []
    for case in gemm_cases(get_model("llama3-8b"), [256, 1024, 4096, 16384], [1, 8]):
        seconds = gemm_time(gpu, params, case["m"], case["k"], case["n"])
        flops = 2.0 * case["m"] * case["k"] * case["n"]
        points.append({**case, "flops": flops, "time_s": seconds, "flops_per_s": flops / seconds})
    fit = fit_gemm(points, gpu.kernel_overhead)
    assert fit["rate"] / gpu.bf16_flops == pytest.approx(0.71, rel=1e-6)
    assert fit["half_flops"] == pytest.approx(3.0e9, rel=1e-6)
    assert fit["max_error"] < 1e-9


def _gemm_points(times: dict[float, float]) -> list[dict]:
    return [{"flops": f, "time_s": t, "flops_per_s": f / t} for f, t in times.items()]


def test_gemm_fit_is_one_consistent_curve_with_its_worst_residual():
    overhead = 5e-6
    # a middle GEMM faster than the others' line (on a CPU the rate varies with the shape): the curve
    # is the least-squares line of all three, not that GEMM's rate; the fastest is kept beside it
    points = _gemm_points({1e9: 1e9 / 40e12 + 10e-6, 1e10: 1e10 / 60e12, 1e11: 1e11 / 50e12})
    fit = fit_gemm(points, overhead)
    assert fit["fit"] == "line" and fit["fastest"] == pytest.approx(60e12)
    assert 50e12 < fit["rate"] < 60e12 and fit["half_flops"] > 0

    def loss(rate, half):
        return sum((((p["flops"] + half) / rate + overhead) / p["time_s"] - 1) ** 2 for p in points)

    rate, half = fit["rate"], fit["half_flops"]
    assert loss(rate, half) <= min(loss(rate * f, half * g) for f in (0.99, 1.0, 1.01) for g in (0.99, 1.0, 1.01))
    assert loss(rate, half) < loss(60e12, half)  # the fastest GEMM's rate fits worse
    worst = max(abs(((p["flops"] + fit["half_flops"]) / fit["rate"] + overhead) / p["time_s"] - 1) for p in points)
    assert fit["max_error"] == pytest.approx(worst, rel=1e-12) and fit["max_error"] > 0.05
    # timings below the launch overhead's line (F_half would be negative): the line through the overhead
    points = _gemm_points({1e9: 1e9 / 60e12, 1e10: 1e10 / 50e12, 1e11: 1e11 / 50e12})
    fit = fit_gemm(points, overhead)
    assert fit["fit"] == "through overhead" and fit["half_flops"] == 0.0 and fit["rate"] >= 60e12
    assert fit["max_error"] == pytest.approx(max(abs((p["flops"] / fit["rate"] + overhead) / p["time_s"] - 1)
                                                 for p in points), rel=1e-12)


def test_gpu_efficiency_above_one_warns_and_is_capped(tmp_path):
    gpu = GPUS["a100-80g"]  # "measured" on an H100-class part: 600 TFLOP/s is above the A100's 312 peak
    raw = {"kernel_overhead_s": 4e-6, "memory": [{"bytes_per_s": 1.5e12}],
           "gemm": [{"flops": f, "time_s": (f + 1e9) / 600e12 + 4e-6, "flops_per_s": f / ((f + 1e9) / 600e12 + 4e-6)}
                    for f in (1e9, 1e10, 1e11)]}
    fields = calibration_fields(raw, gpu, link_efficiency=0.8)
    assert fields["gpu_overrides"]["gemm_efficiency"] == 1.0
    assert fields["fits"]["efficiencies_above_1"]["gemm_efficiency"] == pytest.approx(600 / 312, rel=1e-6)
    assert len(fields["warnings"]) == 1 and "gemm_efficiency 1.92 is above 1" in fields["warnings"][0]
    assert "a100-80g" in fields["warnings"][0] and "--gpu" in fields["warnings"][0]
    path = tmp_path / "cal.json"  # what is written is a file the planner accepts
    path.write_text(json.dumps({"gpu": "a100-80g", "device": "cuda", "params": fields["params"],
                                "gpu_overrides": fields["gpu_overrides"]}))
    assert dict(read_calibration(path).gpu_overrides)["gemm_efficiency"] == 1.0
    # a CPU profile's peak is its GEMM rate: attention faster than that is written as 1.0, with a note
    raw["attention"] = [{"flops": f, "fwd_s": f / 900e12, "fwd_bwd_s": 3 * f / 900e12} for f in (1e10, 1e11)]
    fields = calibration_fields(raw, None, link_efficiency=1.0)
    assert fields["gpu_overrides"]["attention_efficiency"] == 1.0 and fields["warnings"] == []
    assert fields["fits"]["efficiencies_above_1"]["attention_efficiency"] > 1.4
    assert any("attention_efficiency written as 1.0" in note for note in fields["notes"])


@pytest.mark.parametrize("op,n", [("all_reduce", 8), ("all_gather", 4), ("reduce_scatter", 2), ("send_recv", 2)])
def test_collective_fit_recovers_the_comm_model(op, n):
    cluster = replace(CLUSTERS["dgx-h100"], intra_node_bandwidth=321e9, intra_node_latency=7e-6)
    group = GroupPlacement(size=n, stride=1, nodes=1, ranks_per_node=n)
    model = {"all_reduce": comm.all_reduce, "all_gather": comm.all_gather, "reduce_scatter": comm.reduce_scatter}
    points = []
    for nbytes in [2**k for k in range(12, 29, 2)]:
        seconds = (comm.send_recv(cluster, False, nbytes) if op == "send_recv" else model[op](cluster, group, nbytes))
        points.append({"op": op, "scope": "intra", "group_size": n, "bytes": nbytes, "time_s": seconds})
    fit = fit_collective(points)
    assert fit["bus_bytes_per_s"] == pytest.approx(321e9 * cluster.link_efficiency, rel=1e-6)
    assert fit["latency_s"] == pytest.approx(7e-6, rel=1e-6)


def test_each_op_keeps_its_own_measured_bandwidth_through_the_planner():
    """A profile whose reduce-scatter is 5x slower than its all-reduce (gloo on a CPU) writes the
    all-reduce as the link and every other op as a factor of it; the planner then times each op
    as it was measured, latency unchanged."""
    truth = replace(CLUSTERS["dgx-h100"], intra_node_bandwidth=2e9, intra_node_latency=4e-4, link_efficiency=1.0,
                    all_gather_bandwidth_factor=0.5, reduce_scatter_bandwidth_factor=0.2,
                    all_to_all_bandwidth_factor=0.7, send_recv_bandwidth_factor=1.3)
    group = GroupPlacement(size=2, stride=1, nodes=1, ranks_per_node=2)
    ops = {"all_reduce": comm.all_reduce, "all_gather": comm.all_gather, "reduce_scatter": comm.reduce_scatter,
           "all_to_all": comm.all_to_all, "send_recv": lambda c, g, b: comm.send_recv(c, False, b)}
    points = [{"op": op, "scope": "intra", "group_size": 2, "bytes": b, "time_s": time(truth, group, b)}
              for op, time in ops.items() if op != "all_to_all" for b in (1e5, 1e6, 1e7)]
    links = calibration_fields({"collectives": points, "kernel_overhead_s": 1e-6, "memory": [{"bytes_per_s": 1e10}],
                                "gemm": [{"flops": f, "time_s": f / 1e11, "flops_per_s": 1e11} for f in (1e8, 1e9)]},
                               None, link_efficiency=1.0)["cluster_overrides"]
    assert links["intra_node_bandwidth"] == pytest.approx(2e9, rel=1e-6)  # the all-reduce's, not a median
    assert links["reduce_scatter_bandwidth_factor"] == pytest.approx(0.2, rel=1e-6)
    assert links["all_gather_bandwidth_factor"] == pytest.approx(0.5, rel=1e-6)
    assert links["send_recv_bandwidth_factor"] == pytest.approx(1.3, rel=1e-6)
    assert "all_to_all_bandwidth_factor" not in links  # not measured: the planner keeps 1.0
    planned = replace(CLUSTERS["dgx-h100"], **links)
    for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        assert ops[op](planned, group, 4e6) == pytest.approx(ops[op](truth, group, 4e6), rel=1e-6), op
    # the factor scales the bandwidth term only: a one-byte message costs the one latency either way
    for op in ("all_gather", "reduce_scatter"):
        assert ops[op](truth, group, 1.0) == pytest.approx(4e-4, abs=1e-8)
    assert comm.reduce_scatter(truth, group, 1e8) == pytest.approx(
        0.5e8 / (2e9 * 0.2) + 4e-4, rel=1e-12)


def test_gpu_fields_are_fractions_of_the_preset_and_links_round_trip():
    gpu = GPUS["h100-sxm"]
    raw = {"kernel_overhead_s": 4e-6,
           "gemm": [{"flops": f, "time_s": (f + 1e9) / 600e12 + 4e-6, "flops_per_s": f / ((f + 1e9) / 600e12 + 4e-6)}
                    for f in (1e9, 1e10, 1e11, 1e12)],
           "attention": [{"flops": f, "fwd_s": (f + 1e9) / 300e12 + 4e-6, "fwd_bwd_s": 3.5 * ((f + 1e9) / 300e12 + 4e-6)}
                         for f in (1e10, 1e11)],
           "memory": [{"bytes_per_s": 2.9e12}],
           "collectives": [{"op": "all_reduce", "scope": "intra", "group_size": 8, "bytes": b,
                            "time_s": 14 * (b / 8 / 360e9 + 6e-6)} for b in (1e4, 1e6, 1e8)],
           "host_link": [{"bytes_per_s": 50e9}, {"bytes_per_s": 48e9}]}
    fields = calibration_fields(raw, gpu, link_efficiency=0.8)
    over = fields["gpu_overrides"]
    assert over["gemm_efficiency"] == pytest.approx(600 / 989, rel=1e-6)
    assert over["attention_efficiency"] == pytest.approx(300 / 989, rel=1e-3)
    assert over["memory_efficiency"] == pytest.approx(2.9 / 3.35)
    assert "bf16_flops" not in over  # a GPU profile never touches the vendor peak (the MFU denominator)
    assert fields["params"]["gemm_half_flops"] == pytest.approx(1e9, rel=1e-6)
    assert fields["params"]["flash_backward_factor"] == pytest.approx(2.5)
    links = fields["cluster_overrides"]
    assert links["intra_node_bandwidth"] * links["link_efficiency"] == pytest.approx(360e9, rel=1e-6)
    assert links["intra_node_latency"] == pytest.approx(6e-6, rel=1e-6)
    assert links["host_link_bandwidth"] == 48e9


def test_host_time_runs_are_interleaved_rounds_reported_by_their_median(monkeypatch):
    pytest.importorskip("torch")
    from plait.measure.profile import runtime_cost

    calls = []
    slow_spell = {3, 4, 5}  # the machine is 10x slower for three consecutive runs of the first round

    def fake(spec, layers, layout_text, device, seq_len, micro_batches=1, steps=24):
        calls.append((layout_text, layers, micro_batches))
        return 0.001 * layers * micro_batches * (10.0 if len(calls) - 1 in slow_spell else 1.0)

    monkeypatch.setattr(runtime_cost, "train_step_seconds", fake)
    out = runtime_cost.layer_host_seconds(get_model("tiny"), None, 32, {"plain": "dp=2", "tp": "tp=2"}, steps=8,
                                          rounds=3)
    runs = [("dp=2", 1, 1), ("dp=2", 5, 1), ("dp=2", 1, 3), ("dp=2", 5, 3), ("tp=2", 1, 1), ("tp=2", 5, 1)]
    assert calls == runs * 3  # every run once per round, in the same order
    assert out["plain"] == {"1x1": 0.001, "5x1": 0.005, "1x3": 0.003, "5x3": 0.015}  # the spell is outvoted
    assert out["tp"] == {"1x1": 0.001, "5x1": 0.005} and out["rounds"] == 3


def test_cpu_profile_sizes_are_capped_for_any_model():
    """On a CPU the default (not --quick) profile of a large model stays a small amount of work."""
    from plait.measure.profile.machine import CPU_MAX_BYTES, CPU_MAX_FLOPS, attention_flops, compute_flops

    for name in ("llama3-8b", "llama3-70b"):
        config = profile_config(get_model(name), 4096, Where("cpu", 2), quick=False, timeout_s=300)
        assert compute_flops(config) < 40e9, name  # ~20 GFLOP/s per process: a few seconds of rank 0's time
        by_name = {}
        for g in config["gemm"]:
            by_name.setdefault(g["name"], []).append(g["m"])
            assert 2.0 * g["m"] * g["k"] * g["n"] <= CPU_MAX_FLOPS
        assert set(by_name) == {"qkv", "attn_out", "mlp_up", "mlp_down", "head"}  # the head: tiny's (reference set)
        assert all(4.0 * (g["m"] * g["k"] + g["k"] * g["n"] + g["m"] * g["n"]) <= CPU_MAX_BYTES for g in config["gemm"])
        assert all(len(set(tokens)) >= 2 for tokens in by_name.values())  # a curve per projection
        assert len(config["attention"]) == 3 and all(attention_flops(a) <= CPU_MAX_FLOPS for a in config["attention"])
        assert "CPU: sizes capped" in config["limits"] and "of the planned 4096" in config["limits"]
        assert config["compute_wait_s"] > config["timeout_s"]  # the other ranks outwait rank 0's compute


def test_the_profile_says_what_it_will_measure_not_how_long():
    """``plait profile`` prints counts of what it runs (no time is promised): one per GEMM and attention
    shape, collective size and op, and per short training run (each layout's layer counts, plain's
    at both layer counts again with three micro-batches, every round)."""
    from plait.measure.profile.cpu_fit import HOST_LAYERS
    from plait.measure.profile.machine import workload

    config = profile_config(get_model("tiny"), 256, Where("cpu", 2), quick=True, timeout_s=60)
    runs = (len(HOST_LAYERS) * len(config["host_overhead_layouts"]) + len(HOST_LAYERS)) * config["host_rounds"]
    text = workload(config)
    assert (f"{len(config['gemm'])} GEMM and {len(config['attention'])} attention shapes" in text
            and f"{len(config['collective_sizes'])} sizes of each of {len(OPS)} collectives" in text
            and f"{runs} short training runs of {config['host_steps']} steps" in text)
    gpu = profile_config(get_model("tiny"), 256, Where("cuda", 2, 1, "h100-sxm"), quick=True, timeout_s=60)
    assert "training runs" not in workload(gpu)  # no host-overhead runs on a GPU
    assert "second" not in text and "minute" not in config["limits"]


def test_planned_shapes_and_groups():
    model = get_model("llama3-8b")
    config = profile_config(model, 8192, Where("cuda", 8, 2, "h100-sxm"), quick=False, timeout_s=60)
    qkv = [c for c in config["gemm"] if c["name"] == "qkv" and c["tp"] == 1 and c["model"] == model.name]
    assert {c["n"] for c in qkv if c["scale"] == 1.0} == {model.hidden + 2 * model.kv_hidden}
    assert {c["scale"] for c in qkv} == {0.25, 1.0, 4.0}  # k and n halved and doubled
    assert {c["model"] for c in config["gemm"]} == {"llama3-8b", "tiny"}  # the reference set: tiny..8B
    assert {c["n"] for c in config["gemm"] if c["name"] == "mlp_up" and c["tp"] == 8} == {2 * model.ffn_hidden // 8}
    assert [a["seq_len"] for a in config["attention"]] == [2048, 4096, 8192]
    assert config["collective_ops"] == list(OPS) and config["dtype"] == "bfloat16"
    intra, inter = scope_groups(Where("cuda", 4, 2))
    assert intra == ("intra", [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert inter == ("inter", [[0, 4], [1, 5], [2, 6], [3, 7]])


def test_malformed_calibration_fields(capsys, tmp_path):
    cases = [('{"cluster_overrides": {"warp": 1}}', "bad cluster_overrides (unknown fields ['warp']"),
             ('{"gpu_overrides": {"gemm_efficiency": -0.5}}', ("gpu_overrides out of range: gemm_efficiency=-0.5 "
                                                              "(must be in (0, 1])")),
             ('{"gpu_overrides": {"bf16_flops": 0}}', "bf16_flops=0 (must be finite and > 0)"),
             ('{"gpu_overrides": {"bf16_flops": 1e999}}', "bf16_flops=inf (must be finite and > 0)"),
             ('{"gpu_overrides": {"hbm_bandwidth": NaN}}', "hbm_bandwidth=nan"),
             ('{"gpu_overrides": {"gemm_efficiency": 1.2, "kernel_overhead": -1e-6}}',
              "gemm_efficiency=1.2 (must be in (0, 1]); kernel_overhead=-1e-06 (must be finite and >= 0)"),
             ('{"gpu_overrides": {"hbm_bytes": true}}', "gpu_overrides must be numbers"),
             ('{"cluster_overrides": {"link_efficiency": 0}}', "link_efficiency=0 (must be in (0, 1])"),
             ('{"cluster_overrides": {"inter_node_bandwidth": -5}}', "inter_node_bandwidth=-5"),
             ('{"params": {"fragmentation": -0.1}}', "params out of range: fragmentation=-0.1 (must be in [0, 1])"),
             ('{"params": {"dp_overlap": 1.5}}', "dp_overlap=1.5 (must be in [0, 1])"),
             ('{"params": {"fp8_gemm_efficiency": 0}}', "fp8_gemm_efficiency=0.0 (must be in (0, 1])"),
             ('{"params": {"disk_bandwidth": 1e999}}', "disk_bandwidth=inf (must be finite and > 0)"),
             ('{"params": {"step_overhead_s": true}}', "must be numbers, not true/false"),
             ('{"device": "tpu"}', "\"device\" must be"),
             ('{"gpu": 7}', "\"gpu\" must be a GPU preset name"),
             ('{"gpu": "nonsense-gpu"}', "\"gpu\" 'nonsense-gpu' is not a GPU preset; use one of a100-40g"),
             ('{"gpu": "h100-sxm", "device": "cpu"}', "a CPU profile (\"device\": \"cpu\") has \"gpu\": null")]
    for i, (text, fragment) in enumerate(cases):
        path = tmp_path / f"cal{i}.json"
        path.write_text(text)
        line = error_line(capsys, *PLAN, "--calibration", str(path))
        assert fragment in line and str(path) in line, line


def test_ranges_hold_for_the_defaults_and_presets_and_aliases_resolve(tmp_path):
    from plait.plan.params import CLUSTER_RANGES, GPU_RANGES, PARAM_RANGES, check_ranges

    check_ranges("params", DEFAULT_PARAMS.to_dict(), PARAM_RANGES)
    for cluster in CLUSTERS.values():
        check_ranges("gpu", {k: getattr(cluster.gpu, k) for k in GPU_RANGES}, GPU_RANGES)
        check_ranges("cluster", {k: getattr(cluster, k) for k in CLUSTER_RANGES}, CLUSTER_RANGES)
    path = tmp_path / "alias.json"
    path.write_text('{"gpu": "H100", "params": {"fragmentation": 0, "dp_overlap": 1}}')
    assert read_calibration(path).gpu == "h100-sxm"


# --------------------------------------------------------------------- end to end on CPU
@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("profile") / "cal.json"
    proc = subprocess.run([sys.executable, "-m", "plait.cli", "profile", "--model", "tiny", "--seq-len", "64",
                           "--quick", "--nproc-per-node", "2", "--device", "cpu", "--timeout", "60", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_cpu_profile_file_schema(cpu_profile):
    path, stdout = cpu_profile
    data = json.loads(path.read_text())
    assert "profile 1/" in stdout and f"wrote {path}" in stdout and "CPU: sizes capped at 0.25 GFLOP" in stdout
    assert data["format"] == "plait-calibration/1" and data["kind"] == "profile"
    assert data["gpu"] is None and data["device"] == "cpu" and data["cpu_profile"] is True
    assert data["model"] == "tiny" and data["seq_len"] == 64
    datetime.fromisoformat(data["date"])
    assert data["machine"]["hostname"] and data["machine"]["cpu_count"] >= 1 and data["machine"]["world_size"] == 2
    assert data["versions"]["torch"] and data["versions"]["backend"] == "gloo"
    m = data["measurements"]
    # --quick: the 4 projections and the head at 16, 128, 1024 tokens and 1 and 4 sequences of 64
    assert len(m["gemm"]) == 5 * 5 and all(g["flops_per_s"] == pytest.approx(g["flops"] / g["time_s"]) for g in m["gemm"])
    assert [a["seq_len"] for a in m["attention"]] == [32, 64]
    assert {(c["op"], c["bytes"]) for c in m["collectives"]} == {(op, b) for op in OPS for b in (16384, 1 << 20)}
    assert all(c["group_size"] == 2 and c["scope"] == "intra" and c["time_s"] > 0 for c in m["collectives"])
    # what the planner reads is what was measured
    over, links = data["gpu_overrides"], data["cluster_overrides"]
    fastest, gemm = max(g["flops_per_s"] for g in m["gemm"]), data["fits"]["gemm"]
    assert gemm["fastest"] == fastest and over["bf16_flops"] == max(fastest, gemm["rate"])  # peak: no step beats it
    assert over["bf16_flops"] * over["gemm_efficiency"] == pytest.approx(gemm["rate"], rel=1e-12)  # the fitted curve
    assert over["hbm_bandwidth"] == max(c["bytes_per_s"] for c in m["memory"])
    assert links["link_efficiency"] == 1.0 and links["intra_node_bandwidth"] > 0 and links["intra_node_latency"] > 0
    calibration = read_calibration(path)
    assert calibration.cpu_profile and dict(calibration.gpu_overrides) == over
    # the CPU as the runtime uses it: fp32, processes x threads, overlap, host time per layer
    assert over["element_bytes"] == 4.0 and data["processes_per_node"] == 2 == calibration.processes_per_node
    assert data["threads_per_process"] == data["machine"]["threads_per_process"] >= 1
    assert 0.0 <= m["overlap"]["hidden"] <= 1.0 and data["params"]["dp_overlap"] == m["overlap"]["hidden"]
    buckets = m["overlap_buckets"]  # one DDP bucket of tiny (all its fp32 gradients) behind longer compute
    assert buckets["reduce_bytes"] == 4 * get_model("tiny").total_params() and buckets["gemm_repeats"] >= buckets["repeats"]
    assert len(buckets["trials"]) == 25 and data["params"]["overlap_slowdown"] == pytest.approx(1 - buckets["hidden"])
    host = m["layer_host_s"]
    assert set(host["layouts"]) == {"plain", "tp", "cp", "fsdp", "sac"}
    assert set(host["plain"]) == {"1x1", "5x1", "1x3", "5x3"}
    block = m["block_s"]  # a layer's forward and backward at two token counts: the per-token work
    assert block["batches"] == [1, 8] and all(block[f"{n}x{b}"] > 0 for n in (1, 5) for b in (1, 8))
    assert data["params"]["elementwise_passes"] >= DEFAULT_PARAMS.elementwise_passes
    assert all(seconds > 0 for key in host["layouts"] for seconds in host[key].values())
    for name in ("layer_overhead_s", "layer_step_overhead_s", "microbatch_overhead_s", "step_overhead_s", "tp_layer_overhead_s",
                 "cp_layer_overhead_s", "fsdp_layer_overhead_s", "sac_layer_overhead_s", "tp_ends_overhead_s",
                 "cp_ends_overhead_s", "fsdp_ends_overhead_s"):
        assert data["params"][name] >= 0.0, name


def test_plan_uses_the_cpu_profile_and_warns(cpu_profile, capsys):
    path, _ = cpu_profile
    assert main(PLAN) == 0
    default = json.loads(capsys.readouterr().out)[0]
    assert main([*PLAN, "--calibration", str(path)]) == 0
    out, err = capsys.readouterr()
    calibrated = json.loads(out)[0]
    assert "is a CPU profile" in err and "h100-sxm" in err
    data = json.loads(path.read_text())
    # the calibrated cluster's GEMM time is the fitted curve: positive, finite, and never faster for a GEMM
    # that is larger in every dimension (structure only: how near it lies to a measurement depends on
    # the machine's load while profiling, which no test may depend on)
    cluster, _ = read_calibration(path).apply(get_cluster("dgx-h100"))
    params = read_calibration(path).params
    shapes = [(g["m"], g["k"], g["n"]) for g in data["measurements"]["gemm"]]
    times = {shape: gemm_time(cluster.gpu, params, *shape) for shape in shapes}
    assert all(math.isfinite(t) and t > 0 for t in times.values()), times
    assert all(times[a] <= times[b] for a in shapes for b in shapes if all(x <= y for x, y in zip(a, b))), times
    # a CPU is far slower than an H100: the plan's step time follows the profile
    compute = [plan["prediction"]["time_items_s"]["compute"] for plan in (default, calibrated)]
    assert compute[1] > compute[0]  # a CPU at tens of GFLOP/s against an H100 (how far apart: the machine's load)
    assert calibrated["prediction"]["step_time_s"] > default["prediction"]["step_time_s"]
    assert calibrated["cluster"]["intra_node_bandwidth"] == data["cluster_overrides"]["intra_node_bandwidth"]
    assert calibrated["cluster"]["gpu"]["bf16_flops"] == data["gpu_overrides"]["bf16_flops"]


def test_gpu_calibration_for_another_gpu_warns_naming_both(cpu_profile, capsys, tmp_path):
    data = json.loads(cpu_profile[0].read_text())
    data.update(gpu="a100-80g", device="cuda")
    del data["gpu_overrides"]["bf16_flops"]
    path = tmp_path / "a100.json"
    path.write_text(json.dumps(data))
    assert main([*PLAN, "--calibration", str(path)]) == 0
    err = capsys.readouterr().err
    assert "is for a100-80g, the cluster has h100-sxm" in err


def test_profile_bad_input(capsys, tmp_path):
    pytest.importorskip("torch")
    out = str(tmp_path / "cal.json")
    assert "drop --gpu" in error_line(capsys, "profile", "--device", "cpu", "--gpu", "h100-sxm", "--out", out)
    assert "name it *.json" in error_line(capsys, "profile", "--device", "cpu", "--out", "cal.txt")
    assert "need at least one process" in error_line(capsys, "profile", "--device", "cpu", "--nproc", "0", "--out", out)
    assert "unknown model" in error_line(capsys, "profile", "--model", "nope", "--device", "cpu", "--out", out)
    import torch

    if not torch.cuda.is_available():
        assert "sees no GPU" in error_line(capsys, "profile", "--device", "cuda", "--out", out)


RUNS_CSV = Path(__file__).resolve().parents[3] / "shared" / "data" / "published_runs_calibration.csv"


@pytest.mark.skipif(not RUNS_CSV.is_file(), reason=f"published-runs CSV not found at {RUNS_CSV}")
def test_validate_does_not_apply_a_cpu_profile_to_gpu_runs(cpu_profile, capsys):
    """A CPU profile holds only CPU-measured params and overrides: validate refuses all of them, says so,
    and predicts exactly what the defaults predict."""
    path = cpu_profile[0]
    assert set(json.loads(path.read_text())["params"]) <= set(DEVICE_MEASURED_PARAMS)
    assert main(["validate", "--runs", str(RUNS_CSV), "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["validate", "--runs", str(RUNS_CSV), "--calibration", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == default
    assert f"calibration {path} is a CPU profile: its CPU-measured params (gemm_half_flops" in err
    assert "element_bytes" not in err and "are not applied to GPU runs" in err
    assert "only the params of calibration" in err and "overrides" in err
