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
            GPU's queue, and the block's kernels (routing, permutation, the expert GEMMs) are
            smaller than the host's time to issue them, so the GPU waits on every launch:
            (kernels) × ``CostParams.moe_launch_s``. Counted per part (``ROUTER_KERNELS`` ...
            ``EXPERT_KERNELS``, forward and backward). The expert GEMMs (``expert_gemm_kernels``):
            Megatron-Core's Transformer Engine issues one GEMM per local expert; plait's runtime on a
            GPU (bf16 compute) one ``torch._grouped_mm`` per projection whatever the local experts
            (``PROJECTION_GEMMS``; ``plait.run.modules.experts.use_grouped_mm``), with fp8 also
            torchao's casts around each (``FP8_GROUPED_KERNELS``), and on a CPU (fp32) as many per
            local expert. plait's ``moe_overlap=chunked`` launches the permutation and exchange, the
            experts' fixed kernels and their GEMMs again for every chunk after the first
            (``plait.run.parallel.expert_overlap``; the router and the preprocessing run once:
            ``plait.plan.moe.timing.runtime_chunks``).

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
from plait.spec.capabilities import plait_grouped_experts, routed_expert_precision
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
# plait's runtime, the GEMMs of its three projections (w1, w3 and w2 forward; a data and a weight
#   gradient of each backward; plait.run.modules.experts.expert_forward): on a GPU one torch._grouped_mm
#   each whatever the local experts, on a CPU one torch.mm each per local expert
PROJECTION_GEMMS = (3, 6)
# plait's fp8 experts, per projection besides its grouped GEMM (plait.run.parallel.float8.fp8_grouped_mm
#   on torchao 0.17's _to_fp8_rowwise_then_scaled_grouped_mm, the release for torch 2.11 that the GPU
#   proof carries; 0.18 fuses the weight's scale and cast into one Triton kernel, ~6 fewer forward).
#   The GPU proof's "moe: train fp8" step time checks them. ESTIMATES from reading the code, not
#   profiled: forward, the token groups padded to 16 rows (~18 small index kernels), the column-major
#   weight copy, torchao's row-wise cast of the rows (1 Triton kernel), its weight scales and cast
#   (~7 eager kernels), two scale reciprocals, the unpadding gather; backward, the gather's and the
#   padding's gradients (3), torchao's two row-wise casts and its fused column-wise cast (3 Triton
#   kernels), four reciprocals and the weight copy's gradient
FP8_GROUPED_KERNELS = (30, 11)
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


def expert_gemm_kernels(model, layout: Layout, runtime: str, gpu) -> tuple[float, float]:
    """(forward, backward) kernels of the expert GEMMs of one MoE layer and chunk on ``gpu`` (module
    docstring): Megatron's one GEMM per local expert and projection; plait's runtime (``runtime``
    "torch") one grouped GEMM per projection where it runs them grouped
    (``plait.spec.capabilities.plait_grouped_experts``: bf16 on a Hopper or Blackwell GPU, aligned
    widths), else one GEMM per local expert and projection (a CPU, an A100)."""
    local = model.moe.n_experts / layout.ep
    if runtime != "torch":
        return local * EXPERT_KERNELS[0], local * EXPERT_KERNELS[1]
    fp8 = routed_expert_precision(model, layout, runtime) == "fp8"
    if not fp8 and not plait_grouped_experts(model, layout, gpu):
        return local * PROJECTION_GEMMS[0], local * PROJECTION_GEMMS[1]
    projections = 3  # w1, w3, w2
    return tuple(PROJECTION_GEMMS[way] + (projections * FP8_GROUPED_KERNELS[way] if fp8 else 0)
                 for way in (0, 1))


def moe_kernels(model, layout: Layout, params: CostParams, runtime: str, gpu) -> tuple[float, float]:
    """(forward, backward) kernels the host launches for one MoE layer (module docstring), after the
    CUDA graphs of ``params`` took theirs; ``runtime``'s chunks (``plait.plan.moe.timing.runtime_chunks``),
    each with the permutation, the exchange and the experts (``expert_gemm_kernels``)."""
    router = params.moe_router_graphed
    chunks = runtime_chunks(layout, runtime)
    gemms = expert_gemm_kernels(model, layout, runtime, gpu)
    out = []
    for way in (0, 1):
        graphed = ROUTER_KERNELS[way] + PREPROCESS_KERNELS[way]
        eager = chunks * (PERMUTE_KERNELS[way] + EXPERT_FIXED_KERNELS[way] + gemms[way])
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
    forward, backward = moe_kernels(model, layout, params, runtime, cluster.gpu)
    return MoESync((counts, 0.0), (sync, 0.0), (forward * params.moe_launch_s, backward * params.moe_launch_s))
