"""``plait plan --plot``, ``plait report --plan`` without a sweep, ``plait report --train-log`` and the
CPU sweep's memory chart: files written and valid, the data behind them, bad input, no matplotlib
in a plain ``plait plan``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from torchless import assert_runs_without_torch

from plait.cli import main
from plait.measure.report.train_log import loss_summary, read_train_log
from plait.measure.sweep.csv_file import SweepRow, SweepWriter

PNG = b"\x89PNG\r\n\x1a\n"
PLAN_ARGS = ["plan", "--model", "llama-125m", "--cluster", "dgx-h100", "--gpus", "4", "--global-batch", "64",
             "--seq-len", "1024"]


def test_plan_plot_writes_a_picture(tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert main([*PLAN_ARGS, "--layout", "pp=4,mbs=1", "--explain", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 20000
    assert f"wrote the plan's picture to {out}" in capsys.readouterr().out
    svg = tmp_path / "plan.svg"  # the suffix picks the format; --json keeps stdout one JSON document
    assert main([*PLAN_ARGS, "--top", "1", "--json", "--plot", str(svg)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["layout_string"] and "wrote the plan's picture" in captured.err
    assert svg.read_text().lstrip().startswith("<?xml")


def test_plan_plot_refuses_an_unknown_suffix_before_writing_anything(tmp_path, capsys):
    saved = tmp_path / "plan.json"
    code = main([*PLAN_ARGS, "--layout", "pp=4,mbs=1", "--save", str(saved), "--plot", str(tmp_path / "plan.jpg")])
    err = capsys.readouterr().err
    assert code == 2 and "ending in .png, .svg, .pdf" in err and len(err.strip().splitlines()) == 1
    assert not saved.exists()


def test_plan_without_plot_never_imports_matplotlib():
    script = ("import sys\nfrom plait.cli import main\n"
              f"assert main({[*PLAN_ARGS, '--top', '2', '--explain']!r}) == 0\n"
              "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\nprint('no-matplotlib')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and "no-matplotlib" in out.stdout, out.stderr[-2000:]


def _saved_plan(tmp_path, layout="pp=4,mbs=1"):
    path = tmp_path / "plan.json"
    assert main([*PLAN_ARGS, "--layout", layout, "--save", str(path)]) == 0
    return path


def test_report_of_a_plan_alone(tmp_path, capsys):
    plan = _saved_plan(tmp_path)
    out = tmp_path / "r"
    assert main(["report", "--plan", str(plan), "--out", str(out)]) == 0
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    for name in ("plan.png", "timeline.png"):
        assert (out / name).read_bytes()[:8] == PNG and f'src="{name}"' in html and f"({name})" in md
    assert not (out / "step_time.png").exists() and not (out / "memory.png").exists()
    assert "plait plan report: llama-125m" in md and "| layout | dp=1,tp=1,pp=4" in md
    assert "| 3 |" in md  # the per-stage memory table has a row per pipeline stage
    assert "warning" not in capsys.readouterr().err


def test_plan_report_says_when_the_saved_prediction_differs(tmp_path):
    plan = _saved_plan(tmp_path, "tp=4,mbs=1")
    data = json.loads(plan.read_text())
    data["prediction"]["step_time_s"] *= 2  # as if saved with a calibration
    plan.write_text(json.dumps(data))
    assert main(["report", "--plan", str(plan), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "when it was saved" in md and "the plan has no pipeline" in md


def write_train_log(path) -> None:
    lines = [{"step": s, "loss": 6.0 - 0.1 * s, "lr": 1e-3 * s / 10, "step_time_s": 0.1} for s in range(1, 11)]
    lines.insert(5, {"step": 5, "eval_loss": 5.6})
    lines += [{"event": "resume", "step": 8, "checkpoint": "ckpt/step-8"},
              {"step": 9, "loss": 4.95, "lr": 9e-4, "step_time_s": 0.1},  # the resumed run's step 9 replaces it
              {"step": 10, "eval_loss": 5.0}, {"summary": True, "steps": 10, "final_loss": 4.95}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n{\"step\": 11, \"lo")  # cut by a kill


def test_train_log_curves(tmp_path):
    log = tmp_path / "train.jsonl"
    write_train_log(log)
    curves = read_train_log(log)
    assert [s for s, _ in curves.loss] == list(range(1, 11))
    assert dict(curves.loss)[9] == 4.95 and dict(curves.loss)[10] == pytest.approx(5.0)
    assert curves.eval_loss == [(5, 5.6), (10, 5.0)] and curves.resumes == [8]
    assert curves.lr[-1] == (10, pytest.approx(1e-3)) and curves.summary["steps"] == 10
    text = loss_summary(curves)
    assert "10 steps logged (1 to 10)" in text and "the last 5.0000 at step 10" in text and "resumed at step 8" in text


def test_report_of_a_train_log(tmp_path):
    log = tmp_path / "train.jsonl"
    write_train_log(log)
    out = tmp_path / "r"
    assert main(["report", "--train-log", str(log), "--out", str(out)]) == 0
    assert (out / "loss.png").read_bytes()[:8] == PNG and (out / "loss.png").stat().st_size > 10000
    md = (out / "report.md").read_text()
    assert "## Training loss" in md and "(loss.png)" in md and "train loss 5.9000 at step 1" in md


@pytest.mark.parametrize("argv,message", [
    ([], "needs something to report"),
    (["--train-log", "missing.jsonl"], "file not found"),
    (["--train-log", "{empty}"], "no step with a loss"),
    (["--plan", "missing.json"], "file not found"),
])
def test_report_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"summary": True}) + "\n")
    argv = [str(empty) if a == "{empty}" else str(tmp_path / a) if a.endswith((".jsonl", ".json")) else a
            for a in argv]
    code = main(["report", *argv, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cpu_sweep_memory_chart_is_per_process(tmp_path):
    sweep = tmp_path / "cpu.csv"
    writer = SweepWriter(sweep)
    for layout, rss in (("dp=2,tp=1,pp=1,cp=1,mbs=1", 3.1e8), ("dp=1,tp=2,pp=1,cp=1,mbs=1", 3.3e8)):
        writer.write(SweepRow(layout, "ok", planner_rank=1, measured_step_time_s=0.1, step_time_min_s=0.09,
                              step_time_max_s=0.13, measured_memory_bytes=rss, memory_kind="host_rss",
                              model="tiny", global_batch=4, seq_len=32, nproc_per_node=2, steps=6, device="cpu"))
    writer.close()
    out = tmp_path / "r"
    assert main(["report", "--sweep", str(sweep), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "per CPU process, on an axis scaled to what is drawn" in md
    assert "0.0900-0.1300" in md  # the measured range beside the median
    assert "Whiskers: the fastest and the slowest steady-state step" in md


def test_plan_report_does_not_import_torch(tmp_path):
    plan = _saved_plan(tmp_path)
    log = tmp_path / "train.jsonl"
    write_train_log(log)
    assert_runs_without_torch(["report", "--plan", str(plan), "--train-log", str(log), "--out", str(tmp_path / "r")])
