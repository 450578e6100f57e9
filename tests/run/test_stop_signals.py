"""SIGTERM, SIGINT and SIGHUP each ask a worker to finish its step, save and stop (plait.run.worker.arm_sigterm,
issue 31 item 4), in a process of their own (the signal mask is per process); the launch end to end:
tests/cli/test_resume_cli.py (SIGTERM, SIGINT)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCRIPT = """
import os, signal, sys, time
from plait.run.worker import arm_sigterm
said = []
request = arm_sigterm(said.append)
request.is_set()
os.kill(os.getpid(), getattr(signal, sys.argv[1]))
deadline = time.monotonic() + 60
while not request.event.is_set() and time.monotonic() < deadline:
    time.sleep(0.01)
print(request.name, said[0] if said else None, flush=True)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_every_stop_signal_requests_a_save_and_stop(name):
    done = subprocess.run([sys.executable, "-c", SCRIPT, name], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split(None, 1) == [name, f"{name}: finishing the step, then saving and stopping\n"]
