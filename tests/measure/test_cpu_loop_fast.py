"""The measure loop on this machine, small (issue 12, deliver 6): ``plait profile --quick`` on the CPU
-> ``plait plan --calibration`` -> ``plait sweep`` over 2 layouts with the profile's predictions ->
``plait report``. One process everywhere (the tiny model, 3 steps a layout). It checks the pipeline
(every predicted and measured column filled, errors finite, files written), never the accuracy,
which depends on the machine and goes in bench/cpu_loop.py. Two layouts (each a real ``plait train``
launch, about 10 s of CPU) are enough for every column, the summary's correlation and the report:
they differ in micro-batch and checkpointing policy."""

from __future__ import annotations

import json
import math

from plait.cli import main
from plait.measure.sweep.csv_file import read_sweep, summary_path
from plait.plan.calibration import read_calibration

MODEL = ["--model", "tiny", "--global-batch", "4", "--seq-len", "32"]
LAYOUTS = ("dp=1,mbs=1,ckpt=full", "dp=1,mbs=4,ckpt=selective")


def test_profile_plan_sweep_report_on_the_cpu(tmp_path, capsys):
    profile = tmp_path / "cpu.json"
    assert main(["profile", "--quick", "--model", "tiny", "--seq-len", "32", "--nproc-per-node", "1",
                 "--device", "cpu", "--timeout", "60", "--out", str(profile)]) == 0, capsys.readouterr().err[-3000:]
    calibration = read_calibration(profile)
    assert calibration.cpu_profile and dict(calibration.gpu_overrides)["bf16_flops"] > 0

    capsys.readouterr()
    assert main(["plan", *MODEL, "--gpus", "1", "--calibration", str(profile), "--top", "3", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert plans and all(math.isfinite(p["prediction"]["step_time_s"]) and p["prediction"]["step_time_s"] > 0
                         for p in plans)
    assert plans[0]["cluster"]["gpu"]["bf16_flops"] == dict(calibration.gpu_overrides)["bf16_flops"]

    out = tmp_path / "sweep.csv"
    layouts = [arg for layout in LAYOUTS for arg in ("--layout", layout)]
    code = main(["sweep", *MODEL, "--nproc-per-node", "1", "--device", "cpu", "--steps", "3", "--repeats", "1",
                 "--min-time", "0", *layouts, "--calibration", str(profile), "--out", str(out)])
    assert code == 0, capsys.readouterr().err[-3000:]
    rows = read_sweep(out)
    assert [r.status for r in rows] == ["ok"] * len(LAYOUTS), [r.reason for r in rows]
    for row in rows:
        for value in (row.predicted_step_time_s, row.measured_step_time_s, row.step_time_error,
                      row.predicted_memory_bytes, row.measured_memory_bytes, row.spread_s):
            assert value is not None and math.isfinite(value), row
        assert row.predicted_step_time_s > 0 and row.measured_step_time_s > 0 and row.planner_rank in (1, 2)
        # 3 steps: the first is warm-up, the second ran under the memory profiler (never timed)
        assert row.noisy in (True, False) and row.warmup_steps == 1 and row.measured_steps == 1
    summary = json.loads(summary_path(out).read_text())
    assert summary["predictions_recorded_for"] == "cpu (calibration)" and summary["step_time_error"]["n"] == len(LAYOUTS)
    assert "predicted for the CPU described by the calibration file" in summary["note"]
    assert all(r.calibration == str(profile.resolve()) for r in rows)
    rho = summary["rank_correlation"]["spearman"]
    assert rho is None or -1 <= rho <= 1  # a value, not a claim about this machine

    report = tmp_path / "report"
    assert main(["report", "--sweep", str(out), "--out", str(report)]) == 0, capsys.readouterr().err[-3000:]
    for name in ("report.html", "report.md", "step_time.png", "memory.png"):
        assert (report / name).is_file() and (report / name).stat().st_size > 0, name
    md = (report / "report.md").read_text()
    assert all(layout in md for layout in ("mbs=1", "ckpt=full", "ckpt=selective"))
    assert "predictions for the CPU of the sweep's calibration" in md and "no predictions were recorded" not in md
