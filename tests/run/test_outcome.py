"""RUN_DIR/outcome.json: the launcher's account of how a ``plait train`` run ended, and the sweep
reading it instead of stderr (the real runs that write it are in test_sweep's real CPU sweep)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plait.cli import main
from plait.errors import PlaitError, RunStopped
from plait.measure.sweep import run_one
from plait.measure.sweep.cases import SweepSpec, make_cases
from plait.run.config import RuntimeConfig
from plait.run.launcher.launch import RunFailed, record_refusal
from plait.run.launcher.outcome import (
    FORMAT,
    Outcome,
    failed_run,
    outcome_path,
    read_outcome,
    write_outcome,
)
from plait.spec.hardware import cluster_for_gpu
from plait.spec.models import get_model


# ----------------------------------------------------------------- the schema
def test_outcome_round_trips_with_its_format_tag(tmp_path):
    outcome = Outcome("failed", "training failed on rank 1: boom", failed_rank=1, exit_code=2, signal=None)
    assert outcome.to_dict() == {"format": FORMAT, "status": "failed", "reason": "training failed on rank 1: boom",
                                 "failed_rank": 1, "exit_code": 2, "signal": None}
    assert Outcome.from_dict(outcome.to_dict()) == outcome
    assert read_outcome(tmp_path) is None  # nothing written: the run died before
    path = write_outcome(tmp_path / "new", outcome)
    assert path == outcome_path(tmp_path / "new") and read_outcome(tmp_path / "new") == outcome
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["outcome.json"]  # no temporary file left


@pytest.mark.parametrize("data,message", [
    ({"status": "ok"}, "not a plait-outcome/1 outcome"),
    ({"format": "plait-outcome/2", "status": "ok"}, "format 'plait-outcome/2'"),
    ({"format": FORMAT, "status": "done"}, "'done' is not one of ok, refused"),
    ({"format": FORMAT, "status": "failed", "failed_rank": "1"}, "wrong type"),
    ([1, 2], "format 'list'"),
])
def test_bad_outcome_is_one_clear_error(tmp_path, data, message):
    outcome_path(tmp_path).write_text(json.dumps(data))
    with pytest.raises(PlaitError, match=message):
        read_outcome(tmp_path)
    outcome_path(tmp_path).write_text("{not json")
    with pytest.raises(PlaitError, match="outcome.json"):
        read_outcome(tmp_path)


# ----------------------------------------------------------------- the launcher's side
def write_rank_error(run_dir, rank, kind, message, time, traceback=None):
    record = {"rank": rank, "type": kind, "message": message, "time": time}
    if traceback:
        record["traceback"] = traceback
    (run_dir / f"error-rank{rank}.json").write_text(json.dumps(record))


def test_failed_run_names_the_first_failed_rank(tmp_path):
    write_rank_error(tmp_path, 0, "DistBackendError", "connection closed by peer", 2.0)
    write_rank_error(tmp_path, 1, "RuntimeError", "injected fault on rank 1", 1.0, "Traceback (most recent...)\n  x")
    outcome, message = failed_run(tmp_path, "training")
    assert outcome == Outcome("failed", "training failed on rank 1: injected fault on rank 1", failed_rank=1,
                              exit_code=2)
    assert message.splitlines()[0] == outcome.reason
    assert "Traceback" in message and "(ranks 0 also stopped)" in message


def test_out_of_memory_on_any_rank_is_oom(tmp_path):
    write_rank_error(tmp_path, 1, "DistBackendError", "connection closed by peer", 1.0)
    write_rank_error(tmp_path, 0, "OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", 1.5)
    outcome, _ = failed_run(tmp_path, "training", dead_rank=0, signal=None)
    assert outcome.status == "oom" and outcome.failed_rank == 0
    assert outcome.reason == "training failed on rank 0: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_worker_killed_without_an_error_file(tmp_path):
    (tmp_path / "error-rank3.json").write_text("{truncated")  # unreadable: skipped
    outcome, message = failed_run(tmp_path, "profiling", died="worker FAILED", dead_rank=3, signal="SIGKILL")
    assert outcome == Outcome("failed", message, failed_rank=3, exit_code=2, signal="SIGKILL")
    assert message == ("profiling failed: rank 3 was killed by SIGKILL (exit -9): out of memory or killed by the "
                       "scheduler?")
    outcome, message = failed_run(tmp_path, "profiling", died="worker FAILED")
    assert message == "profiling failed: a worker died without a message (worker FAILED)"


def test_the_killed_rank_is_named_before_the_survivors_collective_errors(tmp_path):
    """rank 1 was SIGKILLed (no error file); ranks 0 and 2 then failed in a collective, and wrote one first."""
    write_rank_error(tmp_path, 0, "DistBackendError", "Connection reset by peer", 1.0, "Traceback ...")
    write_rank_error(tmp_path, 2, "RuntimeError", "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer",
                     1.1)
    outcome, message = failed_run(tmp_path, "training", dead_rank=0, signal=None, exits={0: 1, 1: -9, 2: 1})
    assert outcome == Outcome("failed", "training failed: rank 1 was killed by SIGKILL (exit -9): out of memory or "
                              "killed by the scheduler?", failed_rank=1, exit_code=2, signal="SIGKILL")
    assert message.splitlines() == [outcome.reason, "(ranks 0, 2 also stopped; rank 0: Connection reset by peer)"]
    outcome, _ = failed_run(tmp_path, "training", exits={0: 1, 1: 3, 2: 1})
    assert outcome.reason == "training failed: rank 1 exited with status 3 without an error message"
    assert outcome.signal is None


def test_an_error_that_is_not_a_collective_is_the_root_cause(tmp_path):
    write_rank_error(tmp_path, 0, "DistBackendError", "Connection reset by peer", 1.0)
    write_rank_error(tmp_path, 1, "ValueError", "bad shape", 2.0, "Traceback ...")
    outcome, message = failed_run(tmp_path, "training", exits={0: 1, 1: 1})
    assert outcome.reason == "training failed on rank 1: bad shape" and "(ranks 0 also stopped)" in message


def test_a_restart_note_names_the_dead_rank(tmp_path):
    from plait.run.launcher.restarts import restart_note

    write_rank_error(tmp_path, 0, "DistBackendError", "Connection reset by peer", 1.0)
    note = restart_note(tmp_path, "training", {1: -9}, 1, 3)
    assert note == ("training failed: rank 1 was killed by SIGKILL (exit -9): out of memory or killed by the "
                    "scheduler?; torchrun restarts the workers (restart 1 of 3)")


class SavedConfig:
    """What launch() needs of a RunConfig here: something to save as RUN_DIR/config.json, a device."""

    runtime = RuntimeConfig(device="cpu")

    def save(self, path):
        path.write_text("{}")


def fake_torchrun(raised, run_dir, failing_rank=None):
    """torch.distributed.run.run that ends as ``raised`` says (None: ok), the failing rank's error file written."""
    def run(_args):
        if failing_rank is not None:
            write_rank_error(run_dir, failing_rank, "RuntimeError", "injected fault", 1.0)
        if raised is not None:
            raise raised
    return run


