"""Honest sweep timing without running anything: warm-up left out, medians and spreads, round-robin
repeats, the --min-time probe, the noisy flag, threads per process and the oversubscription
warning, old CSVs still read, bad flags. ``run_once`` is replaced by a fake that writes no process."""

from __future__ import annotations

import csv
import json

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.measure.sweep.cases import SweepSpec, make_cases
from plait.measure.sweep.csv_file import COLUMNS, SweepRow, read_sweep
from plait.measure.sweep.loop import run_sweep, summary_path
from plait.measure.sweep.threads import oversubscription, threads_per_process
from plait.measure.sweep.timing import (
    CPU_MIN_TIME_S,
    CPU_REPEATS,
    LayoutTiming,
    RunTiming,
    check_warmup,
    default_min_time_s,
    default_repeats,
    default_warmup_steps,
    noisy_flags,
    quartiles,
    run_timing,
    steps_for_min_time,
)
from plait.run.metrics import StepRecord, steady_state
from plait.spec.hardware import cluster_for_gpu
from plait.spec.models import get_model


def spec_of(**changes) -> SweepSpec:
    values = dict(model=get_model("tiny"), model_arg="tiny", cluster=cluster_for_gpu("h100-sxm", 2, 2),
                  global_batch=4, seq_len=32, steps=4, nproc_per_node=2, device="cpu")
    values.update(changes)
    return SweepSpec(**values)


# ----------------------------------------------------------------- statistics of one layout
@pytest.mark.parametrize("steps", range(1, 11))
def test_default_warmup_is_what_plait_train_summary_skips(steps):
    records = [StepRecord(i, 1.0, 1e-3, 1.0, 1.0, 1.0, None) for i in range(steps)]
    assert default_warmup_steps(steps) == steps - len(steady_state(records))


def test_a_step_run_under_the_memory_profiler_is_never_timed(tmp_path):
    """The counted-memory window (``"profiled": true`` in the step log) is left out of the sweep's
    and plait train's step times, after the positional warm-up, unless nothing else is left."""
    log = tmp_path / "run.jsonl"
    lines = [{"step": 1, "step_time_s": 9.0, "profiled": True}, {"step": 2, "step_time_s": 5.0, "profiled": True},
             {"step": 3, "step_time_s": 1.0}, {"summary": True, "step_time_s": 7.0}]
    log.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert run_timing(log, 1).step_times == (1.0,)  # step 1: warm-up; step 2: profiled
    lines[2]["profiled"] = True  # everything left was profiled: kept rather than nothing
    log.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert run_timing(log, 1).step_times == (5.0, 1.0)
    records = [StepRecord(i, 1.0, 1e-3, 1.0, t, 1.0, None, profiled=p)
               for i, (t, p) in enumerate([(9.0, True), (5.0, True), (1.0, False)])]
    assert [r.step_time_s for r in steady_state(records)] == [1.0]
    assert records[1].to_dict()["profiled"] is True and "profiled" not in records[2].to_dict()


def test_quartiles_interpolate_like_numpy():
    # positions 0.25·4 = 1 and 0.75·4 = 3 of [1, 2, 4, 8, 16]
    assert quartiles([16, 1, 8, 2, 4]) == (2, 8)
    # positions 0.75 and 2.25 of [1, 2, 3, 5]: 1 + 0.75·1 and 3 + 0.25·2
    assert quartiles([5, 3, 2, 1]) == pytest.approx((1.75, 3.5))
    assert quartiles([7.0]) == (7.0, 7.0)


def test_log_step_times_leave_out_the_warmup_and_summary(tmp_path):
    log = tmp_path / "train.jsonl"
    lines = [{"step": 2, "step_time_s": 0.2}, {"step": 0, "step_time_s": 3.0}, {"step": 1, "step_time_s": 0.1},
             {"summary": True, "step": 3, "step_time_s": 9.9}, {"event": "checkpoint"}]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    timing = run_timing(log, warmup=1)
    assert timing.step_times == (0.1, 0.2) and timing.median == pytest.approx(0.15)
    assert run_timing(log, warmup=3) is None


