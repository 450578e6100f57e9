"""Data parallelism and ZeRO: the exposed gradient and parameter collectives of one step. Seconds.

ZeRO 0 all-reduces the gradients; ZeRO 1/2 reduce-scatter them and all-gather the parameters
(``gradient_reductions`` times a step); ZeRO-3 gathers and reduce-scatters per FSDP unit as the
runtime shards (``plait.plan.terms.zero3``); hybrid sharding adds an all-reduce of the shards
across replicas; the routed experts reduce over their own expert-data-parallel group."""

from __future__ import annotations

from plait.plan import comm
from plait.plan.terms.overlap import exposed
from plait.plan.terms.zero3 import Unit, stage_units, zero3_exposed
from plait.plan.kernels import LayerTimes
from plait.plan.memory import end_params, stage_blocks_params, tied_params, zero_shard_degree
from plait.plan.moe.memory import stage_expert_params
from plait.plan.moe.timing import expert_dp_comm, expert_tp_comm
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import GroupPlacement, Layout
from plait.spec.model import ModelSpec
from plait.spec.moe.layout import expert_data_parallel, expert_tp_sum, expert_groups


def gradient_reductions(lay: Layout, micro_batches: int) -> int:
    """How many times per step plait's runtime reduces the gradients under ZeRO >= 1 (each a
    reduce-scatter, and across replicas an all-reduce under hsdp): ZeRO-2 and 3 without a pipeline
    (FSDP2, as DeepSpeed) after every micro-batch, ZeRO-2 gathering the parameters again for the
    next; ZeRO-1 and the pipeline schedules accumulate full gradients and reduce once
    (``plait.run.step``)."""
    return micro_batches if lay.zero >= 2 and lay.pp == 1 else 1


def zero3_stages(model: ModelSpec, lay: Layout, layers: int, times: LayerTimes, recompute_mb: float,
                 head_mb: float) -> list[list[Unit]]:
    """The FSDP units (``plait.plan.terms.zero3``) of the first and of the last pipeline stage (one
    stage at pp=1): the embedding on the first, the head on the last, the blocks on each."""
    embedding, head = end_params(model, lay)
    blocks = stage_blocks_params(model, lay)
    backward = times.bwd + recompute_mb / max(1, layers)
    ends = [(embedding, head)] if lay.pp == 1 else [(embedding, 0.0), (0.0, head)]
    return [stage_units(first, blocks, last, layers, times.fwd, backward, head_mb if last else 0.0,
                        lay.reshard, tied_params(model, lay)) for first, last in ends]


def dp_step(model: ModelSpec, cluster: ClusterSpec, groups: dict[str, GroupPlacement], lay: Layout,
            micro_batches: int, layers: int, times: LayerTimes, local_params: float, recompute_mb: float,
            recompute_layer: float, n_ckpt: int, head_mb: float, params: CostParams,
            runtime: str = "torch") -> float:
    """Exposed data-parallel seconds per step on the stage with the most parameters (``local_params``),
    dense and experts; collectives hide behind up to ``dp_overlap`` of the pass they overlap.
    ``runtime``: whose expert groups (``plait.spec.moe.layout.expert_groups``)."""
    m, element = micro_batches, cluster.gpu.element_bytes
    grad_bytes = local_params * params.grad_reduce_bytes
    bwd_window = layers * times.bwd + recompute_mb
    fwd_window = layers * times.fwd
    dp_comm = 0.0
    d = zero_shard_degree(lay)
    if lay.dp * lay.cp > 1:
        if lay.zero == 0:
            dp_comm = exposed(comm.all_reduce(cluster, groups["dp_cp"], grad_bytes), bwd_window, params)
        elif lay.zero in (1, 2):
            shard = groups["shard"]
            scatter = exposed(comm.reduce_scatter(cluster, shard, grad_bytes), bwd_window, params)
            gather = exposed(comm.all_gather(cluster, shard, element * local_params), fwd_window, params)
            dp_comm = gradient_reductions(lay, m) * (scatter + gather)
        else:
            dp_comm = max(zero3_exposed(cluster, groups["shard"], units, m, params)
                          for units in zero3_stages(model, lay, layers, times, n_ckpt * recompute_layer, head_mb))
        if lay.hsdp > 1:  # FSDP2 all-reduces the shards across replicas with every reduce-scatter
            replicas = comm.all_reduce(cluster, groups["replicate"], grad_bytes / max(1, d // lay.cp))
            dp_comm += gradient_reductions(lay, m) * replicas
    if model.moe is not None and lay.zero == 3 and expert_data_parallel(lay, runtime) > 1:
        # routed experts gathered layer by layer over the expert-dp ranks, as the dense weights
        edp = expert_groups(lay, cluster.gpus_per_node, runtime)["edp"]
        experts = stage_expert_params(model, lay, layers)
        backward = times.bwd + n_ckpt * recompute_layer / max(1, layers)
        units = [Unit(experts / max(1, layers), times.fwd, backward, lay.reshard)] * max(1, layers)
        dp_comm += zero3_exposed(cluster, edp, units, m, params)
        if expert_tp_sum(lay, runtime):  # plait's runtime: the experts' gradients summed over tp too
            dp_comm += exposed(expert_tp_comm(model, cluster, lay, layers, params, runtime), bwd_window, params)
    elif model.moe is not None and (expert_data_parallel(lay, runtime) > 1 or expert_tp_sum(lay, runtime)):
        dp_comm += exposed(expert_dp_comm(model, cluster, lay, layers, params, runtime), bwd_window, params)
    return dp_comm
