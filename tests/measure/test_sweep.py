"""``plait sweep``: layouts from a grid / list / the planner, a real CPU sweep through ``plait train``
(ok, invalid, refused and failed layouts in one sweep), statistics and bad input."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import subprocess
import time

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.measure.sweep.loop import run_sweep, summary_path
from plait.measure.sweep.cases import (
    SweepCase,
    SweepSpec,
    make_cases,
    parse_grid,
    top_k_entries,
)
from plait.measure.sweep.csv_file import SweepRow, read_sweep
from plait.measure.sweep.run_one import (
    base_row,
    classify,
    run_case,
    start_train,
    stop_train,
    worker_pids,
)
from plait.measure.sweep.stats import average_ranks, spearman, summarize, top1_text
from plait.run.config import RunConfig, TrainJob
from plait.run.launcher.outcome import Outcome, read_outcome
from plait.spec.hardware import cluster_for_gpu
from plait.spec.models import get_model


def tiny_spec(**changes) -> SweepSpec:
    values = dict(model=get_model("tiny"), model_arg="tiny", cluster=cluster_for_gpu("h100-sxm", 2, 2),
                  global_batch=4, seq_len=32, steps=2, nproc_per_node=2, device="cpu", timeout_s=120.0)
    values.update(changes)
    return SweepSpec(**values)


# ----------------------------------------------------------------- statistics
def test_average_ranks_share_ties():
    assert average_ranks([3, 1, 3, 2]).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert average_ranks([5, 5, 5]).tolist() == [2.0, 2.0, 2.0]


def test_spearman_against_hand_computed_values():
    # x ranks 1, 2.5, 2.5, 4; y ranks 1, 3, 2, 4: sum dx·dy = 4.5, sum dx² = 4.5, sum dy² = 5
    assert spearman([1, 2, 2, 3], [10, 30, 20, 40]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert spearman([1, 2, 3, 4], [8, 6, 4, 2]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [0.1, 0.3, 0.2]) == pytest.approx(0.5)  # 1 - 6·2 / (3·8)
    assert spearman([1, 1, 1], [1, 2, 3]) is None  # constant: undefined, not 0
    assert spearman([1], [2]) is None


def test_summary_uses_predictions_when_recorded_and_checks_top1():
    rows = [SweepRow("a", "ok", planner_rank=1, predicted_step_time_s=1.0, measured_step_time_s=1.10,
                     memory_kind="cuda_allocated", predicted_memory_bytes=100.0, measured_memory_bytes=90.0).with_errors(),
            SweepRow("b", "ok", planner_rank=2, predicted_step_time_s=2.0, measured_step_time_s=1.00,
                     memory_kind="cuda_allocated").with_errors(),
            SweepRow("c", "oom", reason="CUDA out of memory", planner_rank=3)]
    s = summarize(rows, top1_tolerance=0.05)
    assert s["rank_correlation"]["basis"] == "predicted vs measured step time"
    assert s["rank_correlation"]["spearman"] == pytest.approx(-1.0)
    assert s["step_time_error"]["n"] == 2
    assert s["step_time_error"]["median_abs"] == pytest.approx((0.10 + 0.50) / 2)
    assert s["memory_error"]["n"] == 1 and s["memory_error"]["mean_abs"] == pytest.approx(0.10)
    assert s["planner_top1"] == "a" and s["best_measured"] == "b"
    assert s["top1_gap"] == pytest.approx(0.10) and s["top1_within_tolerance"] is False
    assert s["by_status"]["oom"] == 1


def test_top1_is_checked_per_compile_setting_and_fails_when_rank_1_did_not_run():
    rows = [SweepRow("a", "oom", reason="CUDA out of memory", planner_rank=1),
            SweepRow("b", "ok", planner_rank=2, measured_step_time_s=1.0),
            SweepRow("a", "ok", compile=True, planner_rank=1, measured_step_time_s=0.9),
            SweepRow("b", "ok", compile=True, planner_rank=2, measured_step_time_s=0.6)]
    s = summarize(rows, top1_tolerance=0.03)
    eager, compiled = s["top1_checks"]
    assert eager["compile"] is False and eager["planner_top1"] == "a" and eager["top1_status"] == "oom"
    assert eager["top1_within_tolerance"] is False and eager["top1_gap"] is None  # not rank 2 instead
    assert top1_text(eager, 0.03).startswith("top-1 failed (oom)")
    assert s["planner_top1"] == "a" and s["top1_status"] == "oom"  # the top-level keys: the eager check
    assert compiled["compile"] is True and compiled["best_measured"] == "b"  # compiled vs compiled only
    assert compiled["top1_gap"] == pytest.approx(0.9 / 0.6 - 1) and compiled["top1_within_tolerance"] is False


def test_ranks_go_to_fitting_layouts_only_and_compile_twins_are_priced_apart():
    spec = tiny_spec(global_batch=8)
    texts = ["dp=2,mbs=1", "dp=2,mbs=4"]
    totals = [case.plan.memory.total for case in make_cases(spec, [(t, False) for t in texts])]
    assert totals[0] < totals[1]
    gpu = dataclasses.replace(spec.cluster.gpu, hbm_bytes=(totals[0] + totals[1]) / 2)  # mbs=4 no longer fits
    small = tiny_spec(global_batch=8, cluster=dataclasses.replace(spec.cluster, gpu=gpu))
    cases = make_cases(small, [("dp=2,mbs=4", False), ("dp=2,mbs=1", False), ("dp=2,mbs=1", True),
                               ("dp=2,mbs=2", True)])
    assert [c.predicted_fits for c in cases] == [False, True, True, True]
    assert cases[0].planner_rank is None  # predicted out of memory: no rank, flagged
    eager, compiled = cases[1].plan, cases[2].plan  # the same layout without and with compile
    assert (eager.compiled, compiled.compiled) == (0.0, 1.0)
    assert compiled.step.elementwise < eager.step.elementwise and compiled.step.step_time < eager.step.step_time
    assert cases[2].planner_rank < cases[1].planner_rank  # ranked apart: the compiled twin first
    assert sorted(c.planner_rank for c in cases[1:]) == [1, 2, 3]
    assert base_row(small, cases[0]).predicted_fits is False


@pytest.mark.parametrize("outcome,code,status", [
    (Outcome("failed", "training failed on rank 1: injected fault (PLAIT_INJECT_FAULT)", failed_rank=1), 2, "failed"),
    (Outcome("refused", "layout dp=2,ckpt=balanced: ckpt=balanced is planned but not run yet"), 2, "refused"),
    (Outcome("oom", "training failed on rank 0: CUDA out of memory. Tried", failed_rank=0), 2, "oom"),
    (Outcome("stopped", "stopped by SIGTERM: the workers were asked to finish", signal="SIGTERM"), 143, "failed"),
    (Outcome("ok", exit_code=0), 1, "failed"),
    (None, 1, "failed"),
])
def test_classify_outcomes(outcome, code, status):
    got, reason = classify(outcome, code, "Segmentation fault")
    assert got == status
    assert reason and "\n" not in reason
    if outcome is not None and outcome.reason:
        assert outcome.reason in reason
    if outcome is None:
        assert "exit status 1" in reason and "outcome.json" in reason and "Segmentation fault" in reason


# ----------------------------------------------------------------- layouts
def test_grid_is_a_product_and_dp_fills_the_processes():
    entries = parse_grid("tp=1,2;mbs=1,2;compile=0,1", world_size=2)
    assert len(entries) == 8
    assert ("tp=2,mbs=1,dp=1", True) in entries and ("tp=1,mbs=2,dp=2", False) in entries
    assert parse_grid("dp=1,2", 2) == [("dp=1", False), ("dp=2", False)]


@pytest.mark.parametrize("grid,message", [
    ("", "--grid is empty"), ("tp", "not key=v1,v2"), ("foo=1,2", "foo"), ("tp=1;tp=2", "given twice"),
    ("compile=maybe", "not 0 or 1"),
])
def test_bad_grid_is_one_clear_error(grid, message):
    with pytest.raises(PlaitError, match=message):
        parse_grid(grid, 2)


def test_invalid_entries_are_recorded_with_the_reason():
    cases = make_cases(tiny_spec(), [("dp=2", False), ("tp=3", False), ("dp=1", False), ("dp=2,mbs=3", False),
                                     ("nonsense", False)])
    reasons = [c.invalid_reason for c in cases]
    assert reasons[0] == "" and cases[0].planner_rank == 1 and cases[0].plan is not None
    assert "needs dp·tp·pp·cp = 3 processes" in reasons[1]
    assert "needs dp·tp·pp·cp = 1 processes" in reasons[2]
    assert "not a multiple of dp·mbs" in reasons[3]
    assert "not key=value" in reasons[4]


def test_top_k_takes_runnable_layouts_in_planner_order():
    entries, skipped = top_k_entries(tiny_spec(global_batch=8), 3)
    assert len(entries) == 3 and skipped >= 0
    cases = make_cases(tiny_spec(global_batch=8), entries)
    assert [c.planner_rank for c in cases] == [1, 2, 3]
    for case in cases:
        config = RunConfig(job=TrainJob(model=case.plan.model, layout=case.layout, global_batch=8, seq_len=32))
        assert config.runtime_problems() == []


# ----------------------------------------------------------------- a real sweep
def test_real_cpu_sweep_records_every_outcome_and_goes_on(tmp_path):
    spec = tiny_spec()
    cases = make_cases(spec, [("dp=2", False), ("tp=3", False), ("dp=2,opt_offload=1", False),
                              ("dp=2,zero=3", False)])
    failing = cases[3]
    cases[3] = SweepCase(failing.text, failing.layout, plan=failing.plan, planner_rank=failing.planner_rank,
                         env=(("PLAIT_INJECT_FAULT", "rank=1,step=1"),))
    out = tmp_path / "sweep.csv"
    rows, _ = run_sweep(spec, cases, out, progress=False, workdir=tmp_path / "runs")
    assert [r.status for r in rows] == ["ok", "invalid", "refused", "failed"]
    # plait train said how each run ended in RUN_DIR/outcome.json (the invalid layout never ran)
    outcomes = [read_outcome(tmp_path / "runs" / f"layout-{i:03d}" / "run") for i in range(4)]
    assert [o.status if o else None for o in outcomes] == ["ok", None, "refused", "failed"]
    assert outcomes[3].failed_rank == 1 and outcomes[3].exit_code == 2 and outcomes[0].exit_code == 0
    ok = rows[0]
    assert ok.measured_step_time_s > 0 and ok.tokens_per_s > 0
    assert ok.step_time_min_s <= ok.measured_step_time_s <= ok.step_time_max_s  # the spread
    assert ok.memory_kind == "host_tensors" and ok.measured_memory_bytes > 2**20  # counted tensor bytes
    assert ok.predicted_step_time_s is None and ok.measured_mfu is None  # CPU: nothing invented
    assert "optimizer offload" in rows[2].reason
    assert "training failed on rank 1" in rows[3].reason and "injected fault" in rows[3].reason
    # the file holds the same rows, readable by plait report
    assert [r.status for r in read_sweep(out)] == ["ok", "invalid", "refused", "failed"]
    written = json.loads(summary_path(out).read_text())
    assert written["by_status"]["ok"] == 1 and written["interrupted"] is False
    assert written["predictions_recorded_for"] is None and "CPU" in written["note"]


def test_timeout_stops_the_run_and_its_processes(tmp_path):
    spec = tiny_spec(timeout_s=0.5)
    case = make_cases(spec, [("dp=2", False)])[0]
    row = run_case(spec, case, tmp_path / "run")
    assert row.status == "timeout" and "0.5 s" in row.reason
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=False).stdout
    assert str(tmp_path / "run" / "train.jsonl") not in ps  # the run's process group is gone


def test_stopping_a_run_kills_its_workers_too(tmp_path):
    """torchrun's workers run in sessions of their own: killing plait train's process group does
    not reach them. Stop a run whose workers are training, with a grace too short for them to
    finish (the sweep's is 45 s), and check that no worker of it is left."""
    spec = tiny_spec(steps=100_000, global_batch=64, seq_len=256, kill_grace_s=0.2)  # steps of ~1 s
    case = make_cases(spec, [("dp=2", False)])[0]
    run_dir, log = tmp_path / "run", tmp_path / "train.jsonl"
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        proc = start_train(spec, case, log, run_dir, out, err)
        try:  # wait for the first step: the workers' SIGTERM handler is armed, they are training
            deadline = time.monotonic() + 60
            while not (log.is_file() and log.read_text().strip()) and time.monotonic() < deadline \
                    and proc.poll() is None:
                time.sleep(0.1)
            assert len(worker_pids(run_dir)) == 2, (tmp_path / "err.txt").read_text()[-2000:]
        finally:
            stop_train(proc, run_dir, spec.kill_grace_s)
    assert proc.returncode is not None
    assert worker_pids(run_dir) == []


def test_interrupted_sweep_keeps_its_rows(tmp_path, monkeypatch):
    spec = tiny_spec()
    cases = make_cases(spec, [("dp=2", False), ("dp=2,zero=3", False)])
    calls = []

    def fake_run(spec_, case, workdir):
        calls.append(case)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return SweepRow(layout=case.label, status="failed", reason="stub"), None

    monkeypatch.setattr("plait.measure.sweep.loop.run_once", fake_run)
    out = tmp_path / "sweep.csv"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, cases, out, progress=False)
    with out.open() as handle:
        assert len(list(csv.DictReader(handle))) == 1
    assert json.loads(summary_path(out).read_text())["interrupted"] is True


