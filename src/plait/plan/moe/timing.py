"""Time of mixture-of-experts, MLA and sliding-window layers, and of the expert all-to-all. Seconds.

``moe_layer_times`` gives a ``LayerTimes`` (``plait.plan.kernels``) of the model's mean layer (dense
and MoE layers weighted by their counts), so the step model of ``plait.plan.cost`` applies as for a
dense model:
  * attention GEMMs at their real widths (MLA's down/up projections; a head_dim override), the
    attention core (FlashAttention's curve) on (d_qk + d_v) per key with the keys a query sees
    (causal, and at most ``sliding_window`` on a local layer, averaged over the layers);
  * router GEMM (T_r × h × E, T_r = tokens on the rank after sequence parallelism), shared experts
    as a dense MLP of n_shared·f_s split by tp, and the routed experts as two grouped GEMMs
    (``grouped_gemm_time``): n_experts/ep experts, each on m = R / (n_experts/ep) tokens, R =
    T_r·top_k·etp·load (etp with sequence parallelism only: ``plait.plan.moe.memory.routed_tokens``);
    the efficiency curve is taken at one expert's FLOPs (a grouped GEMM of small per-expert GEMMs
    under-fills the GPU like each of them: "tokens-per-expert efficiency"), with
    one launch for the group and the roofline on all the experts' weights;
  * the attention core counts only the keys a query sees in a sliding-window layer, as
    FlashAttention's and Transformer Engine's windowed kernels compute them (the MoE sources run
    Megatron-Core); a dense model's ``plait.plan.kernels`` prices plait's runtime, whose SDPA with
    an explicit window mask computes the whole square;
  * the dense layer's kernels (``plait.plan.kernels.layer_times``) are used for their element-wise
    work only (the GEMMs and the attention core are priced here, never twice); biases, Q/K norms
    and sinks add no GEMM time;
  * element-wise work of the dense layer plus the dispatch's permute/unpermute (``PERMUTE_PASSES``
    bf16 passes over R·h), and the router's softmax over T_r·E in fp32; compiled blocks
    (``compiled_moe_elementwise``): ``plait.plan.compiled``'s regions over the mean layer's
    activation widths, the permutes and the softmax as eager.
``load`` is ``CostParams.moe_load_imbalance``: the most loaded rank's routed tokens over the mean
(1.0: balanced, as the force-balanced benchmarks run; a router trained with an auxiliary loss
typically stays within 1.1-1.3 of the mean); a capacity factor caps it. It scales the expert GEMMs
and the all-to-all, since the slowest rank sets the pace.

Expert all-to-all (``expert_a2a``): per MoE layer, dispatch and combine in the forward and both
again in the backward, each moving T_r·top_k·h bf16 from every rank, over the ep group placed as
Megatron places it (``plait.spec.moe.layout``). Across nodes it is the hierarchical all-to-all
(``plait.plan.comm.all_to_all_hierarchical``): a token crosses the network once per destination
node (``remote_nodes_per_token``: the expected distinct other nodes among its top-k experts under
balanced routing, capped by group-limited routing), then fans out over NVLink. etp > 1 adds the
all-gather (and reduce-scatter) of the routed tokens over the etp group with sequence parallelism,
the all-reduce of the experts' partial outputs without it (the etp ranks hold the same tokens). Overlap (``Layout.moe_overlap``):
  none     every all-to-all is exposed;
  shared   the dispatch hides behind the shared experts' GEMMs of the same layer (in the backward
           the reverse dispatch behind their backward); the combine is exposed: exposed = 2·a2a -
           min(a2a, shared), as ``plait.run.parallel.expert_overlap`` runs it;
  chunked  the micro-batch runs in ``MOE_CHUNKS`` chunks, one chunk's all-to-all behind another's
           expert GEMMs: exposed = max(0, comm - gemm) + min(comm, gemm) / MOE_CHUNKS (the first
           chunk's dispatch and the last one's combine are exposed; the runtime chunks the same
           number: ``plait.run.parallel.expert_overlap``), with comm the chunks' all-to-alls (each
           its own latency) and gemm the expert GEMMs run as MOE_CHUNKS smaller grouped GEMMs;
           what that split adds over one grouped GEMM (launches, the efficiency curve at fewer
           rows per expert), the rows' gather into chunk order and back (2 read+write passes
           over R·h per pass) and, in the backward, the sum of the chunks' expert weight gradients
           (``chunk_gradient_sums``) are added to the exposed time (item ``ep_comm``); the kernels
           each chunk launches again are ``plait.plan.moe.sync``'s. Megatron's 1F1B all-to-all
           overlap (what ``plait validate`` reads as chunked) hides the same share behind another
           micro-batch's compute and pays none of these: it runs each micro-batch whole
           (``runtime_chunks``).
Hidden communication slows the compute it shares the GPU with by ``CostParams.overlap_slowdown``.
"""

