"""Threads per process of a CPU sweep, and the oversubscription check. No torch.

Cores are the ones this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where that
does not exist). Each CPU run's processes get ``OMP_NUM_THREADS`` threads (the worker sets torch's
intra-op threads from it): ``--threads-per-process`` if given, else ``OMP_NUM_THREADS`` when set
in the environment, else cores // processes (at least 1). Processes x threads above the cores
oversubscribes them: step times then measure the scheduler, so it is said, never silent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from plait.errors import PlaitError


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_per_process(requested: int | None, nproc: int, environ: Mapping[str, str], cores: int) -> int:
    """Threads each of ``nproc`` processes runs (see the module docstring)."""
    if requested is not None:
        if requested < 1:
            raise PlaitError(f"--threads-per-process {requested}: must be at least 1")
        return requested
    text = environ.get("OMP_NUM_THREADS", "").strip()
    if text:
        try:
            value = int(text)
        except ValueError:
            raise PlaitError(f"OMP_NUM_THREADS={text!r} is not a whole number; unset it or give "
                             "--threads-per-process N") from None
        if value >= 1:
            return value
    return max(1, cores // nproc)


def oversubscription(nproc: int, threads: int, cores: int) -> str:
    """A warning line when ``nproc`` processes x ``threads`` threads exceed ``cores``; "" otherwise."""
    if nproc * threads <= cores:
        return ""
    return (f"{nproc} processes x {threads} threads = {nproc * threads} threads on {cores} cores: the cores are "
            f"oversubscribed and step times measure contention (use --threads-per-process "
            f"{max(1, cores // nproc)} or fewer processes)")