def test_one_run_spread_is_the_iqr_several_runs_the_range_of_medians():
    one = LayoutTiming.of([RunTiming((1.0, 2.0, 4.0, 8.0, 16.0), 1)])
    assert (one.step_time, one.step_iqr, one.spread, one.repeats, one.measured_steps) == (4.0, 6.0, 6.0, 1, 5)
    runs = [RunTiming((1.0, 1.2, 1.1), 1), RunTiming((2.0, 2.0, 2.1), 1), RunTiming((1.5, 1.4, 1.5), 1)]
    three = LayoutTiming.of(runs)
    assert three.step_time == 1.5  # the median of the medians 1.1, 2.0, 1.5
    assert (three.repeat_min, three.repeat_max) == (1.1, 2.0) and three.spread == pytest.approx(0.9)
    assert (three.step_min, three.step_max) == (1.0, 2.1) and three.repeats == 3


def test_min_time_steps_reach_the_time_at_the_probe_median():
    probe = RunTiming((0.2, 0.3, 0.25), warmup=1)  # median 0.25 s: 2 s need 8 steps after 1 warm-up
    assert steps_for_min_time(probe, 2.0, 4) == 9
    assert steps_for_min_time(probe, 0.1, 4) == 4  # never fewer than asked


def test_noisy_when_spread_exceeds_the_gap_to_the_nearest_neighbour():
    # ranking a (1.00), b (1.05), c (2.00): a and b are 0.05 apart, c is 0.95 from b
    flags = noisy_flags([1.0, 1.05, 2.0], [0.10, 0.01, 0.5])
    assert flags == [True, False, False]
    assert noisy_flags([1.0], [5.0]) == [False]  # one layout has no neighbour


def test_warmup_must_leave_a_step():
    check_warmup(3, 2)
    with pytest.raises(PlaitError, match="--steps 2 leaves no step to measure after 2 warm-up"):
        check_warmup(2, 2)


# ----------------------------------------------------------------- threads
def test_threads_per_process_flag_then_environment_then_cores():
    assert threads_per_process(3, 2, {"OMP_NUM_THREADS": "8"}, 2) == 3
    assert threads_per_process(None, 2, {"OMP_NUM_THREADS": "8"}, 2) == 8
    assert threads_per_process(None, 2, {}, 8) == 4
    assert threads_per_process(None, 4, {}, 2) == 1
    with pytest.raises(PlaitError, match="OMP_NUM_THREADS='many'"):
        threads_per_process(None, 2, {"OMP_NUM_THREADS": "many"}, 2)
    assert oversubscription(2, 1, 2) == ""
    assert "2 processes x 2 threads = 4 threads on 2 cores" in oversubscription(2, 2, 2)


# ----------------------------------------------------------------- the loop, with a fake run
def fake_runs(monkeypatch, times: dict[str, list[list[float]]], fail: dict[str, int] | None = None):
    """Replace run_once: layout -> the post-warm-up step times of its successive runs; calls recorded."""
    calls = []

    def run_once(spec, case, workdir):
        if case.invalid_reason:
            return SweepRow(case.text, "invalid", reason=case.invalid_reason), None
        index = sum(1 for c, _ in calls if c == case.text)
        calls.append((case.text, spec.steps))
        if fail and fail.get(case.text) == index:
            return SweepRow(case.text, "failed", reason="stub failure"), None
        steps = tuple(times[case.text][index])
        timing = RunTiming(steps, spec.warmup)
        row = SweepRow(case.text, "ok", global_batch=spec.global_batch, seq_len=spec.seq_len,
                       measured_step_time_s=timing.median, measured_memory_bytes=1e6 * (index + 1),
                       memory_kind="host_rss", elapsed_s=1.0, warmup_steps=spec.warmup)
        return row, timing

    monkeypatch.setattr("plait.measure.sweep.loop.run_once", run_once)
    return calls


