"""``plait calibrate fit``: recovers known parameters from runs the model itself generated, reports
leave-one-source-out next to in-sample error, never worsens the defaults in-sample, and turns bad
input into one clear line. No torch.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from torchless import assert_runs_without_torch

from plait.cli import main
from plait.errors import PlaitError
from plait.measure.calibrate.fit import (
    FITTABLE,
    FitProblem,
    fit_runs,
    nelder_mead,
    parse_param_names,
    usable_cases,
)
from plait.measure.validate.runs import predict_row, read_runs
from plait.plan.calibration import read_calibration
from plait.plan.params import DEFAULT_PARAMS

RUNS_CSV = Path(__file__).resolve().parents[3] / "shared" / "data" / "published_runs_calibration.csv"
needs_runs = pytest.mark.skipif(not RUNS_CSV.is_file(), reason=f"published-runs CSV not found at {RUNS_CSV}")
REPORTED = ("reported_tflops_per_gpu", "reported_mfu", "reported_hfu", "reported_iter_time_s",
            "reported_tokens_per_s_per_gpu")


def error_line(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and out == ""
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("plait: error: "), err
    return lines[0]


def write_runs(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def synthetic_runs(path: Path, truth) -> Path:
    """The published layouts with throughputs that the cost model predicts under ``truth``."""
    rows = []
    for row in read_runs(RUNS_CSV):
        first = predict_row(row, DEFAULT_PARAMS)
        if not (first.complete and first.reported_mfu):
            continue
        row = {**row, **{k: "" for k in REPORTED}}
        row["reported_tokens_per_s_per_gpu"] = repr(predict_row(row, truth).predicted_tokens_per_s_per_gpu)
        rows.append(row)
    return write_runs(path, rows)


@needs_runs
def test_fit_recovers_the_parameters_that_generated_the_runs(tmp_path):
    truth = replace(DEFAULT_PARAMS, elementwise_passes=70.0, microbatch_overhead_s=5e-3, tp_comm_overlap=0.3)
    path = synthetic_runs(tmp_path / "synthetic.csv", truth)
    names = ("elementwise_passes", "microbatch_overhead_s", "tp_comm_overlap")
    result = fit_runs(path, names, objective="mean", rounds=4, points=7, leave_out=False)
    assert result.default_error > 0.03  # the defaults are visibly off on these runs
    assert result.in_sample_error < 1e-3
    assert result.params.elementwise_passes == pytest.approx(70.0, rel=0.01)
    assert result.params.microbatch_overhead_s == pytest.approx(5e-3, rel=0.05)
    assert result.params.tp_comm_overlap == pytest.approx(0.3, abs=0.05)
    untouched = {n for n in DEFAULT_PARAMS.to_dict() if n not in names}
    assert all(getattr(result.params, n) == getattr(DEFAULT_PARAMS, n) for n in untouched)


@needs_runs
def test_fit_on_published_runs_reports_leave_one_source_out(tmp_path):
    result = fit_runs(RUNS_CSV, rounds=2, points=5, polish=4)
    assert result.in_sample_error <= result.default_error  # starts at the defaults, accepts improvements only
    sources = {s.source for s in result.per_source}
    assert len(sources) >= 3 and sum(s.rows for s in result.per_source) == result.rows_used
    for s in result.per_source:
        assert 0.0 <= s.leave_out < 0.5, s  # finite and sane: a held-out source is predicted within 50%
        assert set(s.leave_out_params) == set(result.names)
        assert all(FITTABLE[n].low <= v <= FITTABLE[n].high for n, v in s.leave_out_params.items())
    assert math.isfinite(result.leave_out_error)
    assert result.rows_skipped.get("incomplete", 0) > 0


@needs_runs
def test_cli_writes_a_calibration_that_plan_and_validate_read(tmp_path, capsys):
    out = tmp_path / "fit.json"
    code = main(["calibrate", "fit", "--runs", str(RUNS_CSV), "--params", "elementwise_passes,dp_overlap",
                 "--rounds", "2", "--points", "5", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "leave-one-source-out" in printed and "in-sample" in printed and "elementwise_passes" in printed
    data = json.loads(out.read_text())
    assert data["kind"] == "fit" and data["gpu"] is None
    errors = data["fit"]["errors"]
    assert errors["in_sample"] <= errors["default"] and errors["held_out"] is not None
    assert data["fit"]["holdout"] == "leave-one-source-out" and data["fit"]["warnings"] == []
    assert set(data["fit"]["fitted"]) == {"elementwise_passes", "dp_overlap"}
    assert all(p["held_out"] is not None for p in data["fit"]["per_source"])
    calibration = read_calibration(out)
    assert calibration.params.elementwise_passes == data["fit"]["fitted"]["elementwise_passes"]["value"]
    assert main(["validate", "--runs", str(RUNS_CSV), "--calibration", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["compared"] == data["fit"]["rows_used"]


def test_nelder_mead_finds_a_valley_and_never_returns_worse():
    def valley(p):
        return (p[0] - 1.0) ** 2 + 10 * (p[1] - p[0] * 0.5) ** 2

    x, value, _ = nelder_mead(valley, [0.0, 0.0], valley([0.0, 0.0]), [0.5, 0.5], iterations=200)
    assert value < 1e-6 and x[0] == pytest.approx(1.0, abs=1e-2) and x[1] == pytest.approx(0.5, abs=1e-2)
    x, value, _ = nelder_mead(valley, [1.0, 0.5], 0.0, [0.5, 0.5], iterations=20)
    assert (x, value) == ([1.0, 0.5], 0.0)


# ----------------------------------------------------------------------------------- bad input
def test_unknown_and_unfittable_parameter_names(capsys):
    with pytest.raises(PlaitError, match="'warp' \\(unknown\\).*fittable parameters: elementwise_passes"):
        parse_param_names("elementwise_passes,warp")
    with pytest.raises(PlaitError, match="cuda_context_bytes.*does not change step time"):
        parse_param_names("cuda_context_bytes")
    line = error_line(capsys, "calibrate", "fit", "--runs", "x.csv", "--params", "warp", "--out", "c.json")
    assert "cannot fit 'warp'" in line


@needs_runs
def test_runs_file_without_usable_rows(tmp_path, capsys):
    rows = [row for row in read_runs(RUNS_CSV) if not predict_row(row).complete][:3]
    assert rows
    # a blank seq_len under a stack without run configs (Megatron-LM's) is incomplete too
    megatron = [dict(row, seq_len="") for row in read_runs(RUNS_CSV) if row["id"].startswith("megatron21-t1-")]
    rows = (rows + megatron)[:3]
    assert not any(predict_row(row).complete for row in rows)
    path = write_runs(tmp_path / "runs.csv", rows)
    line = error_line(capsys, "calibrate", "fit", "--runs", str(path), "--out", str(tmp_path / "c.json"))
    assert "no usable rows (3 incomplete)" in line and "reported throughput" in line
    assert not (tmp_path / "c.json").exists()
    with pytest.raises(PlaitError, match="no usable rows"):
        usable_cases(path)


def test_runs_file_missing_or_malformed(tmp_path, capsys):
    line = error_line(capsys, "calibrate", "fit", "--runs", str(tmp_path / "none.csv"), "--out", "c.json")
    assert "does not exist" in line
    bad = tmp_path / "bad.csv"
    bad.write_text("id,source\nx,y\n")
    assert "missing columns" in error_line(capsys, "calibrate", "fit", "--runs", str(bad), "--out", "c.json")
    assert "name it *.json" in error_line(capsys, "calibrate", "fit", "--runs", str(bad), "--out", "c.txt")


@needs_runs
def test_fit_problem_scores_like_validate():
    """The fit's fast path (specs built once) predicts exactly what ``predict_row`` predicts."""
    cases, _ = usable_cases(RUNS_CSV)
    params = replace(DEFAULT_PARAMS, elementwise_passes=60.0)
    by_id = {row["id"]: predict_row(row, params) for row in read_runs(RUNS_CSV)}
    for case in cases:
        assert case.predicted_mfu(params) == pytest.approx(by_id[case.id].predicted_mfu, rel=1e-12)
    problem = FitProblem(tuple(cases), metric="step_time", objective="mean")
    assert problem.score(params) > 0