from __future__ import annotations

from plait.plan.memo import by_layout_fields

from plait.plan import comm
from plait.plan.compiled import blend, compiled_elementwise
from plait.plan.kernels import LayerTimes, cp_keys_per_query, gemm_time, layer_times, mlp_elementwise_time
from plait.plan.moe.memory import routed_tokens, stage_expert_params
from plait.plan.params import CostParams
from plait.spec.capabilities import routed_expert_precision
from plait.spec.hardware import ClusterSpec, GpuSpec
from plait.spec.layout import FP8_PRECISIONS, Layout, group_of
from plait.spec.moe.parts import moe_layer_count
from plait.spec.moe.counts import mean_keys_per_query
from plait.spec.moe.layout import expert_data_parallel, expert_groups, expert_tp_sum

MOE_CHUNKS = 4  # moe_overlap=chunked: chunks per micro-batch (Comet and FSMoE pipeline 2-8)
PERMUTE_PASSES = 4.0  # dispatch permute and combine unpermute: read + write of R·h bf16 each, forward


def runtime_chunks(layout: Layout, runtime: str = "torch") -> int:
    """The chunks each micro-batch's expert exchange runs in: ``MOE_CHUNKS`` for plait's runtime's
    moe_overlap=chunked at ep > 1 (``plait.run.parallel.expert_overlap``; at ep = 1 it runs as none),
    else 1. Megatron's 1F1B all-to-all overlap, which ``plait validate`` reads as chunked, overlaps
    whole micro-batches and runs each once."""
    return MOE_CHUNKS if layout.moe_overlap == "chunked" and layout.ep > 1 and runtime == "torch" else 1


def grouped_gemm_time(gpu: GpuSpec, params: CostParams, groups: float, m: float, k: float, n: float,
                      precision: str = "bf16") -> float:
    """``groups`` GEMMs of (m×k)·(k×n) in one grouped kernel, seconds (module docstring)."""
    if groups <= 0 or m <= 0:
        return 0.0
    one = gemm_time(gpu, params, m, k, n, precision) - gpu.kernel_overhead
    operand = 1.0 if precision in FP8_PRECISIONS else gpu.element_bytes
    weights = groups * operand * k * n / (gpu.hbm_bandwidth * gpu.memory_efficiency)
    return max(groups * one, weights) + gpu.kernel_overhead


@by_layout_fields("tp", "sp", "cp", "mbs", "ep", "etp", "precision")
def moe_mlp_times(model, gpu: GpuSpec, params: CostParams, layout: Layout, tokens: float,
                  seq_len: int, runtime: str = "torch") -> tuple[float, float, float]:
    """Forward (router, shared experts, routed experts) GEMM seconds of one MoE layer, one micro-batch;
    the routed experts in ``runtime``'s precision for them (``routed_expert_precision``)."""
    moe, h, t, p = model.moe, model.hidden, layout.tp, layout.precision
    t_r, routed = routed_tokens(model, layout, seq_len, load=params.moe_load_imbalance)
    router = gemm_time(gpu, params, t_r, h, moe.n_experts, "bf16")
    shared = 0.0
    if moe.n_shared:
        width = moe.n_shared * moe.shared_width
        shared = gemm_time(gpu, params, tokens, h, 2 * width / t, p) + gemm_time(gpu, params, tokens, width / t, h, p)
    return router, shared, routed_expert_gemms(model, gpu, params, layout, routed, runtime=runtime)