def test_repeats_run_round_robin_and_rows_report_the_median_of_medians(tmp_path, monkeypatch):
    spec = spec_of(repeats=3)
    cases = make_cases(spec, [("dp=2,mbs=1", False), ("dp=2,mbs=2", False), ("tp=3", False)])
    times = {"dp=2,mbs=1": [[1.0, 1.0], [1.2, 1.2], [1.1, 1.1]], "dp=2,mbs=2": [[2.0], [2.4], [2.1]]}
    calls = fake_runs(monkeypatch, times)
    out = tmp_path / "s.csv"
    rows, summary = run_sweep(spec, cases, out, progress=False)
    assert [label for label, _ in calls] == ["dp=2,mbs=1", "dp=2,mbs=2"] * 3  # never one layout back to back
    assert [r.status for r in rows] == ["ok", "ok", "invalid"]
    first = rows[0]
    assert first.measured_step_time_s == pytest.approx(1.1) and first.repeats == 3
    assert (first.repeat_min_s, first.repeat_max_s) == (1.0, 1.2) and first.spread_s == pytest.approx(0.2)
    assert first.measured_memory_bytes == 3e6 and first.elapsed_s == 3.0  # largest peak, summed time
    assert first.tokens_per_s == pytest.approx(4 * 32 / 1.1)
    assert rows[1].measured_step_time_s == 2.1 and rows[1].noisy is False and first.noisy is False
    # the file holds the final rows in the cases' order, with the new columns
    written = read_sweep(out)
    assert [r.layout for r in written] == ["dp=2,mbs=1", "dp=2,mbs=2", "tp=3"]
    assert written[0].spread_s == pytest.approx(0.2) and written[0].warmup_steps == 1
    assert summary["noisy"] == [] and summary["repeats"] == 3 and summary["warmup_steps"] == 1


def test_a_failed_repeat_ends_the_layout_and_noisy_layouts_are_flagged(tmp_path, monkeypatch):
    spec = spec_of(repeats=2, global_batch=8)
    cases = make_cases(spec, [("dp=2,mbs=1", False), ("dp=2,mbs=2", False), ("dp=2,mbs=4", False)])
    times = {"dp=2,mbs=1": [[1.0], [1.4]], "dp=2,mbs=2": [[1.1], [1.3]], "dp=2,mbs=4": [[3.0]]}
    calls = fake_runs(monkeypatch, times, fail={"dp=2,mbs=4": 1})
    out = tmp_path / "s.csv"
    rows, summary = run_sweep(spec, cases, out, progress=False)
    assert len(calls) == 6
    assert rows[2].status == "failed" and rows[2].reason == "run 2 of 2: stub failure"
    # medians 1.2 and 1.2: each spread (0.4, 0.2) exceeds the gap (0) between them
    assert [r.noisy for r in rows] == [True, True, None]
    assert summary["noisy"] == ["dp=2,mbs=1", "dp=2,mbs=2"]
    with out.open() as handle:
        assert [r["noisy"] for r in csv.DictReader(handle)] == ["1", "1", ""]


def test_min_time_probe_extends_the_steps_and_does_not_count(tmp_path, monkeypatch):
    spec = spec_of(steps=3, min_time_s=1.0)  # warm-up 1 (from --steps 3, kept for longer runs)
    cases = make_cases(spec, [("dp=2,mbs=1", False), ("dp=2,mbs=2", False)])
    times = {"dp=2,mbs=1": [[0.1, 0.1], [0.1] * 10], "dp=2,mbs=2": [[0.6, 0.6]]}
    calls = fake_runs(monkeypatch, times)
    rows, _ = run_sweep(spec, cases, tmp_path / "s.csv", progress=False)
    # the fast layout's 0.2 s probe is discarded and it runs again with 1 + 10 steps; the slow one's counts
    assert calls == [("dp=2,mbs=1", 3), ("dp=2,mbs=2", 3), ("dp=2,mbs=1", 11)]
    assert rows[0].repeats == 1 and rows[0].measured_steps == 10 and rows[1].measured_steps == 2


