"""The checkpoint directory's lock (plait.run.checkpoint.lock, issue 31 item 1): held while any process
of the run lives, taken over by exactly one of several requeued commands, released only by its
owner. No torch, no launch: the "run" is a Python process that takes the lock and starts a child."""

from __future__ import annotations

import json
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


TAKER = """
import os, sys, time
from pathlib import Path
from plait.errors import PlaitError
from plait.run.checkpoint import lock
root = Path(sys.argv[1])
print("ready", flush=True)
while not (root / "go").exists():
    time.sleep(0.001)
try:
    held = lock.acquire(root)
    print("won", held.notes[0], flush=True)
except PlaitError as exc:
    print("refused", exc, flush=True)
deadline = time.monotonic() + 60
while not (root / "done").exists() and time.monotonic() < deadline:  # the winner holds it meanwhile
    time.sleep(0.01)
"""


@pytest.mark.parametrize("trial", range(3))
def test_one_of_many_simultaneous_takers_gets_a_stale_lock(tmp_path, trial):
    (tmp_path / lock.LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid(),
                                                       "started": 0}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    takers = [subprocess.Popen([sys.executable, "-c", TAKER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                               env=env) for _ in range(8)]
    try:
        assert all(taker.stdout.readline() == "ready\n" for taker in takers)
        (tmp_path / "go").touch()  # all at once
        outcomes = [taker.stdout.readline().split(" ", 1) for taker in takers]
    finally:
        (tmp_path / "done").touch()
        for taker in takers:
            taker.wait(timeout=60)
    won = [text for kind, text in outcomes if kind == "won"]
    assert len(won) == 1, outcomes
    assert "took over the stale lock" in won[0]
    assert all("in use by another plait train run" in text for kind, text in outcomes if kind == "refused"), outcomes


def test_release_never_removes_another_runs_lock(tmp_path):
    held = lock.acquire(tmp_path)
    other = {"host": socket.gethostname(), "pid": os.getpid(), "started": 0, "token": "someone-else"}
    (tmp_path / lock.LOCK_NAME).write_text(json.dumps(other))  # e.g. taken over while we were presumed dead
    held.release()
    assert json.loads((tmp_path / lock.LOCK_NAME).read_text()) == other
