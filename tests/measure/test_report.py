"""``plait report`` and the pipeline timeline: schedule properties, the files written from a
synthetic sweep, bad input, and no torch."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from torchless import assert_runs_without_torch

from plait.cli import main
from plait.measure.report.plots import row_label
from plait.measure.sweep.loop import summary_path
from plait.measure.sweep.csv_file import SweepRow, SweepWriter
from plait.measure.report.timeline import (
    BACKWARD,
    BUBBLE,
    FORWARD,
    pipeline_timeline,
    plan_timeline,
    timeline_bubble_fraction,
)
from plait.plan.cost import bubble_fraction
from plait.plan.plan import evaluate
from plait.spec.hardware import cluster_for_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

RUNS = Path(__file__).resolve().parents[3] / "shared" / "data" / "published_runs_calibration.csv"
SCHEDULES = [("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("1f1b", 3, 7, 1), ("gpipe", 4, 8, 1), ("gpipe", 3, 2, 1),
             ("interleaved-1f1b", 2, 4, 2), ("interleaved-1f1b", 4, 8, 2), ("interleaved-1f1b", 4, 4, 3),
             ("interleaved-1f1b", 2, 2, 2)]


# ----------------------------------------------------------------- timeline
@pytest.mark.parametrize("schedule,pp,m,vpp", SCHEDULES)
def test_timeline_is_a_valid_schedule(schedule, pp, m, vpp):
    intervals = pipeline_timeline(schedule, pp, m, forward_s=1.0, backward_s=2.0, vpp=vpp)
    for rank in range(pp):  # no two intervals of one rank overlap
        mine = sorted((i for i in intervals if i.rank == rank), key=lambda i: i.start)
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(mine))
    work = [i for i in intervals if i.kind != BUBBLE]
    counts = Counter((i.kind, i.stage, i.microbatch) for i in work)
    stages = pp * vpp
    assert set(counts) == {(k, s, mb) for k in (FORWARD, BACKWARD) for s in range(stages) for mb in range(m)}
    assert set(counts.values()) == {1}  # one forward and one backward per stage and micro-batch
    at = {(i.kind, i.stage, i.microbatch): i for i in work}
    for mb in range(m):
        for s in range(stages):
            assert at[(FORWARD, s, mb)].rank == s % pp
            if s > 0:
                assert at[(FORWARD, s - 1, mb)].end <= at[(FORWARD, s, mb)].start + 1e-9
            if s < stages - 1:
                assert at[(BACKWARD, s + 1, mb)].end <= at[(BACKWARD, s, mb)].start + 1e-9
            assert at[(FORWARD, s, mb)].end <= at[(BACKWARD, s, mb)].start + 1e-9
    if schedule in ("1f1b", "gpipe") or m % pp == 0:
        assert timeline_bubble_fraction(intervals) == pytest.approx(bubble_fraction(schedule, pp, m, vpp))


def test_1f1b_keeps_at_most_pp_minus_rank_micro_batches_in_flight():
    intervals = sorted(pipeline_timeline("1f1b", 4, 8, 1.0, 2.0), key=lambda i: i.start)
    for rank in range(4):
        in_flight = peak = 0
        for i in (i for i in intervals if i.rank == rank and i.kind != BUBBLE):
            in_flight += 1 if i.kind == FORWARD else -1
            peak = max(peak, in_flight)
        assert peak == 4 - rank  # GPipe would hold all 8


def test_plan_timeline_bubble_matches_the_planners():
    model, job = get_model("llama-125m"), JobSpec(global_batch=16, seq_len=1024)
    cluster = cluster_for_gpu("h100-sxm", 4, 4)
    for text in ("pp=4,mbs=1,schedule=1f1b", "pp=4,mbs=2,schedule=gpipe", "pp=4,vpp=3,mbs=1,ckpt=full"):
        plan = evaluate(model, cluster, job, Layout.parse(text))
        intervals = plan_timeline(plan)
        per_rank_bubble = sum(i.end - i.start for i in intervals if i.kind == BUBBLE) / plan.layout.pp
        assert per_rank_bubble == pytest.approx(plan.step.bubble, rel=1e-6)


def test_unsupported_timeline_is_a_clear_error():
    from plait.errors import PlaitError

    with pytest.raises(PlaitError, match="zero-bubble"):
        pipeline_timeline("zero-bubble", 2, 4, 1.0, 2.0)
    with pytest.raises(PlaitError, match="multiple of pp"):
        pipeline_timeline("interleaved-1f1b", 4, 6, 1.0, 2.0, vpp=2)


# ----------------------------------------------------------------- report files
def synthetic_sweep(path, **extra) -> None:
    """A GPU-like sweep of tiny on 2 GPUs: predicted and measured values, one OOM, one invalid."""
    common = dict(model="tiny", global_batch=8, seq_len=64, nproc_per_node=2, steps=5, device="cuda", gpu="h100-sxm",
                  memory_kind="cuda_allocated", **extra)
    writer = SweepWriter(path)
    for layout, rank, pred, meas, mfu in (("dp=2,tp=1,pp=1,cp=1,mbs=1", 1, 0.030, 0.034, 0.020),
                                          ("dp=1,tp=2,pp=1,cp=1,mbs=1", 2, 0.040, 0.045, 0.015),
                                          ("dp=1,tp=1,pp=2,cp=1,mbs=2", 3, 0.050, 0.048, 0.012)):
        writer.write(SweepRow(layout, "ok", planner_rank=rank, predicted_step_time_s=pred, measured_step_time_s=meas,
                              predicted_memory_bytes=3.0e7, measured_memory_bytes=3.3e7, predicted_mfu=mfu * 1.1,
                              measured_mfu=mfu, tokens_per_s=8 * 64 / meas, **common).with_errors())
    writer.write(SweepRow("dp=2,tp=1,pp=1,cp=1,mbs=4", "oom", reason="CUDA out of memory", planner_rank=4, **common))
    writer.write(SweepRow("dp=1,tp=3,pp=1,cp=1,mbs=1", "invalid", reason="needs 3 processes", **common))
    writer.close()


def test_report_writes_html_markdown_and_plots(tmp_path, capsys):
    sweep = tmp_path / "sweep.csv"
    synthetic_sweep(sweep)
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "64", "--layout", "pp=2,vpp=2,mbs=1", "--save", str(plan)]) == 0
    out = tmp_path / "report"
    # the published runs live in shared/ beside the checkout; a bare clone reports without them
    runs = ["--runs", str(RUNS)] if RUNS.is_file() else []
    code = main(["report", "--sweep", str(sweep), "--plan", str(plan), "--out", str(out), *runs])
    assert code == 0, capsys.readouterr().err
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    for name in ("step_time.png", "mfu.png", "memory.png", "timeline.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert f'src="{name}"' in html and f"({name})" in md
    for text in (html, md):
        assert "dp=1,tp=1,pp=2,cp=1,mbs=2" in text and "CUDA out of memory" in text
        assert "Spearman" in text and "+1.000" in text  # predicted and measured step times in the same order
        assert "interleaved-1f1b" in text  # the timeline of the given plan
        assert ("per-source" in text) == bool(runs)
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html and "http" not in html


def test_report_reuses_the_sweeps_calibration_and_tolerance(tmp_path, capsys):
    calibration = tmp_path / "cal.json"
    calibration.write_text(json.dumps({"params": {"cuda_context_bytes": 3 * 2**30}}))
    sweep = tmp_path / "sweep.csv"
    synthetic_sweep(sweep, calibration=str(calibration.resolve()),
                    calibration_sha256=hashlib.sha256(calibration.read_bytes()).hexdigest()[:16])
    summary_path(sweep).write_text(json.dumps({"top1_tolerance": 0.5}))
    out = tmp_path / "r"
    assert main(["report", "--sweep", str(sweep), "--out", str(out)]) == 0
    md, err = (out / "report.md").read_text(), capsys.readouterr().err
    assert "calibration ../cal.json" in md and "warning" not in err  # relative to the report in r/
    assert "(within 50%)" in md  # the sweep's --top1-tolerance, not the default 3%
    assert "| 3.000 |" in md  # the calibrated CUDA context (3 GiB) in the memory items
    calibration.write_text(json.dumps({"params": {"cuda_context_bytes": 2**30}}))
    assert main(["report", "--sweep", str(sweep), "--out", str(out)]) == 0
    assert "changed since the sweep" in capsys.readouterr().err
    assert "changed since the sweep" in (out / "report.md").read_text()
    calibration.unlink()
    assert main(["report", "--sweep", str(sweep), "--out", str(out)]) == 0
    assert "is missing: the report uses the default cost parameters" in capsys.readouterr().err


def test_plot_labels_tell_compile_twins_apart():
    eager = SweepRow("dp=2,tp=1,pp=1,cp=1,mbs=1", "ok")
    assert row_label(eager) == "dp=2,mbs=1"
    assert row_label(dataclasses.replace(eager, compile=True)) == "dp=2,mbs=1 +compile"


def test_cpu_sweep_report_says_what_is_missing(tmp_path):
    sweep = tmp_path / "cpu.csv"
    writer = SweepWriter(sweep)
    writer.write(SweepRow("dp=2,tp=1,pp=1,cp=1,mbs=1", "ok", planner_rank=1, measured_step_time_s=0.1,
                          measured_memory_bytes=3e8, memory_kind="host_rss", model="tiny", global_batch=4, seq_len=32,
                          nproc_per_node=2, steps=2, device="cpu"))
    writer.close()
    stale = tmp_path / "r" / "timeline.png"  # left by an earlier report into the same directory
    stale.parent.mkdir()
    stale.write_bytes(b"old")
    assert main(["report", "--sweep", str(sweep), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "no MFU: a CPU run has no peak FLOP/s" in md and "no swept layout has pp > 1" in md and "not comparable" in md
    assert "peak host RSS of a CPU process" in md  # the memory plot says what it measured
    assert not (tmp_path / "r" / "mfu.png").exists() and not stale.exists()
    assert (tmp_path / "r" / "memory.png").is_file()


# ----------------------------------------------------------------- bad input
HEADER = "layout,status,predicted_step_time_s,measured_step_time_s\n"


@pytest.mark.parametrize("content,message", [
    (None, "not found"),
    ("", "not a plait sweep CSV"),
    ("a,b\n1,2\n", "missing column(s) layout, status"),
    (HEADER, "no layouts (an empty sweep)"),
    (HEADER + "dp=2,ok,0.1,fast\n", "line 2: measured_step_time_s 'fast' is not a number"),
    (HEADER + "dp=2,great,0.1,0.2\n", "status 'great' is not one of"),
    (HEADER + "dp=2,ok,0.1\n", "different count"),
    (HEADER + "dp=2,ok,0.1,0.2,9\n", "different count"),
])
def test_bad_sweep_file_is_one_line_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "bad.csv"
    if content is not None:
        path.write_text(content)
    code = main(["report", "--sweep", str(path), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_report_does_not_import_torch(tmp_path):
    sweep = tmp_path / "sweep.csv"
    synthetic_sweep(sweep)
    assert_runs_without_torch(["report", "--sweep", str(sweep), "--out", str(tmp_path / "r")])
