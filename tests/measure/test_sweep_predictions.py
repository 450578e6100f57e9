"""A sweep that records predictions (issue 12: it died on its first layout), end to end on CPU:
``plait sweep --gpu h100-sxm`` through real ``plait train`` runs, then ``plait report`` on its CSV."""

from __future__ import annotations

import json
import math

from plait.cli import main
from plait.measure.sweep.csv_file import read_sweep, summary_path


def test_cpu_sweep_with_gpu_predictions_then_report(tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    code = main(["sweep", "--model", "tiny", "--nproc-per-node", "2", "--global-batch", "8", "--seq-len", "64",
                 "--layout", "dp=2", "--layout", "tp=2", "--steps", "3", "--device", "cpu", "--gpu", "h100-sxm",
                 "--repeats", "1", "--min-time", "0", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    rows = read_sweep(out)
    assert [r.status for r in rows] == ["ok", "ok"], [r.reason for r in rows]
    for row in rows:
        assert row.gpu == "h100-sxm" and row.calibration == "" and row.calibration_sha256 == ""
        for value in (row.predicted_step_time_s, row.predicted_memory_bytes, row.predicted_mfu,
                      row.measured_step_time_s, row.step_time_error):
            assert value is not None and math.isfinite(value)
        assert row.predicted_step_time_s > 0 and row.predicted_memory_bytes > 0 and 0 < row.predicted_mfu < 1
        assert row.measured_mfu is None and row.memory_kind == "host_tensors"  # CPU: measured MFU not invented
        assert row.memory_error is None  # counted CPU tensors are not compared with an H100's prediction
    summary = json.loads(summary_path(out).read_text())
    assert summary["predictions_recorded_for"] == "h100-sxm" and summary["step_time_error"]["n"] == 2

    report = tmp_path / "report"
    assert main(["report", "--sweep", str(out), "--out", str(report)]) == 0, capsys.readouterr().err[-3000:]
    for name in ("report.html", "report.md", "step_time.png", "memory.png"):
        assert (report / name).is_file() and (report / name).stat().st_size > 0, name
    md = (report / "report.md").read_text()
    assert "dp=2" in md and "tp=2" in md and "h100-sxm" in md
