"""Context parallelism as plait's runtime runs each ``Layout.cp_impl``: the attention work on one
rank and the K/V exchange around it, per layer and micro-batch. Seconds. No torch.

Each rank holds seq / cp tokens of every sequence (head-tail load balancing,
``plait.run.parallel.context``). What the four kernels compute and send:

  ``torch``    PyTorch's ring attention with the device's fused kernel per block: causal work, as
               a single-device FlashAttention of the whole sequence split cp ways. K/V (repeated
               to the query heads) all-gathered once in the forward, hidden behind the attention;
               in the backward gathered again, and the fp32 dK/dV accumulators passed around the
               ring: cp hops, each hidden behind the next block but the last.
  ``ulysses``  all-to-all of Q, K, V (sequence- to head-sharded) and of the output back, then the
               device's causal SDPA over whole sequences: causal work; 4 all-to-alls forward and 4
               backward, each awaited before the next op (exposed).
  ``allgather`` all-gather of K and of V, SDPA with an explicit mask by global position (the
               kernel computes the whole square: every key of the sequence per query); the backward
               reduce-scatters dK and dV. Each collective awaited (exposed).
  ``p2p``      Transformer Engine's ring (Megatron-Core ``cp_comm_type="p2p"``; planned, not run by
               plait train): fused kernels per block, causal work; K/V travel at their own (GQA)
               heads in the compute dtype, cp-1 hops forward and again backward with the dK/dV
               accumulators, each hop sent while a block is computed (hidden).
  ``ring``     plait's exact, portable kernel (``plait.run.parallel.context.ops``): fp32 scores
               materialized per block. Step 0 is the rank's diagonal block, the full (seq/cp)²
               square with its upper triangle masked; each of the cp-1 later steps is half a block
               (``RingAttention``'s docstring). Priced as eager attention: the two batched GEMMs
               per block forward and five backward (scores recomputed), and the score elements'
               fp32 traffic (``plait.plan.kernels.RING_SCORE_BYTES``). K and V travel as one fp32 buffer, sent on
               while a block is computed (cp-1 hops, forward and backward, each hidden behind
               ``cp_comm_overlap`` of that pass's attention); the backward's dK/dV accumulator
               makes cp more hops, each awaited before the next block (exposed).

The ring kernel's GEMMs run in fp32; they are priced at the device's GEMM rate (a CPU profile's
rate is fp32; on a GPU without TF32 the fp32 rate is lower, so the ring is slower still than
predicted there). Exponentials are priced by the bytes they move (on a CPU they are slower).
Memory (``plait.plan.memory``) does not tell the kernels apart yet: the whole-sequence K/V that
``allgather`` holds during a layer and ``torch``'s gathered, head-repeated K/V are not counted.
The attention work is priced in ``plait.plan.kernels`` (``layer_times(..., cp_impl)``); the
exchange is declared here (``exchanges``: what ``tests/run/test_context_parallel.py`` counts in the
runtime's calls, bytes included) and priced by ``cp_exchange``; the search's choice of kernel is
``plait.plan.context.choice``.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.plan import comm
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import GroupPlacement, Layout
from plait.spec.model import ModelSpec

FP32 = 4.0


@dataclass(frozen=True)
class Exchange:
    """``calls`` collectives ``op`` (a ``plait.plan.comm`` function: ``send_recv`` of a message,
    ``all_gather`` / ``reduce_scatter`` of the whole gathered buffer, ``all_to_all`` of the rank's
    buffer) of ``nbytes`` each, in one layer's ``phase`` ("forward" or "backward") of one
    micro-batch; ``hidden``: issued while attention runs (hides behind ``cp_comm_overlap`` of it),
    else each awaited before the next op."""

    phase: str
    op: str
    calls: int
    nbytes: float
    hidden: bool


def exchanges(model: ModelSpec, lay: Layout, tokens: float, element_bytes: float) -> list[Exchange]:
    """The collectives of ``lay.cp_impl`` per layer and micro-batch, ``tokens`` on this rank,
    activations of ``element_bytes`` (module docstring); none at cp = 1."""
    cp = lay.cp
    if cp <= 1:
        return []
    k_local = tokens * model.kv_hidden / lay.tp  # elements of K (and of V) on this rank
    q_local = tokens * model.q_hidden / lay.tp
    if lay.cp_impl == "allgather":
        whole = element_bytes * k_local * cp
        return [Exchange("forward", "all_gather", 2, whole, False),
                Exchange("backward", "reduce_scatter", 2, whole, False)]
    if lay.cp_impl == "ulysses":
        return [Exchange(phase, "all_to_all", 2, element_bytes * elements, False)  # Q and O, K and V
                for phase in ("forward", "backward") for elements in (q_local, k_local)]
    if lay.cp_impl == "torch":  # K/V repeated to the query heads; dK/dV accumulated in fp32
        whole = element_bytes * 2 * q_local * cp
        hop = FP32 * 2 * q_local
        return [Exchange("forward", "all_gather", 1, whole, True), Exchange("backward", "all_gather", 1, whole, True),
                Exchange("backward", "send_recv", cp - 1, hop, True), Exchange("backward", "send_recv", 1, hop, False)]
    if lay.cp_impl == "p2p":  # Transformer Engine: K/V (then dK/dV) at their own heads, compute dtype
        hop = element_bytes * 2 * k_local
        return [Exchange("forward", "send_recv", cp - 1, hop, True), Exchange("backward", "send_recv", 2 * (cp - 1), hop, True)]
    hop = FP32 * 2 * k_local  # ring: K and V as one fp32 buffer, and their gradient accumulator
    return [Exchange("forward", "send_recv", cp - 1, hop, True), Exchange("backward", "send_recv", cp - 1, hop, True),
            Exchange("backward", "send_recv", cp, hop, False)]


def _seconds(cluster: ClusterSpec, group: GroupPlacement, exchange: Exchange) -> float:
    if exchange.op == "send_recv":
        return exchange.calls * comm.send_recv(cluster, group.spans_nodes, exchange.nbytes)
    return exchange.calls * getattr(comm, exchange.op)(cluster, group, exchange.nbytes)


def cp_exchange(model: ModelSpec, cluster: ClusterSpec, group: GroupPlacement, lay: Layout, tokens: float,
                attn_fwd: float, attn_bwd: float, params: CostParams) -> tuple[float, float]:
    """(forward, backward) exposed seconds of the context-parallel exchange of one layer and
    micro-batch over the cp ``group``: the ``exchanges`` issued while attention runs beyond
    ``params.cp_comm_overlap`` of that pass's attention (``attn_*``), the others whole. 0 at cp = 1."""
    out = []
    for phase, window in (("forward", attn_fwd), ("backward", attn_bwd)):
        mine = [e for e in exchanges(model, lay, tokens, cluster.gpu.element_bytes) if e.phase == phase]
        hidden = sum(_seconds(cluster, group, e) for e in mine if e.hidden)
        exposed = sum(_seconds(cluster, group, e) for e in mine if not e.hidden)
        out.append(max(0.0, hidden - params.cp_comm_overlap * window) + exposed)
    return out[0], out[1]