def child_failed(rank, exitcode):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    return ChildFailedError("plait.run.worker", {rank: ProcessFailure(rank, 4242, exitcode, "/nonexistent")})


@pytest.mark.parametrize("case", ["ok", "failed", "killed", "stopped", "refused"])
def test_launch_writes_the_outcome_on_every_exit(tmp_path, monkeypatch, case):
    import signal

    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from plait.run.launcher.launch import LaunchOptions, launch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_outcome(run_dir, Outcome("ok", exit_code=0))  # an earlier run's: never left standing
    write_rank_error(run_dir, 3, "RuntimeError", "an earlier run's error", 0.5)  # cleared by launch()
    raised = {"failed": child_failed(1, 1), "killed": child_failed(0, -9),
              "stopped": SignalException("SIGTERM", signal.SIGTERM)}.get(case)
    monkeypatch.setattr(torchrun, "run", fake_torchrun(raised, run_dir, 1 if case == "failed" else None))
    options = LaunchOptions(nproc_per_node=2, nnodes=2) if case == "refused" else LaunchOptions(nproc_per_node=2)
    if case == "ok":
        assert launch(SavedConfig(), options, str(run_dir)) == {}
    else:
        with pytest.raises(PlaitError) as error:
            launch(SavedConfig(), options, str(run_dir))
    outcome = read_outcome(run_dir)
    expected = {
        "ok": Outcome("ok", exit_code=0),
        "failed": Outcome("failed", "training failed on rank 1: injected fault", failed_rank=1, exit_code=2),
        "killed": Outcome("failed", "training failed: rank 0 was killed by SIGKILL (exit -9): out of memory or "
                          "killed by the scheduler?", failed_rank=0, exit_code=2, signal="SIGKILL"),
        "stopped": Outcome("stopped", outcome.reason, exit_code=143, signal="SIGTERM"),
        "refused": Outcome("refused", "multi-node without --rdzv-endpoint needs --node-rank and --master-addr",
                           exit_code=2),
    }[case]
    assert outcome == expected
    assert (case == "stopped") == outcome.reason.startswith("stopped by SIGTERM: the workers were asked")
    if case != "ok":
        assert str(error.value).splitlines()[0] == outcome.reason
        assert isinstance(error.value, {"stopped": RunStopped, "refused": PlaitError}.get(case, RunFailed))


