"""One live run per checkpoint directory: ``DIR/.plait-lock`` (no torch).

``plait train`` takes the lock before it writes anything into ``--checkpoint-dir`` and gives
it back when it ends. The lock file is created with ``O_CREAT | O_EXCL`` (atomic, also on NFS
v3+) and holds the owner: host, pid, start time, a random token, the pids of the run's workers
on this host, and for a multi-node job its rendezvous (the nodes of one job share the lock).
The owner rewrites it (atomically, only while it still holds its token) when its workers
change and at least every ``LEASE_S / 4`` seconds, from a thread. A lock is live while its
owner or any of its workers lives on this host (a worker blocked in a write after its launcher
was killed still holds the directory), and on another host while it has been renewed within
``LEASE_S`` seconds (an owner killed outright, e.g. a node lost before a Slurm requeue, frees
it then). A stale lock is taken over with a note, by one process at a time: the taker holds
``.plait-lock.takeover`` (``O_EXCL``), checks the lock is still the stale one and renames its own
over it, so two requeued commands never both get it. ``release`` removes the lock only while it
still holds this owner's token.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from plait.errors import PlaitError

LOCK_NAME = ".plait-lock"
TAKEOVER_NAME = ".plait-lock.takeover"
LEASE_S = 60.0  # a lock not renewed for this long is stale (seconds)
TAKEOVER_S = 10.0  # a takeover guard older than this was left by a taker that died: removed


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, ``/proc``), which tells a reused pid from its first process."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 and fields[19].isdigit() else None


def _pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` is a live process here (a zombie, dead but not yet reaped, is not); with
    ``started`` (``start_time``), only the process that started then (not a later one given its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except (OverflowError, ValueError):
        return False
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no /proc: as kill said
    return fields[0] != "Z" and (started is None or start_time(pid) in (None, started))


def children(pid: int) -> list[list[int]]:
    """[pid, start time] of ``pid``'s live child processes (from ``/proc``; [] where there is none)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        fields = _stat_fields(int(entry)) if entry.isdigit() else None
        if fields and len(fields) > 19 and fields[1] == str(pid) and fields[0] != "Z":
            found.append([int(entry), int(fields[19])])
    return sorted(found)


def _processes(owner: dict) -> list[tuple[int, int | None]]:
    """(pid, start time or None) of the owner and its recorded workers."""
    own = owner.get("pid_start") if isinstance(owner.get("pid_start"), int) else None
    out = [(owner["pid"], own)]
    for item in owner.get("workers") or []:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) for x in item):
            out.append((item[0], item[1]))
    return out


def stale_reason(owner: dict, age_s: float, lease_s: float = LEASE_S) -> str | None:
    """Why the lock of ``owner`` (last renewed ``age_s`` seconds ago) is stale, or None when it is live.

    On this host the processes decide (the owner's pid and its workers', each with its start time);
    on another host the lease (renewed every ``lease_s / 4`` s by a live owner)."""
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        processes = _processes(owner)
        if any(_pid_alive(pid, started) for pid, started in processes):
            return None
        workers = len(processes) > 1
        return f"its process {owner['pid']} is gone{', and so are its workers' if workers else ''}"
    if age_s > lease_s:
        return f"not renewed for {age_s:.0f} s"
    return None


def describe(owner: dict) -> str:
    """The other run, in words: ``pid 1234 on node7, started 2025-01-02T03:04:05``."""
    started = owner.get("started")
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    orphans = ""
    if isinstance(owner.get("pid"), int) and owner.get("host") == socket.gethostname():
        (pid, started), *workers = _processes(owner)
        live = [str(p) for p, s in workers if _pid_alive(p, s)]
        if live and not _pid_alive(pid, started):
            orphans = f"; its launcher is gone, its workers {', '.join(live)} still run"
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, started {when}{orphans}"