def test_old_sweep_csv_without_timing_columns_still_reads(tmp_path):
    old = [c for c in COLUMNS if c not in ("warmup_steps", "measured_steps", "repeats", "step_time_min_s",
                                            "step_time_max_s", "step_time_iqr_s", "repeat_min_s", "repeat_max_s",
                                            "spread_s", "noisy", "threads_per_process")]
    path = tmp_path / "old.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=old)
        writer.writeheader()
        writer.writerow({c: "" for c in old} | {"layout": "dp=2", "status": "ok", "measured_step_time_s": "0.5"})
    (row,) = read_sweep(path)
    assert row.measured_step_time_s == 0.5 and row.noisy is None and row.repeats is None


# ----------------------------------------------------------------- the command
SWEEP = ["sweep", "--model", "tiny", "--nproc-per-node", "2", "--global-batch", "4", "--seq-len", "32",
         "--device", "cpu", "--steps", "2"]


@pytest.mark.parametrize("args,message", [
    (["--warmup-steps", "2"], "--steps 2 leaves no step to measure after 2 warm-up step(s)"),
    (["--warmup-steps", "-1"], "--warmup-steps -1: must be 0 or more"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--min-time", "-1"], "--min-time -1.0: must be 0 or more seconds"),
    (["--threads-per-process", "0"], "--threads-per-process 0: must be at least 1"),
])
def test_bad_timing_flags_are_one_line_exit_2(tmp_path, capsys, args, message):
    code = main([*SWEEP, "--layout", "dp=2", *args, "--out", str(tmp_path / "s.csv")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_oversubscription_is_warned_at_the_start_and_threads_recorded(tmp_path, capsys):
    out = tmp_path / "s.csv"
    code = main([*SWEEP, "--layout", "tp=3", "--threads-per-process", "4096", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1  # the only layout is invalid: nothing ran
    assert "plait: warning: 2 processes x 4096 threads = 8192 threads on" in err
    assert read_sweep(out)[0].threads_per_process == 4096
    assert json.loads(summary_path(out).read_text())["threads_per_process"] == 4096



def _spec_of_command(argv: list[str]) -> SweepSpec:
    from plait.cli import build_parser
    from plait.cli.sweep import _spec

    return _spec(build_parser().parse_args(argv))


def test_cpu_runs_default_to_three_repeats_of_at_least_one_second(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    spec = _spec_of_command([*SWEEP, "--layout", "dp=2", "--out", "s.csv"])
    assert spec.threads_per_process is not None  # CPU runs
    assert (spec.repeats, spec.min_time_s) == (CPU_REPEATS, CPU_MIN_TIME_S) == (3, 1.0)
    # given values are kept, zero included
    spec = _spec_of_command([*SWEEP, "--layout", "dp=2", "--repeats", "1", "--min-time", "0", "--out", "s.csv"])
    assert (spec.repeats, spec.min_time_s) == (1, 0.0)


def test_gpu_runs_default_to_one_run_of_the_steps_given(monkeypatch):
    import plait.cli.sweep as sweep_command

    monkeypatch.setattr(sweep_command, "_threads", lambda args: None)  # what GPU runs resolve to
    spec = _spec_of_command([*SWEEP, "--layout", "dp=2", "--out", "s.csv"])
    assert (spec.repeats, spec.min_time_s) == (1, 0.0)
    assert (default_repeats(False), default_min_time_s(False)) == (1, 0.0)
    assert (default_repeats(True), default_min_time_s(True)) == (CPU_REPEATS, CPU_MIN_TIME_S)
