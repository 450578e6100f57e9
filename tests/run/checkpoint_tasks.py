"""Pool task bodies for the checkpoint tests (tests/run/test_checkpoint.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from runtime_tasks import full_parameters, make_config


class StopAfter:
    """A stand-in for the worker's SIGTERM event: set from the n-th check on (one check per step)."""

    def __init__(self, steps: int):
        self.remaining = steps

    def is_set(self) -> bool:
        self.remaining -= 1
        return self.remaining <= 0


def train(layout: str, stop_after: int | None = None, with_params: bool = True, **kwargs) -> dict:
    """Train (optionally stopping as if SIGTERM came after ``stop_after`` steps) and report."""
    from plait.run.trainer import run_training

    stop = StopAfter(stop_after) if stop_after else None
    result = run_training(make_config(layout, **kwargs), device=torch.device("cpu"), stop=stop)
    out = {"steps": [r.step for r in result.records], "losses": [r.loss for r in result.records],
           "grad_norms": [r.grad_norm for r in result.records], "summary": result.summary.to_dict()}
    params = full_parameters(result.parts) if with_params else None
    if dist.get_rank() == 0 and params is not None:
        out["params"] = params
    return out


def save_then_scribble(layout: str, checkpoint_dir: str, **kwargs) -> dict:
    """Start an async save, overwrite every parameter and optimizer tensor, then let it commit.

    The checkpoint must hold the values at save time, not the scribbles (staging copies them).
    """
    from plait.run.checkpoint.dcp import Checkpointer, named_parameters, training_state
    from plait.run.trainer import run_training

    result = run_training(make_config(layout, **kwargs), device=torch.device("cpu"))
    before = full_parameters(result.parts)
    checkpointer = Checkpointer(checkpoint_dir, every=0, keep=0, run=make_config(layout, **kwargs).to_dict(),
                                layout=layout, use_async=True, device=torch.device("cpu"))
    checkpointer.save(kwargs.get("steps", 3), result.parts, result.optimizer)
    with torch.no_grad():
        for value in training_state(result.parts, result.optimizer).values():
            value.fill_(7.0)
    checkpointer.finish()
    return {"before": before if dist.get_rank() == 0 else None,
            "names": sorted(named_parameters(result.parts))}


def train_with_fault(layout: str, fault: str, **kwargs) -> dict:
    """``train`` with PLAIT_INJECT_FAULT set in this rank's environment for the call."""
    import os

    os.environ["PLAIT_INJECT_FAULT"] = fault
    try:
        return train(layout, with_params=False, **kwargs)
    finally:
        del os.environ["PLAIT_INJECT_FAULT"]


def elastic_layout(layout: str, **kwargs) -> str:
    """The layout the worker runs when torchrun gives it a world size other than the layout's."""
    from plait.run.env import RankEnv
    from plait.run.worker import startup_config

    config, _ = startup_config(make_config(layout, **kwargs), RankEnv.from_environ(), say=lambda text: None)
    return str(config.job.layout)


def train_with_full_disk(layout: str, full_from_step: int, **kwargs) -> dict:
    """``train`` while the disk is 'full' (every checkpoint write from ``full_from_step`` on fails: ENOSPC)."""
    import errno

    from torch.distributed.checkpoint import FileSystemWriter

    from plait.run.checkpoint import dcp as checkpoint

    class FullDisk(FileSystemWriter):
        def write_data(self, plan, planner):
            if f"step_{full_from_step:08d}" <= self.path.name[:13]:
                raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
            return super().write_data(plan, planner)

    original = checkpoint.FileSystemWriter
    checkpoint.FileSystemWriter = FullDisk
    try:
        return train(layout, with_params=False, **kwargs)
    finally:
        checkpoint.FileSystemWriter = original


def train_with_failing_log(layout: str, **kwargs) -> dict:
    """``train`` logging to ``/dev/full`` (every write fails with ENOSPC): every rank returns its steps
    and the PlaitError rank 0 raised (None on the others)."""
    from plait.errors import PlaitError
    from plait.run.trainer import run_training

    try:
        result = run_training(make_config(layout, log="/dev/full", **kwargs), device=torch.device("cpu"))
        return {"steps": [r.step for r in result.records], "error": None}
    except PlaitError as exc:
        return {"error": str(exc)}


def train_logged(log: str, tensorboard: str, **kwargs) -> None:
    """One process's tiny run logging to JSONL ``log`` and TensorBoard ``tensorboard`` (run inside
    ``runtime_tasks.in_one_process``)."""
    import dataclasses

    from plait.run.trainer import run_training

    config = make_config("dp=1", log=log, **kwargs)
    config = dataclasses.replace(config, observe=dataclasses.replace(config.observe, tensorboard=tensorboard))
    run_training(config, device=torch.device("cpu"))
