"""The runtime's host time: per layer and at the model's ends, and the fixed costs per micro-batch and
per step. Seconds. 0 on a GPU by default (its host runs ahead of the kernels); a CPU profile measures them."""

from __future__ import annotations

from plait.plan.params import HOST_ENDS_PARAMS, HOST_LAYER_PARAMS, CostParams
from plait.spec.layout import Layout


def host_time(params: CostParams, lay: Layout) -> tuple[float, float]:
    """(per layer, at the model's ends) host seconds per micro-batch of the runtime's machinery
    that ``lay`` runs: the plain module and autograd calls per layer, plus per layer and at the
    ends each mechanism's own (DTensor tensor parallel at tp > 1, context parallel at cp > 1,
    FSDP2 where ``Layout.uses_fsdp``). All 0 by default (a GPU's host runs ahead of its kernels)."""
    running = [name for name, runs in (("tp", lay.tp > 1), ("cp", lay.cp > 1), ("fsdp", lay.uses_fsdp)) if runs]
    per_layer = params.layer_overhead_s + sum(getattr(params, HOST_LAYER_PARAMS[name]) for name in running)
    return per_layer, sum(getattr(params, HOST_ENDS_PARAMS[name]) for name in running)


def overhead_microbatch(params: CostParams, lay: Layout, layers: int, n_ckpt: int) -> tuple[float, float]:
    """(per micro-batch and stage, at the model's ends per micro-batch): ``microbatch_overhead_s`` per
    virtual stage plus the host time of every layer, its forward part (a third) again for each fully
    recomputed layer (half of that for ``ckpt=mlp``: the MLP half's calls), and the selective checkpoint's
    own per ``ckpt=balanced`` layer."""
    host_layer, host_ends = host_time(params, lay)
    host_mb = host_layer * (layers + n_ckpt * {"full": 1 / 3.0, "mlp": 1 / 6.0}.get(lay.ckpt, 0.0))
    host_mb += params.sac_layer_overhead_s * n_ckpt if lay.ckpt == "balanced" else 0.0
    return params.microbatch_overhead_s * lay.vpp + host_mb, host_ends


def step_host_time(params: CostParams, layers: int) -> float:
    """Fixed seconds per optimizer step: ``step_overhead_s`` plus ``layer_step_overhead_s`` for each of the
    stage's ``layers`` (the optimizer's update and the gradient sync's exposed rest of a layer, once a step)."""
    return params.step_overhead_s + params.layer_step_overhead_s * layers
