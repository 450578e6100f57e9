"""SIGTERM, SIGINT and SIGHUP each ask a worker to finish its step, save and stop (plait.run.worker.arm_sigterm,
issue 31 item 4), in a process of their own (signal handlers are per process): before, the watcher waited
with the signal blocked in sigwait, and torch's own thread - which blocks no signal - could take a SIGTERM
and die of it. The launch end to end: tests/cli/test_resume_cli.py (SIGTERM, SIGINT)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCRIPT = """
import os, signal, time
from plait.run.worker import arm_sigterm
for name in ("SIGTERM", "SIGINT", "SIGHUP"):
    said = []
    request = arm_sigterm(said.append)  # a fresh watcher each time (the previous one saw its signal)
    request.is_set()
    os.kill(os.getpid(), getattr(signal, name))
    deadline = time.monotonic() + 20
    while not (request.event.is_set() and said) and time.monotonic() < deadline:
        time.sleep(0.01)
    print(request.name, "|", said[0] if said else None, flush=True)
"""


def test_every_stop_signal_requests_a_save_and_stop():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"{name} | {name}: finishing the step, then saving and stopping"
                                        for name in ("SIGTERM", "SIGINT", "SIGHUP")]
