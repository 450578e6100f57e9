"""Pipeline parallelism: the send/recv of one micro-batch and the schedule's bubble. Seconds."""

from __future__ import annotations

from plait.plan import comm
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import GroupPlacement, Layout

BUBBLE_DIVISOR = {"gpipe": 1.0, "1f1b": 1.0, "zero-bubble": 3.0}


def bubble_fraction(schedule: str, pp: int, micro_batches: int, vpp: int = 1) -> float:
    """Pipeline bubble time over ideal time for balanced stages (Narayanan et al. 2021):
    (p-1)/m for GPipe and 1F1B, (p-1)/(v·m) for interleaved 1F1B, a third of 1F1B's for ZB-H1."""
    if pp <= 1:
        return 0.0
    divisor = vpp if schedule == "interleaved-1f1b" else BUBBLE_DIVISOR[schedule]
    return (pp - 1) / (divisor * micro_batches)


def pp_microbatch(cluster: ClusterSpec, group: GroupPlacement, lay: Layout, act_bytes: float,
                  params: CostParams) -> float:
    """Forward activations and backward gradients of one micro-batch, each virtual stage's (scattered
    by tp or SP-sharded); with virtual stages, beyond what the software hides (``pp_comm_overlap``:
    Megatron's overlap_p2p_comm works only in the interleaved schedule); 0 at pp = 1."""
    if lay.pp <= 1:
        return 0.0
    sent = act_bytes / (max(1, lay.tp))
    hidden = params.pp_comm_overlap if lay.vpp > 1 else 0.0
    return 2 * lay.vpp * comm.send_recv(cluster, group.spans_nodes, sent) * (1 - hidden)


def bubble(lay: Layout, micro_batches: int, average_mb: float) -> float:
    """Fill and drain of the schedule: the bubble fraction of m micro-batches of the average stage."""
    if lay.pp <= 1:
        return 0.0
    return bubble_fraction(lay.schedule, lay.pp, micro_batches, lay.vpp) * micro_batches * average_mb