def test_fit_on_a_sweep_csv_recovers_parameters(tmp_path, capsys):
    """A ``plait sweep`` CSV (measured step time per layout) whose times the model made with known params."""
    from plait.measure.sweep.csv_file import SweepRow, SweepWriter
    from plait.plan.cost import estimate_step
    from plait.spec.hardware import cluster_for_gpu
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.models import get_model

    truth = replace(DEFAULT_PARAMS, elementwise_passes=62.0, step_overhead_s=0.05)
    path = tmp_path / "sweep.csv"
    writer = SweepWriter(path)
    for model in ("llama3.2-1b", "llama-125m"):
        for layout in ("dp=8,mbs=1", "dp=8,mbs=2,ckpt=full", "dp=4,tp=2,mbs=4", "dp=8,zero=3,mbs=2",
                       "dp=2,tp=4,mbs=8,ckpt=selective"):
            cluster = cluster_for_gpu("h100-sxm", 8, 8)
            step = estimate_step(get_model(model), cluster, JobSpec(64, 2048), Layout.parse(layout), truth)
            writer.write(SweepRow(layout=layout, status="ok", predicted_step_time_s=1.0,
                                  measured_step_time_s=step.step_time, model=model, global_batch=64, seq_len=2048,
                                  nproc_per_node=8, gpu="h100-sxm", device="cuda"))
    writer.write(SweepRow(layout="dp=8,mbs=64", status="oom", reason="CUDA out of memory", model="llama3.2-1b",
                          global_batch=64, seq_len=2048, nproc_per_node=8, gpu="h100-sxm"))
    writer.close()
    result = fit_runs(path, ("elementwise_passes", "step_overhead_s"), objective="mean", rounds=3, points=7)
    assert result.kind == "sweep" and result.rows_used == 10 and result.rows_skipped == {"status oom": 1}
    assert result.params.elementwise_passes == pytest.approx(62.0, rel=0.01)
    assert result.params.step_overhead_s == pytest.approx(0.05, rel=0.02)
    assert result.in_sample_error < 1e-3 < result.default_error
    assert {s.source for s in result.per_source} == {"llama3.2-1b", "llama-125m"}
    # one model's rows (same batch) cannot tell per-token from per-step cost apart: refitted on one model,
    # the other is predicted worse than in-sample; the leave-one-source-out column is there to show it
    for s in result.per_source:
        assert s.in_sample < 1e-3 and s.in_sample < s.leave_out < 0.5, (s.source, s.leave_out)


