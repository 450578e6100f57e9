"""One command line for the first run and every requeue, decided before launching (in-process, no workers).

The checkpoints here are written by ``plait.run.checkpoint.store`` directly (a manifest over a
dummy file): what ``plait train`` decides from them - resume, start fresh, refuse - does not
depend on the tensors, and ``--dry-run`` shows the decision without launching.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.run.checkpoint import lock, store
from plait.run.launcher.request import TrainRequest
from plait.run.launcher.resolve import fresh_config

ARGS = ("--model", "tiny", "--global-batch", "8", "--seq-len", "32", "--seed", "1234", "--lr", "1e-3",
        "--warmup-steps", "1", "--device", "cpu", "--steps", "6", "--nproc-per-node", "2")


def request_of() -> TrainRequest:
    """The request ``ARGS`` make."""
    return TrainRequest(model="tiny", global_batch=8, seq_len=32, seed=1234, lr=1e-3, warmup_steps=1, steps=6,
                        nproc_per_node=2, device="cpu")


def fake_checkpoint(root, step: int, run: dict | None = None) -> None:
    """``root/step_N`` with one data file and a valid manifest of the run ``ARGS`` describe."""
    run = run if run is not None else fresh_config(request_of()).config.to_dict()
    temporary = root / store.temp_name(step, "x")
    temporary.mkdir(parents=True)
    (temporary / "__0_0.distcp").write_bytes(bytes(range(64)) * step)
    store.write_manifest(temporary, step, store.file_records(temporary, ["__0_0.distcp"]), run,
                         {"layout": "dp=2", "world_size": 2})
    store.commit(temporary, root / store.final_name(step))


def dry_run(capsys, *args: str) -> tuple[int, str, str, dict | None]:
    code = main(["train", *args, "--dry-run"])
    captured = capsys.readouterr()
    config = json.loads(captured.out.split("config.json:\n", 1)[1]) if code == 0 else None
    return code, captured.out, captured.err, config


def test_the_same_command_starts_fresh_then_resumes(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    code, _, err, config = dry_run(capsys, *ARGS, "--checkpoint-dir", str(ckpt))
    assert code == 0, err
    assert config["checkpoint"]["resume_from"] is None
    fake_checkpoint(ckpt, 2)
    fake_checkpoint(ckpt, 4)
    code, out, err, config = dry_run(capsys, *ARGS, "--checkpoint-dir", str(ckpt))
    assert code == 0, err
    assert config["checkpoint"]["resume_from"] == str((ckpt / store.final_name(4)).resolve())
    assert f"checkpoints go to {ckpt.resolve()}" in out


def test_a_requeue_of_a_finished_run_says_so_and_exits_0(tmp_path, capsys):
    fake_checkpoint(tmp_path, 6)  # ARGS: --steps 6 (issue 31 item 4: this exited 2)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for extra in ((), ("--resume", str(tmp_path))):
        assert main(["train", *ARGS, "--checkpoint-dir", str(tmp_path), *extra]) == 0
        out = capsys.readouterr().out
        assert "already finished at step 6" in out, out
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no lock, nothing written
    assert main(["train", *ARGS[:-4], "--steps", "4", *ARGS[-2:], "--resume", str(tmp_path)]) == 2
    assert "nothing to train" in capsys.readouterr().err  # fewer steps than saved: refused


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--lr", "3e-3", "--lr 0.003 differs from the checkpoint's 0.001"),
    ("--seed", "0", "--seed 0 differs from the checkpoint's 1234"),
    ("--warmup-steps", "2", "--warmup-steps 2 differs from the checkpoint's 1"),
    ("--global-batch", "16", "global batch 8; a resumed run keeps it (asked: 16)"),
    ("--model", "tiny-gpt", "holds model tiny, not tiny-gpt"),
])
def test_a_requeue_refuses_a_different_run_naming_both_values(tmp_path, capsys, flag, value, message):
    fake_checkpoint(tmp_path, 2)
    args = list(ARGS)
    args[args.index(flag) + 1] = value
    code, _, err, _ = dry_run(capsys, *args, "--checkpoint-dir", str(tmp_path))
    assert code == 2 and message in err, err


def test_equal_flags_are_accepted_on_an_explicit_resume(tmp_path, capsys):
    fake_checkpoint(tmp_path, 2)
    code, _, err, config = dry_run(capsys, "--resume", str(tmp_path), "--lr", "0.001", "--seed", "1234",
                                   "--device", "cpu", "--nproc-per-node", "2")
    assert code == 0, err
    assert config["optim"]["lr"] == 1e-3


def test_fresh_refuses_an_existing_checkpoint_and_resume_starts_an_empty_directory(tmp_path, capsys):
    fake_checkpoint(tmp_path / "full", 2)
    code, _, err, _ = dry_run(capsys, *ARGS, "--checkpoint-dir", str(tmp_path / "full"), "--fresh")
    assert code == 2 and "--fresh" in err and "already holds checkpoints" in err
    code, _, err, _ = dry_run(capsys, *ARGS, "--resume", str(tmp_path / "full"), "--fresh")
    assert code == 2 and "either --fresh or --resume" in err
    code, out, err, config = dry_run(capsys, *ARGS, "--resume", str(tmp_path / "new"))
    assert code == 0, err
    assert "holds no checkpoint yet: starting from step 0" in out
    assert config["checkpoint"]["dir"] == str((tmp_path / "new").resolve())
    assert config["checkpoint"]["resume_from"] is None


def test_a_resumed_run_writes_beside_the_resumed_checkpoint(tmp_path, capsys):
    original = tmp_path / "ck"
    fake_checkpoint(original, 2)
    copy = tmp_path / "ck2"
    subprocess.run(["cp", "-r", str(original), str(copy)], check=True)
    code, out, err, config = dry_run(capsys, "--resume", str(copy), "--device", "cpu", "--nproc-per-node", "2")
    assert code == 0, err
    assert config["checkpoint"]["dir"] == str(copy.resolve())  # the manifest records ck
    assert f"checkpoints go to {copy.resolve()}" in out


def edit_manifest(path, change, rehash: bool) -> None:
    file = path / store.MANIFEST
    manifest = json.loads(file.read_text())
    change(manifest)
    if rehash:
        manifest["checksum"] = store.manifest_checksum(manifest)
    file.write_text(json.dumps(manifest, indent=1))


def one_byte(old: str, new: str):
    def change(path):
        file = path / store.MANIFEST
        text = file.read_text()
        assert old in text
        file.write_text(text.replace(old, new, 1))
    return change


@pytest.mark.parametrize(("edit", "reason"), [
    (one_byte('"step": 4', '"step": 3'), "fails its checksum"),
    (one_byte('"lr": 0.001', '"lr": 0.002'), "fails its checksum"),
    (lambda p: edit_manifest(p, lambda m: m.update(step=3), rehash=True), "says step 3"),
    (lambda p: edit_manifest(p, lambda m: m.pop("files"), rehash=True), "lacks 'files'"),
    (lambda p: edit_manifest(p, lambda m: m.update(step="4"), rehash=True), "not a step count"),
    (lambda p: edit_manifest(p, lambda m: m["files"].update({"x": {"bytes": "1"}}), rehash=True), "malformed"),
    (lambda p: edit_manifest(p, lambda m: m.update(run={"job": 7}), rehash=True), "malformed run config"),
    (lambda p: edit_manifest(p, lambda m: m.update(run=[]), rehash=True), "'run' is not an object"),
])
def test_an_edited_or_malformed_manifest_is_refused_and_the_previous_checkpoint_used(tmp_path, capsys, edit,
                                                                                     reason):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4)
    edit(tmp_path / store.final_name(4))
    code, out, err, config = dry_run(capsys, *ARGS, "--checkpoint-dir", str(tmp_path))
    assert code == 0, err
    assert reason in out and "refused" in out
    assert config["checkpoint"]["resume_from"].endswith(store.final_name(2))


def test_a_manifest_without_checksum_still_loads_with_a_note(tmp_path, capsys):
    fake_checkpoint(tmp_path, 2)
    edit_manifest(tmp_path / store.final_name(2), lambda m: m.pop("checksum"), rehash=False)
    code, out, err, config = dry_run(capsys, *ARGS, "--checkpoint-dir", str(tmp_path))
    assert code == 0, err
    assert "has no checksum (written by an earlier plait)" in out
    assert config["checkpoint"]["resume_from"].endswith(store.final_name(2))


def test_a_leftover_temporary_directory_is_removed_and_reported(tmp_path, capsys):
    from plait.run.launcher.launch import LaunchOptions
    from plait.run.launcher.checkpoint_dir import take_checkpoint_dir

    fake_checkpoint(tmp_path, 2)
    leftover = tmp_path / store.temp_name(4, "dead")
    leftover.mkdir()
    (leftover / "__0_0.distcp").write_bytes(b"\0" * (3 << 20))
    held = take_checkpoint_dir(tmp_path, fresh_config(request_of()).resumed, LaunchOptions())
    try:
        assert not leftover.exists()
        assert f"removed {leftover.name}, left by a failed save (3.0 MiB)" in capsys.readouterr().out
        assert (tmp_path / store.final_name(2)).is_dir()
    finally:
        held.release()
    assert not (tmp_path / lock.LOCK_NAME).exists()


def test_a_live_run_holds_the_directory_and_a_dead_one_does_not(tmp_path, capsys):
    held = lock.acquire(tmp_path)
    try:
        code = main(["train", *ARGS, "--checkpoint-dir", str(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2 and "is in use by another plait train run" in err
        assert f"pid {os.getpid()} on {socket.gethostname()}" in err and len(err.strip().splitlines()) == 1
    finally:
        held.release()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / lock.LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone.stdout),
                                                       "started": 0}))
    taken = lock.acquire(tmp_path)
    try:
        assert taken.owned and "process" in taken.notes[0] and "is gone" in taken.notes[0]
        with pytest.raises(PlaitError, match="in use by another plait train run"):
            lock.acquire(tmp_path)
        with pytest.raises(PlaitError, match="in use"):  # on this host the live process decides, not the lease
            lock.acquire(tmp_path, lease_s=-1.0)
    finally:
        taken.release()
    # an owner on another host that stopped renewing: stale by its age
    (tmp_path / lock.LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": os.getpid(), "started": 0}))
    by_age = lock.acquire(tmp_path, lease_s=-1.0)
    assert by_age.owned and "not renewed for" in by_age.notes[0]
    by_age.release()


def test_the_nodes_of_one_job_share_the_lock(tmp_path):
    first = lock.acquire(tmp_path, job="head:29500#job42")
    second = lock.acquire(tmp_path, job="head:29500#job42")
    assert first.owned and not second.owned
    second.release()
    assert (tmp_path / lock.LOCK_NAME).exists()
    with pytest.raises(PlaitError):
        lock.acquire(tmp_path, job="head:29500#other")
    first.release()


def test_multi_node_jobs_get_their_own_rendezvous_id(tmp_path, capsys, monkeypatch):
    # issue 31 item 7: the default id was the fixed "plait", so two jobs on one endpoint joined each other
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    base = [*ARGS[:-2], "--nproc-per-node", "1", "--nnodes", "2", "--rdzv-endpoint", "head:29500"]

    def rdzv_id(*extra: str) -> str:
        code, out, err, _ = dry_run(capsys, *base, *extra)
        assert code == 0, err
        return out.split("--rdzv-id=", 1)[1].split()[0]

    first = rdzv_id()
    assert first.startswith("plait-") and first == rdzv_id()  # every node of the job computes the same
    assert rdzv_id("--lr", "3e-3") != first  # another job
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert rdzv_id() not in (first, "plait")  # another allocation of the same command
    assert rdzv_id("--rdzv-id", "job42") == "job42"