def test_refusal_is_recorded_only_before_launch(tmp_path):
    record_refusal(None, PlaitError("nowhere to write"))  # no --run-dir: nothing to do
    record_refusal(str(tmp_path), RunFailed("training failed on rank 0: x"))  # launch() wrote that one
    record_refusal(str(tmp_path), RunStopped("stopped by SIGTERM"))
    assert read_outcome(tmp_path) is None
    record_refusal(str(tmp_path), PlaitError("layout dp=4 needs 4 processes\nsecond line"))
    assert read_outcome(tmp_path) == Outcome("refused", "layout dp=4 needs 4 processes", exit_code=2)


def test_plait_train_refused_before_launch_writes_its_outcome(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_outcome(run_dir, Outcome("ok", exit_code=0))  # an earlier run's: replaced
    code = main(["train", "--model", "tiny", "--layout", "dp=4", "--nproc-per-node", "2", "--global-batch", "8",
                 "--seq-len", "32", "--device", "cpu", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "needs dp·tp·pp·cp = 4 processes" in err
    outcome = read_outcome(run_dir)
    assert outcome.status == "refused" and outcome.exit_code == 2 and outcome.failed_rank is None
    assert "needs dp·tp·pp·cp = 4 processes" in outcome.reason and f"plait: error: {outcome.reason}" in err


# ----------------------------------------------------------------- the sweep reads the file, not stderr
FAKE_TRAIN = """
import json, sys
from pathlib import Path
run_dir, outcome, stderr, code = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if outcome:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "outcome.json").write_text(json.dumps(outcome))
sys.stderr.write(stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("outcome,stderr,code,status,reason", [
    (Outcome("oom", "training failed on rank 0: CUDA out of memory", failed_rank=0, exit_code=2), "", 2,
     "oom", "training failed on rank 0: CUDA out of memory"),
    (Outcome("refused", "layout tp=2: a refusal", exit_code=2), "\xff garbled \ufffd", 2,
     "refused", "layout tp=2: a refusal"),
    (Outcome("failed", "training failed on rank 1: injected", failed_rank=1, exit_code=2),
     "plait: error: CUDA out of memory\n", 2, "failed", "training failed on rank 1: injected"),
    (None, "plait: error: out of memory\nplait: error: training failed", 2,
     "failed", "exit status 2, no outcome.json written: plait: error: training failed"),
    (Outcome("stopped", "stopped by SIGTERM: the workers were asked", exit_code=143, signal="SIGTERM"), "", 143,
     "failed", "stopped by SIGTERM: the workers were asked"),
    (Outcome("ok", exit_code=0), "plait: error: out of memory", 0, "failed", "no summary line in the log"),
])
def test_sweep_takes_the_status_from_the_outcome_file(tmp_path, monkeypatch, outcome, stderr, code, status, reason):
    def fake_start(spec, case, log_path, run_dir, out, err):
        payload = json.dumps(outcome.to_dict() if outcome else None)
        return subprocess.Popen([sys.executable, "-c", FAKE_TRAIN, str(run_dir), payload, stderr, str(code)],
                                stdout=out, stderr=err, start_new_session=True)

    monkeypatch.setattr(run_one, "start_train", fake_start)
    spec = SweepSpec(model=get_model("tiny"), model_arg="tiny", cluster=cluster_for_gpu("h100-sxm", 2, 2),
                     global_batch=4, seq_len=32, steps=2, nproc_per_node=2, device="cpu", timeout_s=60.0)
    case = make_cases(spec, [("dp=2", False)])[0]
    write_outcome(tmp_path / "layout" / "run", Outcome("ok", exit_code=0))  # a reused --keep-runs directory
    row = run_one.run_case(spec, case, tmp_path / "layout")
    assert (row.status, row.reason) == (status, reason)
    assert row.elapsed_s is not None and row.measured_step_time_s is None


def test_a_peer_sigtermed_after_a_rank_failed_with_its_own_error_is_not_the_root_cause(tmp_path):
    """torchrun SIGTERMs the survivors of a failed rank; one it reaches before that rank's error file
    is written is a consequence, not the failure (a race the sweep test met under load)."""
    from plait.run.launcher.outcome import failed_run

    (tmp_path / "error-rank1.json").write_text(json.dumps({"rank": 1, "type": "PlaitError", "time": 1.0,
                                                           "message": "injected failure"}))
    outcome, message = failed_run(tmp_path, exits={0: -15, 1: 2})
    assert outcome.failed_rank == 1 and "injected failure" in outcome.reason
    # a rank killed by SIGKILL stays the root cause: the survivors' errors follow from it
    outcome, _ = failed_run(tmp_path, exits={0: -9, 1: 2})
    assert outcome.failed_rank == 0 and outcome.signal == "SIGKILL"
