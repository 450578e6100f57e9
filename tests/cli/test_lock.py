"""The checkpoint directory's lock (plait.run.checkpoint.lock, issue 31 item 1): held while any process
of the run lives, taken over by exactly one of several requeued commands, released only by its
owner. No torch, no launch: the "run" is a Python process that takes the lock and starts a child."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from plait.errors import PlaitError
from plait.run.checkpoint import lock



def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


LAUNCHER = """
import subprocess, sys, time
from pathlib import Path
from plait.run.checkpoint import lock
held = lock.acquire(Path(sys.argv[1]))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_the_lock_is_held_while_a_worker_outlives_its_launcher(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    worker = int(launcher.stdout.readline())
    try:
        path = tmp_path / lock.LOCK_NAME
        wait_for(lambda: worker in [pid for pid, _ in json.loads(path.read_text() or "{}").get("workers", [])])
        launcher.kill()
        launcher.wait()
        with pytest.raises(PlaitError, match=f"in use .*its launcher is gone, its workers {worker} still run"):
            lock.acquire(tmp_path)
    finally:
        os.kill(worker, signal.SIGKILL)
        launcher.kill()
    wait_for(lambda: not lock._pid_alive(worker))
    taken = lock.acquire(tmp_path)
    assert "is gone, and so are its workers" in taken.notes[0]
    taken.release()
    assert not (tmp_path / lock.LOCK_NAME).exists()


def _take(root, barrier, results) -> None:
    barrier.wait()
    try:
        held = lock.acquire(root)
        results.put(("won", held.notes))
    except PlaitError as exc:
        results.put(("refused", str(exc)))
    barrier.wait()  # the winner holds the lock until every taker has tried
    os._exit(0)


@pytest.mark.parametrize("trial", range(3))
def test_one_of_many_simultaneous_takers_gets_a_stale_lock(tmp_path, trial):
    (tmp_path / lock.LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid(),
                                                       "started": 0}))
    context = multiprocessing.get_context("fork")
    takers = 8
    barrier, results = context.Barrier(takers), context.Queue()
    processes = [context.Process(target=_take, args=(tmp_path, barrier, results)) for _ in range(takers)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    won = [notes for kind, notes in outcomes if kind == "won"]
    assert len(won) == 1, outcomes
    assert "took over the stale lock" in won[0][0]
    assert all("in use by another plait train run" in text for kind, text in outcomes if kind == "refused")


def test_release_never_removes_another_runs_lock(tmp_path):
    held = lock.acquire(tmp_path)
    other = {"host": socket.gethostname(), "pid": os.getpid(), "started": 0, "token": "someone-else"}
    (tmp_path / lock.LOCK_NAME).write_text(json.dumps(other))  # e.g. taken over while we were presumed dead
    held.release()
    assert json.loads((tmp_path / lock.LOCK_NAME).read_text()) == other
