"""Resuming a run: what the resumed run trains, on which layout, from which checkpoint (no torch).

The checkpoint's manifest holds the RunConfig of the run that wrote it. A resumed run keeps
everything that defines the training trajectory - model, global batch, sequence length, seed,
data, optimizer and schedule - and may change how it runs: the layout and the number of
processes. When the world size changes and no layout is given, ``replan`` picks the planner's
fastest layout for the new world size among those the runtime runs, for the same global
batch (gradient accumulation follows from the layout's dp and micro-batch size).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from plait.errors import PlaitError
from plait.run.checkpoint import store
from plait.run.config import RunConfig
from plait.spec.hardware import GIB, cluster_for_gpu
from plait.spec.units import DEFAULT_GPU


def replan(config: RunConfig, world_size: int, gpus_per_node: int) -> tuple[RunConfig, str]:
    """``config`` on the planner's best runnable layout for ``world_size`` processes, and why."""
    from plait.plan.search import SearchConstraints, search

    gpu = config.gpu or DEFAULT_GPU
    cluster = cluster_for_gpu(gpu, world_size, min(gpus_per_node, world_size))
    result = search(config.model, cluster, config.job, SearchConstraints(allow_offload=False), runnable=True,
                    compile=config.compile)
    runnable = result.plans
    if not runnable:
        raise PlaitError(
            f"no layout of {world_size} processes runs {config.model.name} with the saved global batch "
            f"{config.global_batch} × {config.seq_len} ({result.evaluated} valid layouts, {len(result.all_fitting())} fit "
            f"in memory on {gpu}, none the runtime runs); resume with a world size that divides the batch, "
            "or give --layout")
    best = runnable[0]
    micro = best.layout.micro_batches(config.global_batch)
    why = (f"world size {config.layout.world_size} → {world_size}: re-planned layout {config.layout} → "
           f"{best.layout}, the fastest of {len(runnable)} runnable layouts for the saved global batch "
           f"{config.global_batch} (each data-parallel rank accumulates {micro} micro-batch(es) of "
           f"{best.layout.mbs}; predicted {best.step.step_time:.3g} s/step, {best.memory.total / GIB:.1f} GiB/GPU "
           f"on {gpu}{'' if config.gpu else ', the default GPU for ranking'})")
    return dataclasses.replace(config, layout=best.layout, prediction=None), why


def check_same_run(saved: RunConfig, model=None, global_batch: int | None = None, seq_len: int | None = None,
                   path: str = "") -> None:
    """Refuse to resume a checkpoint as a different run (another model, batch or sequence length)."""
    if model is not None and model != saved.model:
        raise PlaitError(f"checkpoint {path} holds model {saved.model.name}, not {model.name}")
    if global_batch is not None and global_batch != saved.global_batch:
        raise PlaitError(f"checkpoint {path} was trained with global batch {saved.global_batch}; a resumed run "
                         f"keeps it (asked: {global_batch}). Drop --global-batch")
    if seq_len is not None and seq_len != saved.seq_len:
        raise PlaitError(f"checkpoint {path} was trained with seq_len {saved.seq_len}; a resumed run keeps it "
                         f"(asked: {seq_len}). Drop --seq-len")


def set_aside(paths: list[Path]) -> list[Path]:
    """Rename refused (corrupt) checkpoint directories to ``<name>.corrupt-<n>``: kept, never reused."""
    moved = []
    for path in paths:
        n = 0
        while (target := path.with_name(f"{path.name}.corrupt-{n}")).exists():
            n += 1
        try:
            os.rename(path, target)
        except OSError:
            continue
        moved.append(target)
    return moved


def newer_than(checkpoint: store.Checkpoint, root: Path) -> list[Path]:
    """Complete checkpoints in ``root`` with a later step than ``checkpoint``."""
    return [p for p in store.complete_dirs(root) if store.step_of(p) > checkpoint.step]


def prepare_checkpoint_root(checkpoint: store.Checkpoint, root: Path, refused: list[Path]) -> list[str]:
    """Make ``root`` safe to write the resumed run's checkpoints into; returns notes.

    Newer checkpoints that failed verification (``refused``) are set aside; newer valid ones
    mean the user resumes from an older step into the same directory, which would collide.
    """
    refused_paths = {p.resolve() for p in refused}
    newer = newer_than(checkpoint, root)
    valid = [p for p in newer if p.resolve() not in refused_paths]
    if valid:
        raise PlaitError(f"{root} holds newer checkpoints ({', '.join(p.name for p in valid)}) than "
                         f"{checkpoint.path.name}; resuming there would collide with them. Resume from the newest, "
                         "or pass a new --checkpoint-dir")
    return [f"set aside the refused checkpoint as {moved.name}"
            for moved in set_aside([p for p in newer if p.resolve() in refused_paths])]
