"""A Slurm requeue, end to end: the same ``plait train`` command line, killed and run again, ends where the
uninterrupted run ends; a resume from a copied checkpoint directory leaves the original alone.

Real launches (torchrun, gloo ranks on CPU), kept few.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

import checkpoint_tasks
from test_resume_cli import CLI_ARGS, CLI_OPTIM, losses_by_step, step_lines
from test_train_cli import plait, read_jsonl

from plait.run.checkpoint import lock, store

STEPS = 8


@pytest.fixture(scope="module")
def uninterrupted(dist_pool):
    return dist_pool(2).run(checkpoint_tasks.train, "dp=2", steps=STEPS, optim=CLI_OPTIM, with_params=False)[0]


def launch_and_kill_the_group(args: list[str], log, env: dict) -> subprocess.Popen:
    """Start ``plait train``, SIGKILL its whole process group (launcher and workers, as a lost node or a
    scheduler would) once the log shows the 5th step (JSONL "step": 5) done after a resume; returns the ended process."""
    proc = subprocess.Popen([sys.executable, "-m", "plait.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            lines = read_jsonl(log) if log.is_file() else []
            resumed = [i for i, line in enumerate(lines) if line.get("event") == "resume"]
            if resumed and any(line.get("step", -1) >= 5 and "loss" in line for line in lines[resumed[-1]:]):
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc


def test_the_same_command_line_survives_two_kills_and_ends_at_the_uninterrupted_losses(tmp_path, uninterrupted):
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    args = ["train", *CLI_ARGS, "--layout", "dp=2,mbs=1", "--nproc-per-node", "2", "--steps", str(STEPS),
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--log", str(log)]
    # 1st run: rank 1 is SIGKILLed in step 3 (after step_2 was saved); the error names it and how
    first = plait(*args, env={"PLAIT_INJECT_FAULT": "rank=1,step=3,kind=kill"}, timeout=400)
    assert first.returncode == 2, first.stderr[-3000:]
    # on the CPU with the planner's host memory (plait.run.launcher.host_memory): killed by the OS
    assert "training failed: rank 1 was killed by the OS (SIGKILL, exit -9; out of memory?) — the planner predicted" \
        in first.stderr, first.stderr[-3000:]
    assert "(that fits: other processes' memory, or the scheduler, may be the cause)" in first.stderr
    # 2nd run, the same command: resumes at 2; its whole process group is SIGKILLed after step 4 (a rank
    # killing itself in step 6 ends it if the kill comes late)
    second = launch_and_kill_the_group(args, log, {"PLAIT_INJECT_FAULT": "rank=0,step=6,kind=kill"})
    assert second.returncode in (-signal.SIGKILL, 2), second.stderr[-3000:]
    # 3rd run, the same command: resumes from the newest checkpoint and finishes
    third = plait(*args, timeout=400)
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-3000:]
    if second.returncode == -signal.SIGKILL:  # the killed launcher left its lock: taken over, not refused
        assert "took over the stale lock" in third.stdout and "is gone" in third.stdout
    assert not (ckpt / lock.LOCK_NAME).exists()
    lines = read_jsonl(log)
    resumes = [line["step"] for line in lines if line.get("event") == "resume"]
    assert resumes[0] == 2 and resumes[1] in (4, 6) and len(resumes) == 2, resumes
    assert sorted(line["step"] for line in step_lines(log)) == list(range(1, STEPS + 1)), \
        "the log must hold every step of the run, once"
    by_step = losses_by_step(log)  # with the lines of the steps re-run after a kill
    assert all(len(set(losses)) == 1 for losses in by_step.values()), by_step
    assert [by_step[s + 1][0] for s in range(STEPS)] == pytest.approx(uninterrupted["losses"], rel=1e-5)
    assert lines[-1]["summary"] and lines[-1]["start_step"] == resumes[-1]
    assert store.verify(ckpt / store.final_name(STEPS)).step == STEPS


LOOPBACK = ("0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


def listening_addresses(pids: list[int]) -> list[tuple[str, str]]:
    """(local address as /proc/net/tcp* writes it, port) of the TCP sockets ``pids`` listen on."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in open(table).read().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.append(tuple(fields[1].split(":")))
    return found


def test_workers_die_with_a_killed_launcher_and_the_same_command_resumes(tmp_path, uninterrupted):
    # a scheduler SIGKILLs the launcher's process group; torchrun started the workers in sessions of their
    # own, so without the parent-death signal they went on training, saving and pruning (issue 31 item 1)
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.jsonl"
    args = ["train", *CLI_ARGS, "--layout", "dp=2,mbs=1", "--nproc-per-node", "2", "--steps", str(STEPS),
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--log", str(log)]
    proc = subprocess.Popen([sys.executable, "-m", "plait.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None \
                and not (log.is_file() and any(line.get("step", 0) >= 3 for line in step_lines(log))):
            time.sleep(0.05)
        workers = [(pid, started) for pid, started in lock.children(proc.pid)]
        assert proc.poll() is None and len(workers) == 2, "the run ended before it could be killed"
        # a single-node run listens on loopback only: its stores and gloo (issue 31 item 7)
        listening = listening_addresses([proc.pid, *(pid for pid, _ in workers)])
        assert listening and all(address in LOOPBACK for address, _ in listening), listening
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(lock._pid_alive(pid, started) for pid, started in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid, started in workers if lock._pid_alive(pid, started)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "workers outlived their SIGKILLed launcher"
    again = plait(*args, timeout=400)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "took over the stale lock" in again.stdout and "is gone, and so are its workers" in again.stdout
    assert sorted(line["step"] for line in step_lines(log)) == list(range(1, STEPS + 1))
    by_step = losses_by_step(log)
    assert all(len(set(losses)) == 1 for losses in by_step.values()), by_step  # re-run steps bit-identical
    assert [by_step[s + 1][0] for s in range(STEPS)] == pytest.approx(uninterrupted["losses"], rel=1e-5)
    assert store.verify(ckpt / store.final_name(STEPS)).step == STEPS


def snapshot(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def test_resuming_a_copied_checkpoint_directory_leaves_the_original_untouched(dist_pool, tmp_path):
    original, copy = tmp_path / "ck", tmp_path / "ck2"
    dist_pool(2).run(checkpoint_tasks.train, "dp=2", stop_after=4, steps=STEPS, with_params=False,
                     checkpoint_dir=str(original), checkpoint_every=2)
    subprocess.run(["cp", "-r", str(original), str(copy)], check=True)
    before = snapshot(original)
    proc = plait("train", "--resume", str(copy), "--nproc-per-node", "2", "--device", "cpu", "--keep-checkpoints", "1",
                 "--checkpoint-every", "2", timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"checkpoints go to {copy.resolve()}" in proc.stdout
    assert snapshot(original) == before, "the original checkpoint directory changed"
    assert [p.name for p in store.complete_dirs(copy)] == [store.final_name(STEPS)]
