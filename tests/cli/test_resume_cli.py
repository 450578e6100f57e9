"""Never lose a run, end to end through ``plait train`` (torchrun, gloo ranks on CPU).

* A rank is SIGKILLed in the middle of a step, and later (after torchrun restarted the job)
  in the middle of writing a checkpoint: each restart resumes from the newest complete
  checkpoint, the half-written one is never used, and the run ends where the uninterrupted
  run ends.
* A corrupted newest checkpoint is refused from its manifest, set aside (not deleted), and the
  previous one is used.
* SIGTERM makes the workers finish their step, save and stop (exit 143).
* Bad input is refused before anything is written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

import checkpoint_tasks
import tolerances
from test_train_cli import plait, read_jsonl, run_inline

from plait.run.checkpoint import store
from plait.run.config import OptimConfig

# the CLI defaults this test's runs use, as an OptimConfig for the in-pool reference
CLI_ARGS = ("--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--seed", "1234", "--lr", "1e-3",
            "--warmup-steps", "1", "--device", "cpu")
CLI_OPTIM = OptimConfig(lr=1e-3, warmup_steps=1)
STEPS = 6


def step_lines(path) -> list[dict]:
    return [line for line in read_jsonl(path) if "step" in line and "loss" in line and "summary" not in line]


def losses_by_step(path) -> dict[int, list[float]]:
    """{step: its losses}: the step lines and those set aside when a resumed run re-ran them (the
    "replayed" lines), so that a re-run step's losses can be compared with its first run's."""
    by_step: dict[int, list[float]] = {}
    lines = read_jsonl(path)
    replayed = [old for line in lines if line.get("event") == "replayed" for old in line["lines"]]
    for line in replayed + lines:
        if "step" in line and "loss" in line and "summary" not in line:
            by_step.setdefault(line["step"], []).append(line["loss"])
    return by_step


@pytest.fixture(scope="module")
def uninterrupted(dist_pool):
    return dist_pool(2).run(checkpoint_tasks.train, "dp=2", steps=STEPS, optim=CLI_OPTIM, with_params=False)[0]


def test_killed_rank_and_killed_checkpoint_write_recover_automatically(tmp_path, uninterrupted):
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    faults = "rank=1,step=3,kind=kill,attempt=0;rank=0,step=4,kind=kill-in-save,attempt=1"
    proc = plait("train", *CLI_ARGS, "--layout", "dp=2,mbs=1", "--nproc-per-node", "2", "--steps", str(STEPS),
                 "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--keep-checkpoints", "0",
                 "--max-restarts", "2", "--log", str(log), env={"PLAIT_INJECT_FAULT": faults}, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    events = [line for line in read_jsonl(log) if "event" in line]
    resumes = [e for e in events if e["event"] == "resume"]
    # attempt 0 died in step 3 (after saving step 2); attempt 1 died committing step 4 -> both resume at 2
    assert [(e["restart"], e["step"]) for e in resumes] == [(1, 2), (2, 2)]
    assert "restart 1: resuming from" in proc.stdout and "restart 2: resuming from" in proc.stdout
    # the restart notes name the rank that died, and how (not the survivors' connection errors)
    assert "rank 1 was killed by SIGKILL (exit -9)" in proc.stdout and "(restart 1 of 2)" in proc.stdout
    assert "rank 0 was killed by SIGKILL (exit -9)" in proc.stdout and "(restart 2 of 2)" in proc.stdout
    assert sorted(line["step"] for line in step_lines(log)) == list(range(1, STEPS + 1))  # each step once
    by_step = losses_by_step(log)
    # a re-run step reproduces its first run bit for bit
    assert all(len(set(losses)) == 1 for losses in by_step.values()), by_step
    assert sorted(by_step) == list(range(1, STEPS + 1))  # JSONL steps count from 1
    # torchrun's ranks and the pool's run other thread counts: the BLAS sums in another order
    assert [by_step[s + 1][0] for s in range(STEPS)] == pytest.approx(uninterrupted["losses"], rel=tolerances.LOSS_RTOL)
    assert [p.name for p in store.complete_dirs(ckpt)] == [store.final_name(s) for s in (2, 4, 6)]
    assert not [p for p in ckpt.iterdir() if ".tmp-" in p.name], "the killed write was not cleaned up"
    for path in store.complete_dirs(ckpt):
        store.verify(path)


def test_corrupt_newest_checkpoint_is_refused_and_the_previous_one_used(dist_pool, tmp_path, uninterrupted):
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    dist_pool(2).run(checkpoint_tasks.train, "dp=2", stop_after=4, steps=STEPS, optim=CLI_OPTIM, with_params=False,
                     checkpoint_dir=str(ckpt), checkpoint_every=2)
    newest = ckpt / store.final_name(4)
    victim = max(p for p in newest.iterdir() if p.suffix == ".distcp")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern, same size: only the CRC-32 can tell
    victim.write_bytes(bytes(data))
    proc = plait("train", "--resume", str(ckpt), "--nproc-per-node", "2", "--device", "cpu", "--log", str(log),
                 timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step_00000004 is corrupt" in proc.stdout and "CRC-32" in proc.stdout and "set aside" in proc.stdout
    assert (ckpt / (store.final_name(4) + ".corrupt-0") / victim.name).is_file(), "the refused one must be kept"
    resumed = step_lines(log)
    assert [line["step"] for line in resumed] == [3, 4, 5, 6]  # resumed after 2 steps: the 3rd step on
    assert [line["loss"] for line in resumed] == pytest.approx(uninterrupted["losses"][2:], rel=tolerances.LOSS_RTOL)
    assert store.verify(ckpt / store.final_name(6)).step == 6


def test_truncated_newest_checkpoint_is_refused_before_launch(dist_pool, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    dist_pool(2).run(checkpoint_tasks.train, "dp=2", stop_after=4, steps=STEPS, with_params=False,
                     checkpoint_dir=str(ckpt), checkpoint_every=2)
    victim = max(p for p in (ckpt / store.final_name(4)).iterdir() if p.suffix == ".distcp")
    victim.write_bytes(victim.read_bytes()[:-16])
    before = sorted(p.name for p in ckpt.rglob("*"))
    code, out, err = run_inline(capsys, "train", "--resume", str(ckpt), "--device", "cpu", "--dry-run")
    assert code == 0, err
    assert "step_00000004 is corrupt" in out and "truncated" in out
    assert json.loads(out.split("config.json:\n", 1)[1])["checkpoint"]["resume_from"].endswith(store.final_name(2))
    assert sorted(p.name for p in ckpt.rglob("*")) == before, "a dry run must not touch the checkpoints"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_saves_a_checkpoint_and_stops(tmp_path, stop):
    """SIGTERM (a scheduler preempting the job) and Ctrl-C's SIGINT (SIGHUP too, a closed terminal:
    tests/run/test_stop_signals.py) finish the step, save and exit 128 + the signal; before, SIGINT
    only said a save was requested and none was made (issue 31 item 4)."""
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "plait.cli", "train", *CLI_ARGS, "--layout", "dp=2",
                             "--nproc-per-node", "2", "--steps", "100000", "--checkpoint-dir", str(ckpt),
                             "--log", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (log.is_file() and len(step_lines(log)) >= 2):
            time.sleep(0.2)
        assert log.is_file(), "training did not start"
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + stop, err[-3000:]
    assert f"stopped by {stop.name}" in err and f"{stop.name}: finishing the step" in out
    saved = store.complete_dirs(ckpt)
    assert len(saved) == 1
    checkpoint = store.verify(saved[0])
    summary = read_jsonl(log)[-1]
    assert summary["summary"] and summary["stopped_early"] and summary["checkpoints"] == [checkpoint.step]
    assert checkpoint.step == step_lines(log)[-1]["step"]


@pytest.fixture(scope="module")
def saved4(dist_pool, tmp_path_factory):
    root = tmp_path_factory.mktemp("saved4")
    dist_pool(4).run(checkpoint_tasks.train, "dp=4,zero=3", stop_after=1, steps=STEPS, with_params=False,
                     checkpoint_dir=str(root))
    return root


def test_resume_on_another_world_size_replans(saved4, capsys):
    code, out, err = run_inline(capsys, "train", "--resume", str(saved4), "--nproc-per-node", "2", "--device", "cpu",
                                "--dry-run")
    assert code == 0, err
    assert "world size 4 → 2: re-planned layout dp=4" in out
    config = json.loads(out.split("config.json:\n", 1)[1])
    assert config["job"]["layout"].startswith(("dp=2", "dp=1")) and config["job"]["global_batch"] == 8
    assert config["checkpoint"]["resume_from"].endswith(store.final_name(1))
    code, out, err = run_inline(capsys, "train", "--resume", str(saved4), "--layout", "pp=2,tp=2", "--device", "cpu",
                                "--dry-run")
    assert code == 0, err
    assert json.loads(out.split("config.json:\n", 1)[1])["job"]["layout"].startswith("dp=1,tp=2,pp=2")


@pytest.mark.parametrize(("args", "message"), [
    (("--nproc-per-node", "5"), "no layout of 5 processes runs tiny with the saved global batch 8"),
    (("--model", "tiny-gpt"), "holds model tiny, not tiny-gpt"),
    (("--global-batch", "16"), "keeps it (asked: 16)"),
])
def test_bad_resume_is_refused_before_anything_is_written(saved4, capsys, args, message):
    before = sorted(p.name for p in saved4.rglob("*"))
    code, _, err = run_inline(capsys, "train", "--resume", str(saved4), "--device", "cpu", *args)
    assert code == 2 and message in err, err
    assert sorted(p.name for p in saved4.rglob("*")) == before


def test_resuming_at_the_saved_step_says_the_run_is_finished(saved4, capsys):
    """--steps equal to the saved step: a requeue of a finished run, exit 0, nothing written (issue 31)."""
    before = sorted(p.name for p in saved4.rglob("*"))
    code, out, err = run_inline(capsys, "train", "--resume", str(saved4), "--device", "cpu", "--steps", "1")
    assert code == 0 and "already finished at step 1" in out + err, out + err
    assert sorted(p.name for p in saved4.rglob("*")) == before


def test_other_bad_checkpoint_input(tmp_path, saved4, capsys):
    code, _, err = run_inline(capsys, "train", "--resume", str(tmp_path / "nope"), "--device", "cpu")
    assert code == 2 and "no such directory" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_inline(capsys, "train", "--resume", str(tmp_path / "empty"), "--device", "cpu")
    assert code == 2 and "no valid checkpoint" in err
    code, _, err = run_inline(capsys, "train", *CLI_ARGS, "--nproc-per-node", "2", "--checkpoint-dir", str(saved4),
                              "--fresh")
    assert code == 2 and "already holds checkpoints" in err
    code, _, err = run_inline(capsys, "train", *CLI_ARGS, "--nproc-per-node", "2", "--checkpoint-every", "2")
    assert code == 2 and "--checkpoint-every needs --checkpoint-dir" in err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_inline(capsys, "train", *CLI_ARGS, "--nproc-per-node", "2", "--checkpoint-dir",
                              str(blocker / "sub"))
    assert code == 2 and "not writable" in err


def test_faults_spec_is_checked():
    from plait.errors import PlaitError
    from plait.run.env import RankEnv
    from plait.run.faults import FaultPlan, parse_fault

    assert parse_fault("rank=1,step=3,kind=kill").kind == "kill"
    with pytest.raises(PlaitError, match="kind"):
        parse_fault("rank=1,step=3,kind=explode")
    os.environ["PLAIT_INJECT_FAULT"] = "rank=0,step=2,attempt=1;rank=0,step=5,kind=nan"
    try:
        assert FaultPlan.from_environ(RankEnv(rank=0)).step_fault.kind == "nan"
        assert not FaultPlan.from_environ(RankEnv(rank=1))
        assert FaultPlan.from_environ(RankEnv(rank=0, restart_count=1)).step_fault.step == 2
    finally:
        del os.environ["PLAIT_INJECT_FAULT"]