@dataclass
class CheckpointLock:
    """The lock of one checkpoint directory, held by this process (``release`` gives it back)."""

    path: Path
    owned: bool  # False when this node joined a lock its job's first node took
    notes: list[str] = field(default_factory=list)
    owner: dict = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """Stop renewing and remove the lock file, if it is still this owner's (never another run's)."""
        self._stop.set()
        if self.owned and self.holds():
            self.path.unlink(missing_ok=True)

    def holds(self) -> bool:
        """Whether the lock file still names this owner (its token)."""
        held, _ = _read(self.path)
        return held is not None and held.get("token") == self.owner.get("token")

    def _renew(self, lease_s: float, poll_s: float = 0.5) -> None:
        """Record the run's processes (this one's children: the workers) and renew the lease."""
        last, written = time.monotonic(), self.owner.get("workers")
        while not self._stop.wait(poll_s):
            workers = children(os.getpid())
            if workers == written and time.monotonic() - last < lease_s / 4:
                continue
            if not self.holds():
                return  # taken over (we were presumed dead): never write over another run's lock
            try:
                _write(self.path, {**self.owner, "workers": workers})
            except OSError:
                return
            self.owner["workers"] = written = workers
            last = time.monotonic()

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
    notes: list[str] = []
    deadline = time.monotonic() + 2 * TAKEOVER_S
    while time.monotonic() < deadline:
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "job": job,
                 "token": uuid.uuid4().hex, "pid_start": start_time(os.getpid()), "workers": []}
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
                raise _in_use(root, held, lease_s)
            taken = _take_over(root, held, owner, lease_s)
            if taken is None:
                time.sleep(0.05)  # another process is taking it over: look again
                continue
            notes.append(f"took over the stale lock of {describe(held)} ({why})")
            return _start(CheckpointLock(path, owned=True, notes=notes, owner=owner), lease_s)
        except OSError as exc:
            raise PlaitError(f"cannot lock {root} ({exc.strerror or exc})") from None
        with os.fdopen(fd, "w") as handle:
            json.dump(owner, handle)
        return _start(CheckpointLock(path, owned=True, notes=notes, owner=owner), lease_s)
    raise PlaitError(f"cannot lock {root}: its lock file {path} keeps changing")


def _in_use(root: Path, held: dict, lease_s: float) -> PlaitError:
    return PlaitError(f"{root} is in use by another plait train run ({describe(held)}); wait for it to end "
                      f"or stop it (its lock {LOCK_NAME} is taken over once its processes are gone, "
                      f"or {lease_s:.0f} s after its last renewal)")


def _start(lock: CheckpointLock, lease_s: float) -> CheckpointLock:
    threading.Thread(target=lock._renew, args=(lease_s,), name="plait-lock", daemon=True).start()
    return lock


def _take_over(root: Path, stale: dict, owner: dict, lease_s: float) -> bool | None:
    """Replace the stale lock ``stale`` by ``owner``'s, one taker at a time; True when taken, None when
    another process is taking it over (or took it: the caller looks again). PlaitError when the
    lock came alive meanwhile."""
    guard = root / TAKEOVER_NAME
    try:
        fd = os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        _remove_abandoned_guard(guard)
        return None
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump({"host": owner["host"], "pid": owner["pid"]}, handle)
        held, age = _read(root / LOCK_NAME)
        if held is None or held.get("token") != stale.get("token") or held != stale:
            return None  # changed meanwhile: look again
        if stale_reason(held, age, lease_s) is None:
            raise _in_use(root, held, lease_s)
        _write(root / LOCK_NAME, owner)
        return True
    finally:
        guard.unlink(missing_ok=True)


def _remove_abandoned_guard(guard: Path) -> None:
    """Remove a takeover guard whose taker died (gone on this host, or older than ``TAKEOVER_S``)."""
    held, age = _read(guard)
    if held is None:
        return
    dead = held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int) \
        and not _pid_alive(held["pid"])
    if dead or age > TAKEOVER_S:
        guard.unlink(missing_ok=True)


def _write(path: Path, owner: dict) -> None:
    """Replace the lock file at ``path`` with ``owner`` in one rename (readers see the old or the new)."""
    temporary = path.with_name(f"{path.name}.{owner['token']}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "w") as handle:
            json.dump(owner, handle)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


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
