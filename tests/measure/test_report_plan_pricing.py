"""``plait report --sweep DIR --plan FILE`` never re-prices a saved plan with a calibration for another
device without saying so (issue 31, item 9): a plan saved for A100s beside a CPU sweep whose
calibration is a CPU profile shows the plan's own saved step time, names both devices in the text and
in the picture's title, and says in one line that the devices differ."""

from __future__ import annotations

import hashlib
import json

from plait.cli import main
from plait.measure.report.chart_data import duration
from plait.measure.sweep.csv_file import SweepRow, SweepWriter
from plait.plan.calibration import read_calibration
from plait.plan.plan import evaluate, load_plan, plan_parts_of

PLAN_ARGS = ["plan", "--model", "llama-125m", "--cluster", "dgx-a100", "--gpus", "8", "--global-batch", "64",
             "--seq-len", "1024", "--layout", "dp=4,pp=2,mbs=2", "--save"]
# a CPU profile: host seconds per step and per layer that an A100 does not pay
CPU_CALIBRATION = {"format": "plait-calibration/1", "gpu": None, "device": "cpu", "processes_per_node": 2,
                   "params": {"step_overhead_s": 30.0, "layer_overhead_s": 0.05}}


def _cpu_sweep(tmp_path, calibration: dict):
    cal = tmp_path / "cpu_calibration.json"
    cal.write_text(json.dumps(calibration))
    sweep = tmp_path / "sweep" / "sweep.csv"
    sweep.parent.mkdir()
    common = dict(model="tiny", global_batch=8, seq_len=64, nproc_per_node=2, steps=5, device="cpu", gpu="",
                  calibration=str(cal), calibration_sha256=hashlib.sha256(cal.read_bytes()).hexdigest()[:16])
    writer = SweepWriter(sweep)
    writer.write(SweepRow("dp=2,tp=1,pp=1,cp=1,mbs=1", "ok", planner_rank=1, predicted_step_time_s=0.03,
                          measured_step_time_s=0.034, **common).with_errors())
    writer.write(SweepRow("dp=1,tp=1,pp=2,cp=1,mbs=2", "ok", planner_rank=2, predicted_step_time_s=0.05,
                          measured_step_time_s=0.048, **common).with_errors())
    writer.close()
    return sweep, cal


def _report(tmp_path, calibration: dict, capsys):
    plan = tmp_path / "plan.json"
    assert main([*PLAN_ARGS, str(plan)]) == 0
    data = json.loads(plan.read_text())  # as if saved with an A100 calibration: every item 0.75 of the defaults'
    prediction = data["prediction"]
    prediction["time_items_s"] = {k: 0.75 * v for k, v in prediction["time_items_s"].items()}
    prediction["step_time_s"] *= 0.75
    plan.write_text(json.dumps(data))
    sweep, cal = _cpu_sweep(tmp_path, calibration)
    out = tmp_path / "r"
    capsys.readouterr()
    assert main(["report", "--sweep", str(sweep), "--plan", str(plan), "--out", str(out)]) == 0
    saved = load_plan(plan)["prediction"]["step_time_s"]
    repriced = evaluate(*plan_parts_of(load_plan(plan)), read_calibration(cal).params).step.step_time
    return (out / "report.md").read_text(), capsys.readouterr().err, saved, repriced, out


def test_a_plan_for_a100_beside_a_cpu_calibration_shows_its_own_prediction(tmp_path, capsys):
    md, err, saved, repriced, out = _report(tmp_path, CPU_CALIBRATION, capsys)
    assert repriced > 2 * saved  # the CPU profile's host seconds would change the picture
    assert f"| step time | {duration(saved)} |" in md  # the plan's own prediction is what the table shows
    assert f"| step time saved in the plan file | {duration(saved)} |" in md
    assert "a100-80g" in md and "for CPU" in md  # both devices named
    lines = [line for line in md.splitlines() if "is for CPU, the plan" in line]
    assert len(lines) == 1 and "not re-priced" in lines[0] and duration(repriced) in lines[0]
    assert "is for CPU, the plan" in err and "a100-80g" in err
    assert "Priced with: time: the plan's own saved prediction" in md  # above the picture
    assert (out / "plan.png").stat().st_size > 0 and (out / "timeline.png").stat().st_size > 0


def test_the_pictures_titles_say_how_the_plan_was_priced(tmp_path, capsys, monkeypatch):
    from plait.measure.report import plan_plots, plots

    titles = []
    monkeypatch.setattr(plan_plots, "save_figure", lambda fig, path: titles.append(fig._suptitle.get_text()) or path)
    original = plots.timeline_plot
    monkeypatch.setattr(plots, "timeline_plot", lambda intervals, path, title, *a, **k:
                        titles.append(title) or original(intervals, path, title, *a, **k))
    _report(tmp_path, CPU_CALIBRATION, capsys)
    assert len(titles) == 2
    for title in titles:
        assert "the plan's own saved prediction" in title and "a100-80g" in title and "CPU" in title


def test_a_calibration_for_the_plans_gpu_reprices_it_labelled(tmp_path, capsys):
    calibration = {"format": "plait-calibration/1", "gpu": "a100-80g", "device": "cuda",
                   "params": {"step_overhead_s": 30.0}}
    md, err, saved, repriced, _ = _report(tmp_path, calibration, capsys)
    assert f"| step time | {duration(repriced)} |" in md and f"| step time saved in the plan file | {duration(saved)} |" in md
    assert "re-priced with the sweep's calibration" in md and "for a100-80g" in md
    assert "is for CPU" not in md


def test_an_unreadable_saved_prediction_falls_back_to_the_defaults_and_says_so(tmp_path):
    from plait.measure.report.plan_pricing import price_saved_plan

    plan = tmp_path / "plan.json"
    assert main([*PLAN_ARGS, str(plan)]) == 0
    cal = tmp_path / "cpu.json"
    cal.write_text(json.dumps(CPU_CALIBRATION))
    data = json.loads(plan.read_text())
    default = evaluate(*plan_parts_of(data)).step.step_time
    for bad in (-1.0, 1e300, "0.1", True, None):  # (NaN: the strict JSON reader refuses the file)
        data["prediction"]["time_items_s"]["compute"] = bad
        plan.write_text(json.dumps(data))
        priced = price_saved_plan(str(plan), read_calibration(cal), str(cal))
        assert priced.plan.step.step_time == default  # the saved items are not drawn
        assert "the plan file's prediction is unreadable" in priced.label and "is for CPU" in priced.notes[0]
