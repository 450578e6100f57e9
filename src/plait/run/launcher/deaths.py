"""How a worker died, in words, and which failure is the root cause (no torch).

A rank killed by a signal (the kernel's OOM killer, a segfault, a lost node, the scheduler)
leaves no error file; the survivors then fail in their next collective ("Connection reset by
peer") and do leave one. The root cause is the dead rank, not the first survivor to write a
file: ``root_cause`` prefers, in order, an out-of-memory error, a rank that died without a
message (killed by a signal first), an error that is not a collective's, and then the earliest.
"""

from __future__ import annotations

import re
import signal

HINTS = {
    "SIGKILL": "out of memory or killed by the scheduler?",
    "SIGSEGV": "a crash in native code (segmentation fault)",
    "SIGBUS": "a bad memory access (a full /dev/shm?)",
    "SIGABRT": "aborted by a failed check in native code",
    "SIGTERM": "stopped by the scheduler or a person",
    "SIGINT": "interrupted",
}
COLLECTIVE_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError")
_COLLECTIVE = re.compile(r"connection (reset|closed) by peer|broken pipe|timed out|timeout|"
                         r"gloo|nccl|socket", re.IGNORECASE)


def signal_of(exitcode: int | None) -> str | None:
    """The name of the signal behind a negative exit code (``-9`` → ``SIGKILL``), else None."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def how_it_died(rank: int, exitcode: int | None) -> str:
    """One line: ``rank 1 was killed by SIGKILL (exit -9): out of memory or killed by the scheduler?``,
    or ``rank 1 exited with status 3 without an error message``."""
    name = signal_of(exitcode)
    if name is None:
        return f"rank {rank} exited with status {exitcode} without an error message"
    hint = HINTS.get(name)
    return f"rank {rank} was killed by {name} (exit {exitcode})" + (f": {hint}" if hint else "")


def is_collective(record: dict) -> bool:
    """Whether a worker's error record is a collective failing because a peer went away."""
    return record.get("type") in COLLECTIVE_TYPES or bool(_COLLECTIVE.search(str(record.get("message", ""))))


def silent_deaths(exits: dict[int, int], with_message: set[int]) -> list[int]:
    """Ranks that failed (``exits``: rank → exit code) without an error file, signal deaths first, then by rank."""
    dead = [rank for rank, code in exits.items() if code != 0 and rank not in with_message]
    return sorted(dead, key=lambda rank: (signal_of(exits[rank]) is None, rank))


def root_error(errors: list[dict]) -> dict:
    """The error record to show among several (earliest first): the first that is not a collective's."""
    return next((e for e in errors if not is_collective(e)), errors[0])
