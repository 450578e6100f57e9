"""Exposed ZeRO-3 / FSDP communication of one step, unit by unit as the runtime shards. Seconds.

plait's runtime (``plait.run.parallel.data.unit_groups``, torchtitan's grouping) makes each
transformer block an FSDP unit of its own and the model's ends two more: the token embedding
(first, resharded after its forward like the blocks) and the final norm with the LM head (last,
never resharded: its backward follows at once). A tied embedding and head are one unit, first
and never resharded. Each unit's parameters are all-gathered (compute dtype) before its forward,
again before its backward when resharded, and its gradients reduce-scattered after its backward
(``CostParams.grad_reduce_bytes`` per element) - each a flat ring over the shard group
(``plait.plan.comm``), no faster than ``CostParams.zero3_collective_bandwidth``.

Overlap, prefetch depth 1 (FSDP's and DeepSpeed's default, so slack does not carry over):
  forward   the first unit's gather is exposed; unit i's gather hides behind up to
            ``dp_overlap`` of unit i-1's forward (the embedding's lookup is ~free, so the first
            block's gather is nearly exposed too);
  backward  the last unit's re-gather (if resharded) is exposed; while unit j runs its backward,
            unit j-1's re-gather and unit j+1's reduce-scatter hide behind it; the first unit's
            reduce-scatter ends the micro-batch and is exposed once per step (earlier
            micro-batches' hide behind the next forward).

The ends matter when they are large against a block: a 60M-parameter Llama with a 32k vocabulary
holds more than half its parameters in the embedding and the head, whose gathers an even
split over the layers would hide behind layers' compute that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.plan import comm
from plait.plan.terms.overlap import exposed
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import GroupPlacement


@dataclass(frozen=True)
class Unit:
    """One FSDP unit of a stage: the parameters it gathers (one GPU's share before sharding, after
    TP), the compute of its forward and of its backward (recomputation included) per micro-batch,
    seconds, and whether it is gathered again for its backward."""

    params: float
    forward_s: float
    backward_s: float
    reshard: bool


def stage_units(embedding: float, blocks: float, head: float, layers: int, block_forward_s: float,
                block_backward_s: float, head_s: float, reshard: bool, shared: float = 0.0) -> list[Unit]:
    """The units of one pipeline stage in forward order. ``embedding`` / ``head``: the ends' parameters
    on this stage (0 where it holds none), ``blocks`` the blocks' (split evenly over ``layers``),
    ``head_s`` the LM head's forward + backward seconds per micro-batch (a third forward),
    ``shared``: the matrix a tied embedding and head share (0 when untied)."""
    units = [Unit(blocks / layers, block_forward_s, block_backward_s, reshard) for _ in range(layers)] if layers else []
    if shared and embedding and head:  # one unit: the shared matrix, the positions and the norm
        return [Unit(embedding + head - shared, head_s / 3.0, 2.0 * head_s / 3.0, False)] + units
    first = [Unit(embedding, 0.0, 0.0, reshard)] if embedding else []
    last = [Unit(head, head_s / 3.0, 2.0 * head_s / 3.0, False)] if head else []
    return first + units + last


def _capped(seconds: float, group: GroupPlacement, nbytes: float, params: CostParams) -> float:
    """``seconds`` of a ZeRO-3 collective of ``nbytes`` (full buffer) over ``group``, no faster than
    the implementation's own rate cap (``CostParams.zero3_collective_bandwidth``) allows for the
    (n-1)/n · nbytes one GPU sends."""
    cap = params.zero3_collective_bandwidth
    if cap <= 0 or group.size <= 1:
        return seconds
    return max(seconds, (group.size - 1) / group.size * nbytes / cap)


def zero3_exposed(cluster: ClusterSpec, shard: GroupPlacement, units: list[Unit], micro_batches: int,
                  params: CostParams) -> float:
    """Exposed ZeRO-3 communication of one step of ``micro_batches`` over ``units`` (forward order),
    seconds (see the module doc)."""
    if not units:
        return 0.0
    element = cluster.gpu.element_bytes  # weights are gathered in the compute dtype
    seconds: dict[float, tuple[float, float]] = {}  # (gather, reduce-scatter) by unit size: the blocks are alike
    for size in {u.params for u in units}:
        gathered, reduced = element * size, params.grad_reduce_bytes * size
        seconds[size] = (_capped(comm.all_gather(cluster, shard, gathered), shard, gathered, params),
                         _capped(comm.reduce_scatter(cluster, shard, reduced), shard, reduced, params))
    gather = [seconds[u.params][0] for u in units]
    scatter = [seconds[u.params][1] for u in units]
    last = len(units) - 1
    forward = gather[0] + sum(exposed(gather[i], units[i - 1].forward_s, params) for i in range(1, last + 1))
    backward = gather[last] if units[last].reshard else 0.0
    for j in range(last, -1, -1):
        in_flight = (gather[j - 1] if j >= 1 and units[j - 1].reshard else 0.0) + (scatter[j + 1] if j < last else 0.0)
        backward += exposed(in_flight, units[j].backward_s, params)
    return micro_batches * (forward + backward) + scatter[0]