def routed_expert_gemms(model, gpu: GpuSpec, params: CostParams, layout: Layout, routed: float,
                        chunks: int = 1, runtime: str = "torch") -> float:
    """Forward seconds of the routed experts' two grouped GEMMs on ``routed`` rows, run as ``chunks``
    pairs of grouped GEMMs on routed/chunks rows each (moe_overlap=chunked), in ``runtime``'s precision
    for them (``plait.spec.capabilities.routed_expert_precision``)."""
    moe, h, p = model.moe, model.hidden, routed_expert_precision(model, layout, runtime)
    local = moe.n_experts / layout.ep
    m, f = routed / local / chunks, moe.expert_ffn / layout.etp
    return chunks * (grouped_gemm_time(gpu, params, local, m, h, 2 * f, p) + grouped_gemm_time(gpu, params, local, m, f, h, p))


def _attention_gemms(model, gpu: GpuSpec, params: CostParams, tokens: float, t: int, p: str) -> float:
    h, a, mla = model.hidden, model.n_heads, model.mla
    if mla is not None:
        out = gemm_time(gpu, params, tokens, h, mla.kv_lora_rank + mla.qk_rope_head_dim, p)
        out += gemm_time(gpu, params, tokens, mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim) / t, p)
        if mla.q_lora_rank:
            out += gemm_time(gpu, params, tokens, h, mla.q_lora_rank, p)
            out += gemm_time(gpu, params, tokens, mla.q_lora_rank, a * mla.qk_head_dim / t, p)
        else:
            out += gemm_time(gpu, params, tokens, h, a * mla.qk_head_dim / t, p)
        return out + gemm_time(gpu, params, tokens, a * mla.v_head_dim / t, h, p)
    q, g = model.q_hidden, model.kv_hidden
    return gemm_time(gpu, params, tokens, h, (q + 2 * g) / t, p) + gemm_time(gpu, params, tokens, q / t, h, p)


@by_layout_fields("tp", "sp", "cp", "cp_impl", "mbs", "ep", "etp", "attn", "norm", "precision")
def moe_layer_times(model, gpu: GpuSpec, params: CostParams, layout: Layout, tokens: float, seq_len: int,
                    runtime: str = "torch", compiled: float = 0.0) -> LayerTimes:
    """Kernel times of the model's mean layer for ``tokens`` on this rank (module docstring);
    ``compiled``: the share of the blocks under torch.compile (``compiled_moe_elementwise``)."""
    t, cp, p = layout.tp, layout.cp, layout.precision
    dense = layer_times(model, gpu, params, tokens, seq_len, t, cp, layout.sequence_parallel, "flash", p,
                        layout.norm, runtime, layout.cp_impl)
    h, f = model.hidden, model.ffn_hidden
    dense_mlp = gemm_time(gpu, params, tokens, h, 2 * f / t, p) + gemm_time(gpu, params, tokens, f / t, h, p)
    fraction = moe_layer_count(model) / model.n_layers
    mlp_gemm = (1.0 - fraction) * dense_mlp
    elementwise = dense.elementwise_fwd
    mlp_elementwise = (1.0 - fraction) * dense.mlp_elementwise_fwd
    if model.moe is not None:
        mlp_gemm += fraction * sum(moe_mlp_times(model, gpu, params, layout, tokens, seq_len, runtime))
        t_r, routed = routed_tokens(model, layout, seq_len, load=params.moe_load_imbalance)
        moved = PERMUTE_PASSES * gpu.element_bytes * routed * h + 2 * 4.0 * t_r * model.moe.n_experts
        elementwise += fraction * (moved / (gpu.hbm_bandwidth * gpu.memory_efficiency) + 6 * gpu.kernel_overhead)
        moe = model.moe  # the MoE half: its norm, the routed and shared experts' activations, the permutes
        act = routed * moe.expert_ffn / layout.etp + tokens * moe.n_shared * moe.shared_width / t
        rep = t if layout.sequence_parallel else 1
        mlp_elementwise += fraction * mlp_elementwise_time(model, gpu, layout.norm, tokens * h / rep, act, moved, 6)
    gemm = _attention_gemms(model, gpu, params, tokens, t, p) + mlp_gemm
    mlp_elementwise = min(elementwise, mlp_elementwise)
    elementwise_bwd = None
    if compiled:
        elementwise, elementwise_bwd, mlp_elementwise = compiled_moe_elementwise(
            model, gpu, params, layout, tokens, seq_len, compiled, (elementwise, 2 * elementwise, mlp_elementwise))
    if model.moe is not None:  # fp8 experts' weight casts: eager, outside any compiled region
        prep_fwd, prep_bwd = fp8_weight_prep(model, gpu, layout, runtime)
        if prep_fwd:
            elementwise_bwd = (2 * elementwise if elementwise_bwd is None else elementwise_bwd) + fraction * prep_bwd
            elementwise += fraction * prep_fwd
            mlp_elementwise += fraction * prep_fwd
    # attention core: (d_qk + d_v) per key, the keys of each layer's window, averaged over layers
    if cp > 1 and layout.cp_impl == "ring":  # plait's ring kernel (plait.plan.kernels.ring_attention_times)
        return LayerTimes(gemm, dense.attn_fwd, dense.attn_bwd, elementwise, 0.0, mlp_gemm, mlp_elementwise,
                          elementwise_bwd)
    keys = cp_keys_per_query(layout.cp_impl, seq_len, mean_keys_per_query(model, seq_len)) if cp > 1 \
        else mean_keys_per_query(model, seq_len)
    if model.mla is not None:
        width = model.n_heads * (model.mla.qk_head_dim + model.mla.v_head_dim)
    else:
        width = 2 * model.q_hidden
    flops = 2.0 * (tokens / (seq_len / cp)) * width / t * (seq_len / cp) * keys
    peak = gpu.bf16_flops * gpu.attention_efficiency
    attn_fwd = flops / peak * (flops + params.gemm_half_flops) / flops + gpu.kernel_overhead
    return LayerTimes(gemm, attn_fwd, params.flash_backward_factor * attn_fwd, elementwise, 0.0, mlp_gemm,
                      mlp_elementwise, elementwise_bwd)