@needs_runs
def test_fit_runs_with_torch_blocked(tmp_path):
    assert_runs_without_torch(["calibrate", "fit", "--runs", str(RUNS_CSV), "--params", "elementwise_passes",
                               "--rounds", "1", "--points", "3", "--no-leave-out", "--json",
                               "--out", str(tmp_path / "fit.json")])


def test_cpu_sweep_rows_need_a_cpu_profile(tmp_path):
    """A CPU sweep records no GPU: its rows are usable only on a CPU profile's hardware numbers."""
    from plait.measure.sweep.csv_file import SweepRow, SweepWriter

    path = tmp_path / "cpu_sweep.csv"
    writer = SweepWriter(path)
    for layout, seconds in (("dp=2,mbs=1", 0.9), ("dp=2,mbs=2", 0.7), ("dp=1,tp=2,mbs=1", 1.4)):
        writer.write(SweepRow(layout=layout, status="ok", measured_step_time_s=seconds, model="tiny",
                              global_batch=8, seq_len=64, nproc_per_node=2, device="cpu"))
    writer.close()
    with pytest.raises(PlaitError, match="no usable rows \\(3 no GPU spec"):
        fit_runs(path, ("step_overhead_s",), rounds=1, points=3, leave_out=False)
    profile = tmp_path / "cpu.json"
    profile.write_text(json.dumps({"gpu": None, "device": "cpu", "params": {},
                                   "gpu_overrides": {"bf16_flops": 5e10, "gemm_efficiency": 1.0, "hbm_bandwidth": 2e10},
                                   "cluster_overrides": {"intra_node_bandwidth": 1e9, "link_efficiency": 1.0}}))
    calibration = read_calibration(profile)
    result = fit_runs(path, ("step_overhead_s",), rounds=3, points=9, leave_out=False, calibration=calibration)
    assert result.rows_used == 3 and result.in_sample_error < result.default_error
    assert result.params.step_overhead_s != DEFAULT_PARAMS.step_overhead_s
    data = __import__("plait.measure.calibrate.output", fromlist=["fit_to_dict"]).fit_to_dict(
        result, str(path), None, calibration)
    assert data["device"] == "cpu" and data["gpu_overrides"]["bf16_flops"] == 5e10  # hardware carried over
    assert data["fit"]["start"] == str(profile) and data["fit"]["runs_kind"] == "sweep"


