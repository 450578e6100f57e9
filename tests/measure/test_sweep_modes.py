"""Every way of choosing layouts and predictions, end to end through ``plait report`` (issue 12: a
broken path must not hide): ``--grid`` with ``--gpu``,
``--top K`` with a CPU profile. (``--layout`` with ``--gpu`` on 2 processes: test_sweep_predictions.py;
``--layout`` with a CPU profile: test_cpu_loop_fast.py.)
Each sweeps the tiny model on 1 process, 2 layouts, 3 steps (1 warm-up), then reports on its CSV."""

from __future__ import annotations

import json
import math

import pytest

from plait.cli import main
from plait.measure.sweep.csv_file import read_sweep, summary_path

BASE = ["sweep", "--model", "tiny", "--nproc-per-node", "1", "--global-batch", "4", "--seq-len", "32",
        "--steps", "3", "--device", "cpu", "--repeats", "1", "--min-time", "0"]  # one 3-step run per layout
REPORT_FILES = ("report.html", "report.md", "step_time.png", "memory.png")


def cpu_profile(tmp_path):
    """A hand-written CPU profile (what ``plait profile`` on a CPU writes, reduced to its overrides)."""
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"gpu": None, "device": "cpu", "params": {},
                                "gpu_overrides": {"bf16_flops": 5e10, "gemm_efficiency": 1.0, "hbm_bandwidth": 2e10,
                                                  "hbm_bytes": 8e9},
                                "cluster_overrides": {"intra_node_bandwidth": 1e9, "link_efficiency": 1.0}}))
    return path


def sweep_then_report(tmp_path, capsys, args, gpu=""):
    out = tmp_path / "sweep.csv"
    code = main([*BASE, *args, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    rows = read_sweep(out)
    assert len(rows) == 2 and [r.status for r in rows] == ["ok", "ok"], [r.reason for r in rows]
    for row in rows:
        assert row.gpu == gpu and row.memory_kind == "host_tensors" and row.measured_mfu is None
        # counted tensor bytes are compared with a prediction for the CPU, not with one for a GPU
        assert (row.memory_error is not None and math.isfinite(row.memory_error)) == (gpu == ""), row
        for value in (row.predicted_step_time_s, row.predicted_memory_bytes, row.predicted_mfu,
                      row.measured_step_time_s, row.step_time_error, row.spread_s, row.step_time_iqr_s):
            assert value is not None and math.isfinite(value), row
        ratio = row.measured_step_time_s / row.predicted_step_time_s
        assert row.step_time_error == pytest.approx(ratio - 1, rel=1e-5, abs=1e-5 * ratio)  # 6 digits in the CSV
        # 3 steps: the first is warm-up, the second ran under the memory profiler (never timed)
        assert row.warmup_steps == 1 and row.measured_steps == 1 and row.repeats == 1
        assert row.step_time_min_s <= row.measured_step_time_s <= row.step_time_max_s
        assert row.threads_per_process >= 1 and row.noisy in (True, False)
    summary = json.loads(summary_path(out).read_text())
    assert summary["step_time_error"]["n"] == 2 and math.isfinite(summary["step_time_error"]["median_abs"])
    report = tmp_path / "report"
    assert main(["report", "--sweep", str(out), "--out", str(report)]) == 0, capsys.readouterr().err[-3000:]
    for name in REPORT_FILES:
        assert (report / name).is_file() and (report / name).stat().st_size > 0, name
    return rows, summary, (report / "report.md").read_text()


def test_grid_with_gpu_predictions(tmp_path, capsys):
    rows, summary, md = sweep_then_report(tmp_path, capsys, ["--grid", "mbs=1,2", "--gpu", "h100-sxm"],
                                          gpu="h100-sxm")
    assert [r.layout for r in rows] == ["dp=1,tp=1,pp=1,cp=1,mbs=1", "dp=1,tp=1,pp=1,cp=1,mbs=2"]
    assert summary["predictions_recorded_for"] == "h100-sxm" and "h100-sxm" in md
    assert all(0 < r.predicted_mfu < 1 for r in rows)


def test_top_k_with_a_cpu_profile(tmp_path, capsys):
    profile = cpu_profile(tmp_path)
    rows, summary, _ = sweep_then_report(tmp_path, capsys, ["--top", "2", "--calibration", str(profile)])
    assert sorted(r.planner_rank for r in rows) == [1, 2]
    assert summary["rank_correlation"]["basis"] == "predicted vs measured step time"