def compiled_moe_elementwise(model, gpu: GpuSpec, params: CostParams, layout: Layout, tokens: float, seq_len: int,
                             compiled: float, eager: tuple[float, float, float]) -> tuple[float, float, float]:
    """(forward, backward, the MLP half's forward) element-wise seconds of the mean layer with ``compiled``
    of the blocks compiled, the rest at ``eager``'s: ``plait.plan.compiled``'s regions with the MLP's
    activation over the mean layer's ffn-wide elements (a dense layer's tokens·f/tp, an MoE layer's
    routed rows at the expert width and the shared experts), and, as eager, the dispatch's permutes
    and the router's softmax (forward; twice in the backward)."""
    t, h = layout.tp, model.hidden
    fraction = moe_layer_count(model) / model.n_layers
    act = (1.0 - fraction) * tokens * model.ffn_hidden / t
    moved = 0.0
    if model.moe is not None:
        moe = model.moe
        t_r, routed = routed_tokens(model, layout, seq_len, load=params.moe_load_imbalance)
        act += fraction * (routed * moe.expert_ffn / layout.etp + tokens * moe.n_shared * moe.shared_width / t)
        moved = fraction * (PERMUTE_PASSES * gpu.element_bytes * routed * h + 2 * 4.0 * t_r * moe.n_experts)
    rep = t if layout.sequence_parallel else 1
    fused = compiled_elementwise(model, gpu, tokens, t, rep, act)
    extra = moved / (gpu.hbm_bandwidth * gpu.memory_efficiency)
    fused = (fused[0] + extra, fused[1] + 2 * extra, fused[2] + extra)
    return blend(eager, fused, compiled)


def remote_nodes_per_token(moe, nodes: int) -> float:
    """Expected other nodes a token's top-k experts lie on, experts spread evenly over ``nodes``."""
    if nodes <= 1:
        return 0.0
    experts, k = moe.n_experts, moe.top_k
    per_node = experts / nodes
    miss = 1.0
    for i in range(k):  # P(no chosen expert on a given node): C(E - E/N, k) / C(E, k)
        miss *= max(0.0, (experts - per_node - i) / (experts - i))
    hit = nodes * (1.0 - miss)
    if moe.n_groups > 1:  # group-limited routing: at most topk_groups groups
        hit = min(hit, moe.topk_groups * max(1.0, nodes / moe.n_groups))
    return hit * (nodes - 1) / nodes