# ------------------------------------------------------------- sweep CSVs: one source, GPUs, recorded files
def write_sweep(path: Path, layouts, model="llama-125m", gpu="h100-sxm", truth=DEFAULT_PARAMS, slower=1.0,
                calibration="", calibration_sha256="") -> Path:
    """A sweep CSV whose measured step times are ``slower`` x the model's prediction under ``truth``."""
    from plait.measure.sweep.csv_file import SweepRow, SweepWriter
    from plait.plan.cost import estimate_step
    from plait.spec.hardware import cluster_for_gpu
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.models import get_model

    writer = SweepWriter(path)
    for layout in layouts:
        step = estimate_step(get_model(model), cluster_for_gpu(gpu, 8, 8), JobSpec(64, 2048), Layout.parse(layout), truth)
        writer.write(SweepRow(layout=layout, status="ok", predicted_step_time_s=1.0,
                              measured_step_time_s=slower * step.step_time, model=model, global_batch=64,
                              seq_len=2048, nproc_per_node=8, gpu=gpu, device="cuda", calibration=calibration,
                              calibration_sha256=calibration_sha256))
    writer.close()
    return path


LAYOUTS = ("dp=8,mbs=1", "dp=8,mbs=2,ckpt=full", "dp=4,tp=2,mbs=4", "dp=8,zero=3,mbs=2",
           "dp=2,tp=4,mbs=8,ckpt=selective", "dp=4,tp=2,mbs=2,ckpt=full", "dp=8,mbs=4,ckpt=selective")


def test_step_time_error_is_predicted_over_measured(tmp_path):
    """Measured steps 1.25x the prediction: |predicted / measured - 1| = 0.2 of step time, 0.25 of MFU."""
    from plait.measure.calibrate.from_sweep import sweep_cases

    cases, _, _ = sweep_cases(write_sweep(tmp_path / "s.csv", LAYOUTS[:2], slower=1.25))
    assert FitProblem(tuple(cases), "step_time", "mean").score(DEFAULT_PARAMS) == pytest.approx(0.2, rel=1e-5)
    assert FitProblem(tuple(cases), "mfu", "mean").score(DEFAULT_PARAMS) == pytest.approx(0.25, rel=1e-5)  # the CSV keeps 6 digits


def test_one_source_sweep_is_held_out_by_layout(tmp_path, capsys):
    truth = replace(DEFAULT_PARAMS, elementwise_passes=62.0, step_overhead_s=0.05)
    names = ("elementwise_passes", "step_overhead_s")
    three = fit_runs(write_sweep(tmp_path / "three.csv", LAYOUTS[:3], truth=truth), names, objective="mean",
                     rounds=2, points=5, polish=3)
    assert three.holdout == "leave-one-layout-out" and len(three.folds) == 3
    assert [f["held_out"] for f in three.folds] == [[layout] for layout in LAYOUTS[:3]]
    assert any("one source (llama-125m)" in w and "leave-one-layout-out" in w for w in three.warnings)
    source = three.per_source[0]
    assert math.isfinite(source.leave_out) and source.leave_out >= source.in_sample and source.leave_out < 0.5
    # more layouts than MAX_FOLDS: round-robin folds; every layout held out exactly once; CLI warns and labels
    path = write_sweep(tmp_path / "seven.csv", LAYOUTS, truth=truth)
    out = tmp_path / "fit.json"
    code = main(["calibrate", "fit", "--runs", str(path), "--params", ",".join(names), "--rounds", "2", "--points",
                 "5", "--objective", "mean", "--out", str(out)])
    printed, err = capsys.readouterr()
    assert code == 0 and "5-fold by layout" in printed
    assert "plait: warning: the runs have one source (llama-125m)" in err and "5-fold by layout" in err
    fit = json.loads(out.read_text())["fit"]
    assert fit["holdout"] == "5-fold by layout" and fit["errors"]["held_out"] is not None
    held = [layout for fold in fit["folds"] for layout in fold["held_out"]]
    assert sorted(held) == sorted(LAYOUTS) and len(fit["folds"]) == 5


