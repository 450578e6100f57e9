"""Take a run's checkpoint directory before launch: lock it, clean what failed saves left, set
aside the checkpoints that resume refused."""

from __future__ import annotations

from pathlib import Path

from plait.run.checkpoint import store
from plait.run.launcher.launch import LaunchOptions


def take_checkpoint_dir(root: Path, resumed, options: LaunchOptions):
    """Lock the checkpoint directory for this run, clean what failed saves left, set aside refused
    checkpoints; prints what it did and returns the lock (``release`` it when the run ends).

    ``resumed``: the ``Resumed`` record of the checkpoint this run resumes from, or None.
    """
    from plait.run.checkpoint.lock import acquire
    from plait.run.checkpoint.select import prepare_checkpoint_root

    store.check_writable(root)
    multi_node = options.nnodes > 1 or options.min_nnodes not in (None, options.nnodes)
    held = acquire(root, job=f"{options.rdzv_endpoint}#{options.rdzv_id}" if multi_node else None)
    try:
        notes = list(held.notes)
        if held.owned:
            notes += store.remove_leftovers(root)
        if resumed is not None:
            notes += prepare_checkpoint_root(resumed.checkpoint, root, list(resumed.refused))
    except BaseException:
        held.release()
        raise
    for note in notes:
        print(f"plait train: {note}", flush=True)
    return held
