"""What ``plait report`` says is true of what it shows: the step-time chart names the device its
predictions are for, a CPU sweep's MFU is measured against its calibration's peak (or the report
says why there is none), a report of several inputs is titled by all of them, and the paths it
writes are relative to the report (so the directory can be moved with its inputs)."""

from __future__ import annotations

import json

import pytest

from plait.cli import main
from plait.measure.report.chart_data import measured_mfu
from plait.measure.report.plots import device_label
from plait.measure.report.render import path_forms
from plait.measure.sweep.csv_file import SweepRow, SweepWriter

pytest.importorskip("matplotlib")

COMMON = dict(model="tiny", global_batch=4, seq_len=32, nproc_per_node=2, steps=3, device="cpu", memory_kind="host_rss",
              measured_memory_bytes=3e8)
# (layout, predicted s, measured s, predicted MFU): measured MFU = predicted MFU · predicted / measured
CPU_ROWS = (("dp=2,tp=1,pp=1,cp=1,mbs=1", 0.10, 0.125, 0.20), ("dp=1,tp=2,pp=1,cp=1,mbs=1", 0.20, 0.16, 0.10))


def cpu_sweep(path, calibration: str = "", predictions: bool = True) -> None:
    writer = SweepWriter(path)
    for rank, (layout, predicted, measured, mfu) in enumerate(CPU_ROWS, start=1):
        extra = dict(predicted_step_time_s=predicted, predicted_mfu=mfu) if predictions else {}
        writer.write(SweepRow(layout, "ok", planner_rank=rank, measured_step_time_s=measured, calibration=calibration,
                              **extra, **COMMON).with_errors())
    writer.close()


def test_a_cpu_runs_measured_mfu_is_against_the_calibrations_peak():
    (layout, predicted, measured, mfu), _ = CPU_ROWS
    row = SweepRow(layout, "ok", predicted_step_time_s=predicted, measured_step_time_s=measured, predicted_mfu=mfu,
                   **COMMON)
    assert measured_mfu(row) == pytest.approx(0.20 * 0.10 / 0.125, rel=1e-12)  # 0.16: the same FLOPs, 25% slower
    assert measured_mfu(SweepRow(layout, "ok", measured_step_time_s=measured, **COMMON)) is None  # no calibration
    gpu = SweepRow(layout, "ok", measured_mfu=0.4, predicted_mfu=0.5, predicted_step_time_s=1.0,
                   measured_step_time_s=2.0, device="cuda")
    assert measured_mfu(gpu) == 0.4  # a GPU run's own


def test_the_step_time_chart_names_the_device_of_its_predictions():
    assert device_label([SweepRow("dp=2", "ok", gpu="h100-sxm", device="cuda")]) == "h100-sxm"
    assert "CPU" in device_label([SweepRow("dp=2", "ok", device="cpu")])
    assert device_label([SweepRow("dp=2", "ok")])  # never empty: no "()" at the end of the title


def test_a_cpu_sweep_with_a_calibration_shows_measured_mfu(tmp_path):
    calibration = tmp_path / "cal.json"
    calibration.write_text(json.dumps({"params": {}}))
    sweep = tmp_path / "cpu.csv"
    cpu_sweep(sweep, str(calibration.resolve()))
    out = tmp_path / "r"
    assert main(["report", "--sweep", str(sweep), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert (out / "mfu.png").is_file() and "(mfu.png)" in md and "CPU runs: measured MFU" in md
    assert "| 20.0% | 16.0% |" in md and "| 10.0% | 12.5% |" in md  # pred MFU, meas MFU: 0.10 · 0.20 / 0.16


def test_a_cpu_sweep_without_a_calibration_says_why_there_is_no_mfu(tmp_path):
    sweep = tmp_path / "cpu.csv"
    cpu_sweep(sweep, predictions=False)
    out = tmp_path / "r"
    assert main(["report", "--sweep", str(sweep), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert not (out / "mfu.png").exists() and "a CPU run has no peak FLOP/s" in md and "--calibration" in md


def write_log(path) -> None:
    path.write_text("\n".join(json.dumps({"step": s, "loss": 6.0 - 0.1 * s, "lr": 1e-3}) for s in (1, 2, 3)) + "\n")


def test_a_report_of_several_inputs_is_titled_by_all_of_them(tmp_path):
    sweep, log, plan = tmp_path / "cpu.csv", tmp_path / "run.jsonl", tmp_path / "plan.json"
    cpu_sweep(sweep)
    write_log(log)
    assert main(["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "64", "--layout", "pp=2,mbs=1", "--save", str(plan)]) == 0

    def title(*argv: str) -> str:
        out = tmp_path / "r"
        assert main(["report", *argv, "--out", str(out)]) == 0
        return (out / "report.md").read_text().splitlines()[0]

    assert title("--sweep", str(sweep)) == "# plait sweep report: tiny (cpu.csv)"
    assert title("--train-log", str(log)) == "# plait training report: run.jsonl"
    assert title("--sweep", str(sweep), "--train-log", str(log)) == \
        "# plait report: sweep tiny (cpu.csv) + training run.jsonl"
    both = title("--plan", str(plan), "--train-log", str(log))
    assert both.startswith("# plait report: plan tiny, dp=1,tp=1,pp=2") and both.endswith(" + training run.jsonl")
    assert title("--sweep", str(sweep), "--plan", str(plan)).startswith("# plait report: sweep tiny (cpu.csv) + plan")


def test_the_reports_paths_are_relative_to_it(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    calibration = data / "cal.json"
    calibration.write_text(json.dumps({"params": {}}))
    sweep, plan = data / "cpu.csv", data / "plan.json"
    cpu_sweep(sweep, str(calibration.resolve()))
    assert main(["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "64", "--layout", "pp=2,mbs=1", "--save", str(plan)]) == 0
    monkeypatch.chdir(tmp_path)  # inputs given relative to the working directory, and absolute
    out = tmp_path / "reports" / "r"
    assert main(["report", "--sweep", "data/cpu.csv", "--plan", str(plan), "--out", str(out)]) == 0
    for name in ("report.html", "report.md"):
        text = (out / name).read_text()
        assert str(tmp_path) not in text, name
        assert "../../data/cal.json" in text and "../../data/plan.json" in text
        assert "../../../data" not in text  # each path rewritten once
    assert "plan.json" not in path_forms(["plan.json"], tmp_path / "r")  # a bare file name in the text is left alone
