"""Checks of the activation-offload directory before training starts (no torch import).

``plait train --offload-dir DIR`` (``RuntimeConfig.offload_dir``) names where ``offload=disk:α``
writes activations: each rank makes a fresh ``plait-offload-rank<R>-*`` directory in it (by
default in the system temporary directory). The directory must exist, be writable, and have
room for what the planner predicts every rank of the job offloads at its peak.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

from plait.spec.units import GIB


def disk_free_bytes(path: str) -> int:
    """Free bytes of the file system holding ``path`` (a function so that tests can simulate a full disk)."""
    return shutil.disk_usage(path).free


def offload_dir_problems(path: str | None, need_bytes: float) -> list[str]:
    """Why activations cannot be offloaded to ``path`` (None: the default temporary directory)."""
    where = path or tempfile.gettempdir()
    label = f"offload directory {where}" if path else f"temporary directory {where} (default offload directory)"
    if not os.path.isdir(where):
        return [f"{label} does not exist; create it or pass --offload-dir DIR on a local disk"]
    probe = os.path.join(where, f".plait-write-test-{uuid.uuid4().hex}")
    try:
        with open(probe, "wb") as handle:
            handle.write(b"\0")
        os.remove(probe)
    except OSError as exc:
        return [f"{label} is not writable ({exc.strerror}); pass --offload-dir DIR that this user can write"]
    free = disk_free_bytes(where)
    if free < need_bytes:
        return [(f"{label} has {free / GIB:.2f} GiB free but the run offloads up to {need_bytes / GIB:.2f} GiB "
                 "of activations (planner estimate, all ranks); free space, pass --offload-dir DIR on a larger "
                 "disk, lower the offload fraction or use offload=cpu:FRACTION")]
    return []
