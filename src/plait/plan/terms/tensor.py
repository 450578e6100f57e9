"""Tensor (and sequence) parallel collectives of one layer and micro-batch. Seconds."""

from __future__ import annotations

from plait.plan import comm
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import GroupPlacement, Layout


def tp_layer(cluster: ClusterSpec, group: GroupPlacement, lay: Layout, act_bytes: float,
             params: CostParams) -> tuple[float, float]:
    """(one pass's collectives, the layer's exposed total): with sp two all-gathers and two
    reduce-scatters of the activations per pass, without it two all-reduces; the forward's hide by
    ``tp_forward_overlap`` up to 1 - 1/tp (chunked pipelining leaves its first of tp chunks exposed),
    the backward's behind the weight-gradient GEMMs by ``tp_comm_overlap``. (0, 0) at tp = 1."""
    if lay.tp <= 1:
        return 0.0, 0.0
    if lay.sequence_parallel:
        one_way = 2 * comm.all_gather(cluster, group, act_bytes) + 2 * comm.reduce_scatter(cluster, group, act_bytes)
    else:
        one_way = 2 * comm.all_reduce(cluster, group, act_bytes)
    forward = one_way * (1 - min(params.tp_forward_overlap, 1 - 1 / lay.tp))
    return one_way, forward + one_way * (1 - params.tp_comm_overlap)
