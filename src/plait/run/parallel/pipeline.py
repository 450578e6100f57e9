"""Pipeline parallelism with ``torch.distributed.pipelining``: stage modules and schedules.

The model is cut into pp·vpp virtual stages with the planner's layer counts
(``plait.spec.validate.stage_layer_counts``): the first stage also holds the token (and
position) embedding, the last the final norm and LM head. Stage modules are copies of the full
model with the other layers deleted, so parameter names stay those of the full model (which is
what lets a checkpoint taken at one pp load at another).

Which virtual stages a GPU holds: stage ``r`` for 1F1B/GPipe/zero-bubble, and stages
``r, r+pp, r+2·pp, …`` for the interleaved schedule (Narayanan et al. 2021).

Schedules (``Layout.schedule``): ``gpipe`` → ScheduleGPipe, ``1f1b`` → Schedule1F1B,
``interleaved-1f1b`` → ScheduleInterleaved1F1B, ``zero-bubble`` → ScheduleInterleavedZeroBubble
with one stage per GPU (ZB-H1: the backward is split into input and weight gradients and the
weight gradients fill the bubble). Each micro-batch's loss is its mean token loss; the schedule
divides gradients by the number of micro-batches (``scale_grads``), so the step's gradient is
that of the mean loss over the rank's whole batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from plait.run.parallel.mesh import ParallelDims
from plait.run.model import Transformer, build_model
from plait.run.modules.moe import MoEFeedForward
from plait.spec.layout import Layout
from plait.spec.model import ModelSpec
from plait.spec.validate import stage_layer_counts


def stage_ids_of_rank(layout: Layout, pp_rank: int) -> list[int]:
    """Virtual stage indices this pipeline rank holds, in execution order."""
    return [pp_rank + k * layout.pp for k in range(layout.vpp)]


def stage_layer_ids(spec: ModelSpec, layout: Layout, stage_id: int) -> list[str]:
    """Names ("0".."L-1") of the blocks of virtual stage ``stage_id``."""
    counts = stage_layer_counts(spec, layout)
    start = sum(counts[:stage_id])
    return [str(i) for i in range(start, start + counts[stage_id])]


def build_stage_module(spec: ModelSpec, layout: Layout, stage_id: int) -> Transformer:
    """A meta-device model holding only virtual stage ``stage_id``'s part."""
    model = build_model(spec)
    keep = set(stage_layer_ids(spec, layout, stage_id))
    for layer_id in list(model.layers.keys()):
        if layer_id not in keep:
            del model.layers[layer_id]
    n_stages = layout.pp * layout.vpp
    if stage_id != 0:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if stage_id != n_stages - 1:
        model.norm = None
        model.output = None
    return model


def uncounted_shape_inference(stage) -> None:
    """torch's pipelining runs each stage's module once more in the first step, to infer the shapes
    it sends (``_forward_metadata_inference``, on placeholder tensors): the MoE layers leave that
    forward out of their routing counts (``MoEFeedForward.counted``), which feed the sigmoid routers'
    balancing and the router-health figures."""
    infer = getattr(stage, "_forward_metadata_inference", None)
    if infer is None:
        return
    routers = [m for m in stage.submod.modules() if isinstance(m, MoEFeedForward)]

    def infer_uncounted(*args, **kwargs):
        for router in routers:
            router.counted = False
        try:
            return infer(*args, **kwargs)
        finally:
            for router in routers:
                router.counted = True

    stage._forward_metadata_inference = infer_uncounted


def build_schedule(chunks: list[torch.nn.Module], stage_ids: list[int], pdims: ParallelDims,
                   n_microbatches: int, loss_fn: Callable, device: torch.device):
    """The pipeline schedule driving this rank's stage chunks (modules already parallelized).

    ``torch.distributed.pipelining`` is imported here, by pp > 1 runs only (it is slow to import)."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
    )

    layout = pdims.layout
    n_stages = layout.pp * layout.vpp
    group = pdims.group("pp")
    stages = [PipelineStage(chunk, stage_id, n_stages, device, group=group)
              for chunk, stage_id in zip(chunks, stage_ids)]
    for stage in stages:
        uncounted_shape_inference(stage)
    if layout.schedule == "gpipe":
        return ScheduleGPipe(stages[0], n_microbatches, loss_fn=loss_fn)
    if layout.schedule == "1f1b":
        return Schedule1F1B(stages[0], n_microbatches, loss_fn=loss_fn)
    if layout.schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=loss_fn)
    if layout.schedule == "zero-bubble":
        return ScheduleInterleavedZeroBubble(stages, n_microbatches, loss_fn=loss_fn)
    raise ValueError(f"unknown schedule {layout.schedule!r}")
