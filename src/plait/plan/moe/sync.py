"""The dropless token dispatcher's per-layer synchronisation: what one MoE layer costs besides its
kernels' work and its bytes. Seconds per MoE layer and micro-batch.

A dropless dispatcher sizes the all-to-all and the grouped GEMMs from the tokens each expert got,
numbers that exist only on the GPU: Megatron-Core's ``MoEAlltoAllTokenDispatcher.preprocess``
(megatron/core/transformer/moe/token_dispatcher.py) gathers every rank's tokens per expert over
the tp×ep group and copies the splits to the host before the expert all-to-all ("A synchronization
is needed before expert parallel AlltoAll communication"); plait's runtime does the same
(``plait.run.parallel.expert.AllToAllDispatcher.dispatch``: an all-to-all of the counts, then
``tolist()``; at ep = 1 ``LocalDispatcher``'s ``tolist()``). Three parts, each named:

  counts    the token-count exchange: E integers per rank gathered over the ep group, a
            latency-bound collective priced by ``plait.plan.comm.all_gather`` with the cluster
            preset's latencies (forward only; none at ep = 1);
  sync      the device-to-host copy of the counts and the stream synchronisation (``SYNC_S``);
  launches  the kernels the host issues for the MoE block, each exposed: the sync empties the
            GPU's queue, and the block's kernels (routing, permutation, one GEMM per local expert)
            are smaller than the host's time to issue them, so the GPU waits on every launch:
            (kernels) × ``CostParams.moe_launch_s``. Counted per part (``ROUTER_KERNELS`` ...
            ``EXPERT_KERNELS``, forward and backward). plait's ``moe_overlap=chunked`` launches the
            permutation and exchange, the experts' fixed kernels and its grouped GEMMs again for
            every chunk after the first (``CHUNK_GEMM_KERNELS``; ``plait.run.parallel.expert_overlap``;
            the router and the preprocessing run once: ``plait.plan.moe.timing.runtime_chunks``).

CUDA graphs remove launches: ``CostParams.moe_router_graphed`` (Transformer Engine graphs with
``cuda_graph_scope`` ``moe_router`` and ``moe_preprocess``, as Megatron-Bridge's GB200 recipes set)
replaces the router's and the preprocessing's kernels by one graph launch each way;
``CostParams.moe_layer_graphed`` (``cuda_graph_impl="full_iteration"``, with the expert-rank
capacity and paged stash that give every tensor a fixed size) removes every launch and the sync;
the count exchange stays, on the GPU. Both are fractions of the MoE layers (0 or 1 in practice).
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.plan import comm
from plait.plan.moe.timing import runtime_chunks
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import Layout
from plait.spec.moe.layout import expert_groups

# Kernels the host launches per MoE layer and micro-batch, (forward, backward), read from
# Megatron-Core's MoE layer as the Megatron-Bridge recipes run it (moe_router_fusion and
# moe_permute_fusion on). ESTIMATES from reading the code, not profiled:
# router (router.py TopKRouter): gating GEMM, fused top-k with the score function, the aux-loss
#   scores, the aux loss, tokens per expert, the aux-loss scaler; the backward mirrors them
ROUTER_KERNELS = (6, 6)
# preprocessing (token_dispatcher.py preprocess): routing-map sum and cast, splits per rank, the
#   count gather and its transpose/slice/sums, the device-to-host copy; forward only
PREPROCESS_KERNELS = (10, 0)
# permutation and exchange (moe_utils.py fused permute/unpermute): row-id map and permute, the
#   all-to-all, sort by local expert; combine: sort back, all-to-all, unpermute; the backward mirrors
PERMUTE_KERNELS = (8, 8)
# the experts besides their GEMMs: activation and the routing-probability scaling
EXPERT_FIXED_KERNELS = (2, 2)
# per local expert (Transformer Engine's GroupedLinear issues one cuBLAS GEMM per expert):
#   fc1 and fc2 forward, their data and weight gradients backward
EXPERT_KERNELS = (2, 4)
# plait's moe_overlap=chunked, per chunk after the first: the permutation and exchange and the
#   experts' fixed kernels again, and its grouped GEMMs (torch._grouped_mm on CUDA: w1, w3 and w2
#   forward, a data and a weight gradient of each backward), whatever the local experts
CHUNK_GEMM_KERNELS = (3, 6)
GRAPH_LAUNCHES = (1, 1)  # a captured scope replayed: one graph launch each way
# ESTIMATE: a pinned device-to-host copy of a few hundred bytes and the host's wake-up from the
# stream synchronisation, ~10 us (PCIe Gen5 / NVLink-C2C round trips are a few microseconds; the
# CUDA driver's event wake-up adds several)
SYNC_S = 10e-6
COUNT_BYTES = 8  # int64 per expert (routing_map.sum(dim=0).long())


@dataclass(frozen=True)
class MoESync:
    """Seconds of one MoE layer and micro-batch (module docstring): each part (forward, backward)."""

    counts: tuple[float, float]
    sync: tuple[float, float]
    launches: tuple[float, float]

    @property
    def forward(self) -> float:
        return self.counts[0] + self.sync[0] + self.launches[0]

    @property
    def backward(self) -> float:
        return self.counts[1] + self.sync[1] + self.launches[1]

    @property
    def total(self) -> float:
        return self.forward + self.backward


def moe_kernels(model, layout: Layout, params: CostParams, runtime: str = "torch") -> tuple[float, float]:
    """(forward, backward) kernels the host launches for one MoE layer (module docstring), after the
    CUDA graphs of ``params`` took theirs; ``runtime``'s chunks (``plait.plan.moe.timing.runtime_chunks``)."""
    local = model.moe.n_experts / layout.ep
    router = params.moe_router_graphed
    again = runtime_chunks(layout, runtime) - 1
    out = []
    for way in (0, 1):
        graphed = ROUTER_KERNELS[way] + PREPROCESS_KERNELS[way]
        eager = PERMUTE_KERNELS[way] + EXPERT_FIXED_KERNELS[way] + local * EXPERT_KERNELS[way]
        eager += again * (PERMUTE_KERNELS[way] + EXPERT_FIXED_KERNELS[way] + CHUNK_GEMM_KERNELS[way])
        kernels = eager + (1.0 - router) * graphed + router * GRAPH_LAUNCHES[way]
        out.append((1.0 - params.moe_layer_graphed) * kernels)
    return out[0], out[1]


def moe_sync_layer(model, cluster: ClusterSpec, layout: Layout, params: CostParams,
                   runtime: str = "torch") -> MoESync:
    """The three parts of one MoE layer and micro-batch (module docstring); zeros for a dense model."""
    if model.moe is None:
        return MoESync((0.0, 0.0), (0.0, 0.0), (0.0, 0.0))
    counts = 0.0
    if layout.ep > 1:
        group = expert_groups(layout, cluster.gpus_per_node, runtime)["ep"]
        counts = comm.all_gather(cluster, group, COUNT_BYTES * model.moe.n_experts * layout.ep)
    sync = (1.0 - params.moe_layer_graphed) * SYNC_S
    forward, backward = moe_kernels(model, layout, params, runtime)
    return MoESync((counts, 0.0), (sync, 0.0), (forward * params.moe_launch_s, backward * params.moe_launch_s))