def calibration_file(path: Path, gpu, device="cuda", **params) -> Path:
    path.write_text(json.dumps({"gpu": gpu, "device": device, "params": params,
                                "gpu_overrides": {"gemm_efficiency": 0.6}}))
    return path


def test_profile_of_another_gpu_warns_naming_both(tmp_path, capsys):
    path = write_sweep(tmp_path / "s.csv", LAYOUTS[:2])
    a100 = read_calibration(calibration_file(tmp_path / "a100.json", "a100-80g"))
    result = fit_runs(path, ("step_overhead_s",), rounds=1, points=3, leave_out=False, calibration=a100)
    assert result.warnings == [f"calibration {a100.path} is for a100-80g, the sweep rows ran on h100-sxm"]
    code = main(["calibrate", "fit", "--runs", str(path), "--params", "step_overhead_s", "--rounds", "1", "--points",
                 "3", "--no-leave-out", "--json", "--calibration", a100.path, "--out", str(tmp_path / "f.json")])
    assert code == 0 and "is for a100-80g, the sweep rows ran on h100-sxm" in capsys.readouterr().err
    same = read_calibration(calibration_file(tmp_path / "h100.json", "h100-sxm"))
    assert fit_runs(path, ("step_overhead_s",), rounds=1, points=3, leave_out=False, calibration=same).warnings == []


def test_fit_starts_from_the_calibration_the_sweep_recorded(tmp_path, capsys):
    import hashlib

    cal = calibration_file(tmp_path / "h100.json", "h100-sxm", elementwise_passes=70.0)
    digest = hashlib.sha256(cal.read_bytes()).hexdigest()[:16]
    path = write_sweep(tmp_path / "s.csv", LAYOUTS[:2], calibration=str(cal), calibration_sha256=digest)
    out = tmp_path / "fit.json"
    argv = ["calibrate", "fit", "--runs", str(path), "--params", "step_overhead_s", "--rounds", "1", "--points", "3",
            "--no-leave-out", "--json", "--out", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
    data = json.loads(out.read_text())
    assert data["fit"]["start"] == str(cal) and data["gpu"] == "h100-sxm"
    assert data["gpu_overrides"] == {"gemm_efficiency": 0.6} and data["params"]["elementwise_passes"] == 70.0
    cal.write_text(cal.read_text().replace("70.0", "71.0"))  # changed since the sweep: used, with a warning
    assert main(argv) == 0
    assert f"calibration {cal} changed since the sweep (sha256 {digest} then" in capsys.readouterr().err
    assert json.loads(out.read_text())["params"]["elementwise_passes"] == 71.0
    other = calibration_file(tmp_path / "other.json", "h100-sxm")  # --calibration wins, with a note
    assert main([*argv, "--calibration", str(other)]) == 0
    assert f"replaces the calibration the sweep's predictions used ({cal})" in capsys.readouterr().err
    assert json.loads(out.read_text())["fit"]["start"] == str(other)
    cal.unlink()  # gone: the defaults, with a warning
    assert main(argv) == 0
    assert f"the sweep's calibration {cal} is missing" in capsys.readouterr().err
    assert json.loads(out.read_text())["fit"]["start"] == "defaults"


def test_gpu_name_with_a_cpu_profile_is_refused(tmp_path, capsys):
    path = write_sweep(tmp_path / "s.csv", LAYOUTS[:2])
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"gpu": None, "device": "cpu", "params": {}}))
    line = error_line(capsys, "calibrate", "fit", "--runs", str(path), "--calibration", str(cpu), "--gpu", "h100-sxm",
                      "--out", str(tmp_path / "f.json"))
    assert "--gpu h100-sxm with the CPU profile" in line and "drop --gpu" in line