def expert_a2a(model, cluster: ClusterSpec, layout: Layout, seq_len: int, params: CostParams,
               runtime: str = "torch", fraction: float = 1.0) -> float:
    """One dispatch (or one combine) of one MoE layer and micro-batch, seconds (module docstring);
    ``runtime``: whose expert groups (``plait.spec.moe.layout.expert_groups``); ``fraction``: of
    the micro-batch's rows (one chunk of moe_overlap=chunked: its own latency)."""
    groups = expert_groups(layout, cluster.gpus_per_node, runtime)
    load = params.moe_load_imbalance
    t_r, routed = routed_tokens(model, layout, seq_len, load=load)
    t_r, routed = fraction * t_r, fraction * routed
    element = cluster.gpu.element_bytes
    sent = element * t_r * model.moe.top_k * model.hidden * load
    nic = element * t_r * model.hidden * load * remote_nodes_per_token(model.moe, groups["ep"].nodes)
    seconds = comm.all_to_all_hierarchical(cluster, groups["ep"], sent, nic)
    if layout.etp > 1 and layout.sequence_parallel:  # the etp ranks' tokens gathered (reduce-scattered back)
        seconds += comm.all_gather(cluster, groups["etp"], element * routed * model.hidden)
    elif layout.etp > 1:  # the same tokens on every etp rank: the partial outputs all-reduced
        seconds += comm.all_reduce(cluster, groups["etp"], element * routed * model.hidden)
    return seconds


@by_layout_fields("tp", "sp", "cp", "cp_impl", "dp", "pp", "mbs", "ep", "etp", "attn", "norm", "precision",
                  "moe_overlap", "order")
def moe_comm_layer(model, cluster: ClusterSpec, layout: Layout, tokens: float, seq_len: int,
                   params: CostParams, runtime: str = "torch") -> tuple[float, float]:
    """(forward, backward) exposed all-to-all seconds of one MoE layer and micro-batch."""
    a2a = expert_a2a(model, cluster, layout, seq_len, params, runtime)
    if a2a <= 0.0:
        return 0.0, 0.0
    _, shared, experts = moe_mlp_times(model, cluster.gpu, params, layout, tokens, seq_len, runtime)
    chunked, split, regroup, grad_sums, prep = a2a, experts, 0.0, 0.0, (0.0, 0.0)
    if runtime_chunks(layout, runtime) > 1:  # each chunk's all-to-all its own latency, its GEMMs smaller
        gpu = cluster.gpu
        chunked = MOE_CHUNKS * expert_a2a(model, cluster, layout, seq_len, params, runtime, 1.0 / MOE_CHUNKS)
        _, routed = routed_tokens(model, layout, seq_len, load=params.moe_load_imbalance)
        split = routed_expert_gemms(model, gpu, params, layout, routed, MOE_CHUNKS, runtime)
        bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
        # the rows gathered into chunk order and back: read + write of R·h twice per pass
        regroup = 4.0 * gpu.element_bytes * routed * model.hidden / bandwidth
        grad_sums = chunk_gradient_sums(model, gpu, layout) / bandwidth
        prep = tuple((MOE_CHUNKS - 1) * t for t in fp8_weight_prep(model, gpu, layout, runtime))  # per chunk
    out = []
    for factor in (1.0, 2.0):  # the backward's GEMMs take twice the forward's
        moved = 2.0 * a2a  # dispatch and combine
        if layout.moe_overlap == "shared":  # the dispatch (backward: its reverse) behind the shared experts
            window = factor * shared
            hidden = min(a2a, window)
            out.append(moved - hidden + params.overlap_slowdown * hidden)
        elif layout.moe_overlap == "chunked":  # plus what splitting the expert GEMMs costs
            moved, window = 2.0 * chunked, factor * split
            hidden = min(moved, window) * (1.0 - 1.0 / MOE_CHUNKS)
            out.append(moved - hidden + params.overlap_slowdown * hidden + factor * max(0.0, split - experts)
                       + regroup + (grad_sums + prep[1] if factor > 1.0 else prep[0]))
        else:
            out.append(moved)
    return out[0], out[1]


