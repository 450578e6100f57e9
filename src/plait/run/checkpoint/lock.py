"""One live run per checkpoint directory: ``DIR/.plait-lock`` (no torch).

``plait train`` takes the lock before it writes anything into ``--checkpoint-dir`` and gives
it back when it ends. The lock file is created with ``O_CREAT | O_EXCL`` (atomic, also on NFS
v3+) and holds the owner: host, pid, start time, and for a multi-node job its rendezvous (the
nodes of one job share the lock). The owner renews it (touches the file) every
``LEASE_S / 4`` seconds from a thread, so a lock is stale when its owner's pid is gone on this
host, or when it has not been renewed for ``LEASE_S`` seconds (an owner on another host that
was killed outright, e.g. a node lost before a Slurm requeue). A stale lock is taken over
with a note; a live one refuses the run with one line naming the other run.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from plait.errors import PlaitError

LOCK_NAME = ".plait-lock"
LEASE_S = 60.0  # a lock not renewed for this long is stale (seconds)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def stale_reason(owner: dict, age_s: float, lease_s: float = LEASE_S) -> str | None:
    """Why the lock of ``owner`` (last renewed ``age_s`` seconds ago) is stale, or None when it is live."""
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int) \
            and not _pid_alive(owner["pid"]):
        return f"its process {owner['pid']} is gone"
    if age_s > lease_s:
        return f"not renewed for {age_s:.0f} s"
    return None


def describe(owner: dict) -> str:
    """The other run, in words: ``pid 1234 on node7, started 2025-01-02T03:04:05``."""
    started = owner.get("started")
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, started {when}"


@dataclass
class CheckpointLock:
    """The lock of one checkpoint directory, held by this process (``release`` gives it back)."""

    path: Path
    owned: bool  # False when this node joined a lock its job's first node took
    notes: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self._stop.set()
        if self.owned:
            self.path.unlink(missing_ok=True)

    def _renew(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                os.utime(self.path)
            except OSError:
                return

    def __enter__(self) -> CheckpointLock:
        return self

    def __exit__(self, *_exc) -> None:
        self.release()


def acquire(root: Path, job: str | None = None, lease_s: float = LEASE_S) -> CheckpointLock:
    """Take ``root/.plait-lock`` for this process; PlaitError naming the live run that holds it.

    ``job`` identifies a multi-node job (rendezvous endpoint and id): a lock taken by another node
    of the same job is joined, not refused.
    """
    path = root / LOCK_NAME
    notes = []
    for _ in range(3):
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "job": job}
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            held, age = _read(path)
            if held is None:
                continue  # removed meanwhile: try again
            if job is not None and held.get("job") == job:
                return CheckpointLock(path, owned=False, notes=notes)
            why = stale_reason(held, age, lease_s)
            if why is None:
                raise PlaitError(f"{root} is in use by another plait train run ({describe(held)}); wait for it "
                                 f"to end or stop it (its lock {LOCK_NAME} is taken over once that process is gone, "
                                 f"or {lease_s:.0f} s after its last renewal)") from None
            path.unlink(missing_ok=True)
            notes.append(f"took over the stale lock of {describe(held)} ({why})")
            continue
        except OSError as exc:
            raise PlaitError(f"cannot lock {root} ({exc.strerror or exc})") from None
        with os.fdopen(fd, "w") as handle:
            json.dump(owner, handle)
        lock = CheckpointLock(path, owned=True, notes=notes)
        threading.Thread(target=lock._renew, args=(max(1.0, lease_s / 4),), name="plait-lock", daemon=True).start()
        return lock
    raise PlaitError(f"cannot lock {root}: its lock file {path} keeps changing")


def _read(path: Path) -> tuple[dict | None, float]:
    """(the owner recorded in a lock file, seconds since it was renewed); (None, 0) when it is gone."""
    try:
        age = time.time() - path.stat().st_mtime
        text = path.read_text()
    except FileNotFoundError:
        return None, 0.0
    except OSError:
        return {}, 0.0
    try:
        owner = json.loads(text or "{}")
    except ValueError:
        owner = {}  # half-written or foreign: stale only by its age
    return (owner if isinstance(owner, dict) else {}), age