# ----------------------------------------------------------------- the command
SWEEP = ["sweep", "--model", "tiny", "--nproc-per-node", "2", "--global-batch", "4", "--seq-len", "32",
         "--device", "cpu", "--steps", "2"]


def test_sweep_where_every_layout_fails_says_why_and_exits_nonzero(tmp_path, capsys):
    out = tmp_path / "s.csv"
    calibration = tmp_path / "cal.json"
    calibration.write_text('{"params": {}}\n')
    code = main([*SWEEP, "--layout", "tp=3", "--layout", "dp=4", "--calibration", str(calibration),
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "no layout of the sweep ran" in err and "invalid" in err and "3 processes" in err
    rows = read_sweep(out)
    assert len(rows) == 2  # the rows are kept
    digest = hashlib.sha256(calibration.read_bytes()).hexdigest()[:16]
    assert {(r.calibration, r.calibration_sha256) for r in rows} == {(str(calibration.resolve()), digest)}
    summary = json.loads(summary_path(out).read_text())
    assert summary["calibration"] == str(calibration.resolve()) and summary["calibration_sha256"] == digest


@pytest.mark.parametrize("args,message", [
    (["--top", "0"], "--top must be at least 1"),
    (["--grid", "bogus=1"], "bogus"),
    (["--layout", "dp=2", "--steps", "0"], "--steps must be at least 1"),
    (["--layout", "dp=2", "--timeout", "0"], "--timeout must be positive"),
    (["--layout", "dp=2", "--data", "{missing}.tok"], "token file {missing}.tok not found"),
    (["--layout", "dp=2", "--gpu", "nope"], "nope"),
])
def test_bad_sweep_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, args, message):
    # an in-process launch earlier in the session may have set OMP_NUM_THREADS (run.launcher.launch), and
    # 2 processes x that many threads on a 2-core host add the oversubscription warning line
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    missing = str(tmp_path / "missing")  # a path this test knows does not exist
    args, message = [a.format(missing=missing) for a in args], message.format(missing=missing)
    code = main([*SWEEP, *args, "--out", str(tmp_path / "s.csv")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1