def local_expert_weights(model, layout: Layout) -> float:
    """Elements of the routed experts' weight matrices (w1, w3, w2) of one MoE layer on one rank:
    n_experts / ep experts, each ffn split by etp."""
    return model.moe.n_experts / layout.ep * 3.0 * model.hidden * model.moe.expert_ffn / layout.etp


# Bytes moved per local routed-expert parameter, (forward, backward), each time plait's runtime runs an
# expert GEMM in fp8 (plait.run.parallel.float8.fp8_grouped_mm on torchao 0.17's
# _to_fp8_rowwise_then_scaled_grouped_mm, once per projection and chunk). ESTIMATES from reading the
# code, not profiled: forward, the column-major copy (2 read + 2 written), the axis-wise scale (|w|
# written and read, and read once more: 6), the fp32 copy (2 + 4), its scaling (4 + 4), the clamp (4 +
# 4) and the fp8 cast (4 + 1); backward, the fused transposed cast (2 + 1). Priced as memory traffic.
FP8_WEIGHT_PREP_BYTES = (37.0, 3.0)


def fp8_weight_prep(model, gpu: GpuSpec, layout: Layout, runtime: str = "torch") -> tuple[float, float]:
    """(forward, backward) seconds one MoE layer's routed experts spend preparing their weights for the
    fp8 grouped GEMM once (``FP8_WEIGHT_PREP_BYTES``: plait's runtime only, where its experts run in
    fp8, ``routed_expert_precision``); (0, 0) otherwise. ``moe_layer_times`` charges it once per layer
    and micro-batch, ``moe_comm_layer`` again for every chunk after the first (moe_overlap=chunked)."""
    if runtime != "torch" or routed_expert_precision(model, layout, runtime) != "fp8":
        return 0.0, 0.0
    weights = local_expert_weights(model, layout)
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
    return FP8_WEIGHT_PREP_BYTES[0] * weights / bandwidth, FP8_WEIGHT_PREP_BYTES[1] * weights / bandwidth


def chunk_gradient_sums(model, gpu: GpuSpec, layout: Layout) -> float:
    """Bytes that summing the routed experts' weight gradients over plait's ``MOE_CHUNKS`` chunks
    (``runtime_chunks``) moves in one MoE layer's backward: every chunk's expert GEMMs give a
    gradient of all this rank's expert weights (three matrices per expert), which autograd adds to
    the sum of the chunks before it: MOE_CHUNKS - 1 additions, each reading two and writing one
    gradient in the compute dtype."""
    return (MOE_CHUNKS - 1) * 3.0 * gpu.element_bytes * local_expert_weights(model, layout)


def expert_tp_comm(model, cluster: ClusterSpec, layout: Layout, layers: int, params: CostParams,
                   runtime: str = "torch") -> float:
    """plait's runtime's all-reduce of the routed experts' gradients over tp, once a step, when its tp
    ranks split the tokens and hold the same experts (``expert_tp_sum``:
    ``plait.run.parallel.moe_tensor.sync_gradients``); 0 otherwise."""
    if not expert_tp_sum(layout, runtime):
        return 0.0
    grads = params.grad_reduce_bytes * stage_expert_params(model, layout, layers)
    return comm.all_reduce(cluster, group_of(layout, cluster.gpus_per_node, ("tp",)), grads)


def expert_dp_comm(model, cluster: ClusterSpec, layout: Layout, layers: int, params: CostParams,
                   runtime: str = "torch") -> float:
    """Routed experts' gradient reduction of one step (before overlap): ``expert_tp_comm``, and over
    the expert-data-parallel group an all-reduce (ZeRO 0), else reduce-scatter and the all-gather of
    the updated weights."""
    params_local = stage_expert_params(model, layout, layers)
    if params_local == 0.0:
        return 0.0
    seconds = expert_tp_comm(model, cluster, layout, layers, params, runtime)
    if expert_data_parallel(layout, runtime) <= 1:
        return seconds
    grads = params.grad_reduce_bytes * params_local
    group = expert_groups(layout, cluster.gpus_per_node, runtime)["edp"]
    if layout.zero == 0:
        return seconds + comm.all_reduce(cluster, group, grads)
    return seconds + comm.reduce_scatter(cluster, group, grads) + comm.all_gather(cluster, group, 2.0 * params_local)
