"""Re-planning a resumed or elastic run for another world size (no torch).

When the world size changes and no layout is given, ``replan`` picks the planner's fastest
layout for the new world size among those the runtime runs, for the same global batch
(gradient accumulation follows from the layout's dp and micro-batch size). The launcher calls
it for ``plait train --resume`` on another process count, the workers after an elastic
node-count change (deterministic, so every rank picks the same layout).
"""

from __future__ import annotations

import dataclasses

from plait.errors import PlaitError
from plait.run.config import RunConfig
from plait.spec.hardware import cluster_for_gpu
from plait.spec.units import DEFAULT_GPU, GIB


def replan(config: RunConfig, world_size: int, gpus_per_node: int) -> tuple[RunConfig, str]:
    """``config`` on the planner's best runnable layout for ``world_size`` processes, and why."""
    from plait.plan.search import SearchConstraints, search

    job, gpu = config.job, config.runtime.gpu or DEFAULT_GPU
    cluster = cluster_for_gpu(gpu, world_size, min(gpus_per_node, world_size))
    result = search(job.model, cluster, job.job_spec, SearchConstraints(allow_offload=False), runnable=True,
                    compile=config.runtime.compile)
    runnable = result.plans
    if not runnable:
        raise PlaitError(
            f"no layout of {world_size} processes runs {job.model.name} with the saved global batch "
            f"{job.global_batch} × {job.seq_len} ({result.evaluated} valid layouts, {len(result.all_fitting())} fit "
            f"in memory on {gpu}, none the runtime runs); resume with a world size that divides the batch, "
            "or give --layout")
    best = runnable[0]
    micro = best.layout.micro_batches(job.global_batch)
    why = (f"world size {job.layout.world_size} → {world_size}: re-planned layout {job.layout} → "
           f"{best.layout}, the fastest of {len(runnable)} runnable layouts for the saved global batch "
           f"{job.global_batch} (each data-parallel rank accumulates {micro} micro-batch(es) of "
           f"{best.layout.mbs}; predicted {best.step.step_time:.3g} s/step, {best.memory.total / GIB:.1f} GiB/GPU "
           f"on {gpu}{'' if config.runtime.gpu else ', the default GPU for ranking'})")
    return dataclasses.replace(config, job=dataclasses.replace(job, layout=best.layout), prediction=None), why
