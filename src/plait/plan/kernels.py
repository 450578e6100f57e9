"""Time of one layer's kernels on one GPU: GEMMs, attention, element-wise work. Seconds.

GEMM efficiency curve (documented, replaceable by a calibration file): a GEMM of F FLOPs runs at
    peak · e_max · F / (F + F_half)
where e_max is ``GpuSpec.gemm_efficiency`` (large, well-shaped GEMMs) and F_half is
``CostParams.gemm_half_flops`` (small GEMMs under-fill the GPU), and never faster than its
operands can be streamed from HBM (roofline; at ``CostParams.gemm_bandwidth_factor`` times the
element-wise rate, which ``plait profile`` fits), plus a fixed launch overhead per kernel:
    t = max((F + F_half) / (peak · e_max), bytes / (B · gemm_bandwidth_factor)) + overhead.
FlashAttention uses ``GpuSpec.attention_efficiency`` on the same curve; its backward takes
``CostParams.flash_backward_factor`` times the forward. Element-wise kernels are bound by HBM
bandwidth at ``GpuSpec.memory_efficiency``.

Kernel knobs (``Layout.attn``, ``norm``, ``loss``), each priced by the bytes it moves:
  * ``attn=sdpa`` is timed as ``flash``: on the GPUs plait plans for (sm80+ and MI300X, bf16,
    head_dim ≤ 256) torch's SDPA dispatches to the FlashAttention-2 kernel. A sliding window is an
    explicit mask, with which SDPA runs its memory-efficient kernel over the whole s×s square, at
    ``MASKED_SDPA_SPEED`` of FlashAttention's rate (``runtime="torch"``; Megatron's stacks run the
    window in their own FlashAttention, whose square is priced as before).
  * ``attn=flex`` (FlexAttention, ``plait.run.modules.flex``): the blocks of 128×128 scores its
    block mask keeps (``flex_keys_per_query``: a windowed layer about W + one block per query,
    the causal half elsewhere, documents as below), at ``FLEX_SPEED`` of FlashAttention-2's rate;
    soft-capping is its fused score_mod (no extra memory traffic) and sinks an element-wise
    correction of the output. With dropout it falls back (eager with a soft-cap or sinks, else
    SDPA), and is priced so.
  * ``attn=eager`` also moves the soft-cap's and the sinks' passes over the scores
    (``EAGER_SOFTCAP_BYTES``, ``EAGER_SINK_BYTES``).
  * compiled blocks (``layer_times(..., compiled)``): the element-wise work is what inductor's fused
    regions read and write (``plait.plan.compiled``), in place of ``elementwise_passes``, the
    unfused norm's chain and the fp8 casts' passes; the backward is counted, not twice the forward.
  * ``norm=unfused``: the eager fp32 op chain of one norm moves ``UNFUSED_NORM_BYTES`` bytes
    per element of its input in the forward instead of the fused kernel's ``FUSED_NORM_BYTES``
    (read bf16, write bf16), in ``UNFUSED_NORM_KERNELS`` kernels instead of one; the backward
    moves twice the forward's bytes, like every element-wise kernel here.
  * ``loss=fused``: the chunked cross entropy runs the LM head GEMM per chunk of
    ``LOSS_CHUNK_TOKENS`` tokens and again in the backward (recomputation: 4 GEMMs of the head's
    forward size instead of 3), and its forward cross-entropy pass twice.

Packed documents (``JobSpec.doc_len`` = L, ``plait train --doc-mask``): attention stays within
each document. ``attn=flash``/``sdpa`` without dropout run FlexAttention with a block mask
(``plait.run.modules.documents``), which computes only the document's causal (and windowed)
pairs: ``document_keys_per_query``, what attention over L tokens costs. Every other kernel
passes an explicit boolean mask and computes the whole square: SDPA with dropout, the eager
kernel, the all-gather and Ulysses cp kernels (s keys per query), plait's ring (its blocks
whole, ``ring_keys``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from plait.plan.compiled import blend, compiled_elementwise
from plait.plan.params import CostParams
from plait.spec.hardware import GpuSpec
from plait.spec.layout import FP8_PRECISIONS, LOSS_CHUNK_TOKENS
from plait.spec.model import ModelSpec

BF16 = 2
# Bytes one norm's forward moves per element of its (bf16) input, read + write (HBM traffic).
FUSED_NORM_BYTES = 4.0  # one kernel: read x (2), write y (2); the per-token statistics are negligible
# The eager chain (plait.run.model.unfused_norm). RMSNorm: x.float() 2+4, pow 4+4, mean 4,
# x32·rstd 4+4, cast 4+2, ·weight 2+2 = 36. LayerNorm adds mean 4 and x32 - mean 4+4 = 48.
UNFUSED_NORM_BYTES = {"llama": 36.0, "gpt": 48.0}
# Kernels of that chain (the per-token ops included): RMSNorm float, pow, mean, add, rsqrt, mul,
# cast, mul = 8; LayerNorm also mean, sub, add (bias) = 11.
UNFUSED_NORM_KERNELS = {"llama": 8, "gpt": 11}
# Eager attention, bytes per element of the s×s scores beyond the two batched GEMMs (whose own
# reads and writes gemm_time counts), (forward, backward), by runtime:
#   torch (plait.run.model.eager_attention: bf16 scores, fp32 softmax, as Hugging Face's eager
#     path): forward scale 2+2, masked_fill 2+1 (mask)+2, cast to fp32 2+4, softmax 4+4, cast
#     to bf16 4+2 = 29; backward cast 2+4, softmax 4 (out)+4 (grad)+4, cast 4+2, masked_fill
#     2+1+2, scale 2+2 = 33.
#   megatron (the fused causal scale-mask-softmax kernel, scaled_upper_triang_masked_softmax, fp16/bf16):
#     forward reads the scores (2) and writes the probabilities (2) = 4; backward reads the gradient (2)
#     and the probabilities (2) and writes the scores' gradient (2) = 6.
EAGER_SOFTMAX_BYTES = {"torch": (29.0, 33.0), "megatron": (4.0, 6.0), "megatron-core": (4.0, 6.0)}
# Dropout of the probabilities (a model with dropout; Megatron's attention_dropout, torch's
# native_dropout on CUDA): forward reads them (2) and writes the output (2) and a 1-byte mask (1);
# backward reads the gradient (2) and the mask (1) and writes its gradient (2). Bytes per element.
EAGER_DROPOUT_BYTES = 5.0
# Element-wise passes (2 bytes per element of h) of a layer outside its tensor-parallel GEMMs, which
# sequence parallelism shards and plain tensor parallelism repeats on every rank, for Megatron's
# fused kernels: two LayerNorms (read x, write y: 2 passes each) and two bias-dropout-adds (read
# the input and the residual, write the sum and a 1-byte mask: 3.5 each) = 11. Korthikanti et al.
# 2022, Table 4: sequence parallelism saves 0.5 ms of the 22B layer's 7.7 ms forward at tp = 8,
# "from the layer-norm and dropout layers being performed on 1/t of the data". Other runtimes
# (plait's eager blocks) keep half of their passes there.
MEGATRON_REPLICATED_PASSES = 11.0
# Context parallelism (plait.plan.context.exchange's docstring): plait's own ring kernel (cp_impl=ring,
# plait.run.parallel.context.ops) materializes fp32 scores per block. Bytes per score element beyond
# the GEMMs' own reads and writes: forward scale mul_ 4+4, logsumexp (amax 4, x - max 4+4, exp_ 4+4,
# sum 4) 24, sub_ 4+4, exp_ 4+4 = 48; backward scale mul_ 8, sub_(lse) 8, exp_ 8, sub_(delta) 8,
# mul_(probs) 4+4+4 = 44.
RING_SCORE_BYTES = (48.0, 44.0)
# the diagonal block's causal mask, per score element of that block: built (ones 1, triu 1+1,
# repeat 1+1), then masked_fill_ reads it (1) and the scores (4) and writes them (4)
RING_MASK_BYTES = 14.0
# soft-capping in the ring's fp32 blocks, per score element: forward div_ 4+4, tanh_ 4+4, ·c 4+4 = 24;
# backward the same recomputed 24, then 1 - tanh² (square 4+4, rsub 4+4) and the mul_ 4+4+4 = 52
RING_SOFTCAP_BYTES = (24.0, 52.0)
# eager soft-capping, per bf16 score element: forward div 2+2, tanh 2+2, mul 2+2 = 12; backward
# the three ops' gradients (mul 2+2, tanh' 2+2+2, div 2+2) = 14
EAGER_SOFTCAP_BYTES = (12.0, 14.0)
# eager sinks: the score matrix copied with the sink column (cat 2+2) and the probabilities sliced
# back (a strided copy at the cast 4+2 the softmax bytes already count: 0); the backward the same 4
EAGER_SINK_BYTES = (4.0, 4.0)
# FlexAttention's share of FlashAttention-2's throughput (forward, backward), causal and sliding-
# window masks in bf16 on A100/H100 ("FlexAttention: The Flexibility of PyTorch with the Performance
# of FlashAttention", PyTorch blog, August 2024: about 90% forward, 85% backward)
FLEX_SPEED = (0.90, 0.85)
FLEX_BLOCK = 128  # FlexAttention's block size: the unit its block mask keeps or skips
# SDPA with an explicit mask runs the memory-efficient (xformers/cutlass) kernel instead of
# FlashAttention-2: about 0.6 of its rate (FlashAttention-2 paper, Dao 2023, fig. 4-6: the cutlass
# kernel forward + backward on A100 against FlashAttention-2); a planner estimate, not measured here
MASKED_SDPA_SPEED = 0.6


def gemm_time(gpu: GpuSpec, params: CostParams, m: float, k: float, n: float, precision: str = "bf16") -> float:
    """Time of an (m×k)·(k×n) GEMM, seconds."""
    flops = 2.0 * m * k * n
    if precision in FP8_PRECISIONS:
        peak = gpu.peak_flops(precision) * params.fp8_gemm_efficiency * gpu.power_derate
        operand_bytes = 0.5 if precision == "nvfp4" else 1.0
    else:
        peak = gpu.bf16_flops * gpu.gemm_efficiency
        operand_bytes = gpu.element_bytes
    compute = flops / peak * (flops + params.gemm_half_flops) / flops
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency * params.gemm_bandwidth_factor
    memory = operand_bytes * (m * k + k * n + m * n) / bandwidth
    return max(compute, memory) + gpu.kernel_overhead


def ring_keys(seq_len: int, cp: int) -> float:
    """Keys per local query over the ring kernel's blocks: the diagonal block's seq/cp (the whole
    square, masked) and half of seq/cp in each of the cp-1 later ones."""
    local = seq_len / cp
    return local + (cp - 1) * local / 2


def ring_attention_times(model: ModelSpec, gpu: GpuSpec, params: CostParams, tokens: float, seq_len: int,
                         tp: int, cp: int) -> tuple[float, float]:
    """(forward, backward) seconds of ``cp_impl=ring``'s attention for ``tokens`` on this rank: two
    batched GEMMs over all blocks forward, five backward (scores recomputed), and the score
    elements' fp32 traffic; the GEMMs at the device's GEMM rate (they run in fp32)."""
    local = seq_len / cp
    rows = tokens * model.n_heads / tp  # query rows of all heads of the micro-batch
    keys = model_ring_keys(model, seq_len, cp)
    one = gemm_time(gpu, params, rows, model.head_dim, keys)  # Q·Kᵀ over all blocks (P·V the same)
    elements = rows * keys
    diagonal = local / keys  # share of the score elements in the masked diagonal block
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
    softcap = RING_SOFTCAP_BYTES if model.attn_softcap else (0.0, 0.0)
    forward, backward = (elements * (nbytes + cap + RING_MASK_BYTES * diagonal) / bandwidth
                         for nbytes, cap in zip(RING_SCORE_BYTES, softcap))
    return 2 * one + forward, 5 * one + backward


@lru_cache(maxsize=4096)
def ring_window_keys(seq_len: int, cp: int, window: int) -> float:
    """Keys per local query over the ring blocks a sliding window of W tokens leaves (the ring skips
    a block when every query is W or more positions past every key: ``plait.run.parallel.context.masks``),
    on the busiest rank (the ring moves at its pace). Chunks of c = seq/(2·cp) tokens; rank r holds
    chunks r and 2cp-1-r. Step 0 is the 2c × 2c diagonal block; src < r a 2c × c block (src's first
    chunk), skipped when (r - src - 1)·c + 1 >= W; src > r a c × 2c block (r's second chunk against
    both of src's), skipped when (src - r - 1)·c + 1 >= W."""
    chunk = seq_len / (2 * cp)
    busiest = 0.0
    for rank in range(cp):
        elements = 4 * chunk * chunk
        for src in range(cp):
            if src != rank and (abs(rank - src) - 1) * chunk + 1 < window:
                elements += 2 * chunk * chunk
        busiest = max(busiest, elements)
    return busiest / (2 * chunk)


def model_ring_keys(model: ModelSpec, seq_len: int, cp: int) -> float:
    """``ring_keys`` averaged over the layers, the local (windowed) ones at ``ring_window_keys``."""
    local = model.local_layer_count()
    windowed = ring_window_keys(seq_len, cp, model.sliding_window) if local else 0.0
    return (local * windowed + (model.n_layers - local) * ring_keys(seq_len, cp)) / model.n_layers


def cp_keys_per_query(cp_impl: str, seq_len: int, causal_keys: float, documents: bool = False) -> float:
    """Keys per query the fused kernel computes under context parallelism ``cp_impl`` (not
    ``ring``): the whole sequence for ``allgather`` (an explicit mask by global position) and,
    with ``documents`` (a document mask), for ``ulysses`` (SDPA's boolean mask), else the causal
    ``causal_keys``."""
    return float(seq_len) if cp_impl == "allgather" or (documents and cp_impl == "ulysses") else causal_keys


@dataclass(frozen=True)
class LayerTimes:
    """Kernel times of one transformer layer for one micro-batch on one GPU, seconds."""

    gemm_fwd: float
    attn_fwd: float
    attn_bwd: float
    elementwise_fwd: float
    attn_softmax_gemm_fwd: float  # the Q·Kᵀ GEMM alone
    # the MLP half's forward (what ``ckpt=mlp`` recomputes), parts of the totals above: its GEMMs
    # (gate/up and down; MoE: router, shared and routed experts) and its element-wise work
    # (``mlp_elementwise_time``; MoE: with the dispatch's permutes and the router's softmax)
    mlp_gemm_fwd: float = 0.0
    mlp_elementwise_fwd: float = 0.0
    # the element-wise backward; None: twice the forward (eager kernels), a compiled block's own count
    # (``plait.plan.compiled``)
    elementwise_bwd_s: float | None = None

    @property
    def elementwise_bwd(self) -> float:
        return 2 * self.elementwise_fwd if self.elementwise_bwd_s is None else self.elementwise_bwd_s

    @property
    def fwd(self) -> float:
        return self.gemm_fwd + self.attn_fwd + self.elementwise_fwd

    @property
    def bwd(self) -> float:
        return 2 * self.gemm_fwd + self.attn_bwd + self.elementwise_bwd


def kernel_keys_per_query(model: ModelSpec, seq_len: int, doc_len: int = 0) -> float:
    """Keys per query the SDPA kernels compute, averaged over layers: (s+1)/2 with the causal mask;
    a sliding window passes an explicit mask, with which the kernel computes the whole s×s square.
    ``doc_len`` L > 0 (packed documents, FlexAttention's block mask): ``document_keys_per_query``."""
    local = model.local_layer_count()
    if doc_len:
        window = model.sliding_window
        return (local * document_keys_per_query(doc_len, seq_len, window)
                + (model.n_layers - local) * document_keys_per_query(doc_len, seq_len)) / model.n_layers
    return (local * seq_len + (model.n_layers - local) * (seq_len + 1) / 2.0) / model.n_layers


def document_keys_per_query(doc_len: int, seq_len: int, window: int = 0) -> float:
    """Keys per query of causal attention within documents of L = min(doc_len, seq_len) tokens, with
    a sliding window W (0: none). The i-th token of a document (i = 1..L) sees min(i, W) keys, so
    a document holds Σ min(i, W) pairs: L(L+1)/2 when W >= L, else W(W+1)/2 + (L-W)·W; a sequence
    of s/L such documents holds s/L times that over its s queries, so a query sees that sum / L
    keys on average: (L+1)/2 without a window, the cost of attention over L tokens."""
    length = min(doc_len, seq_len)
    if not window or window >= length:
        return (length + 1) / 2.0
    return (window * (window + 1) / 2.0 + (length - window) * window) / length


def attention_kernel(model: ModelSpec, attn: str, cp: int, cp_impl: str) -> str:
    """The kernel that computes a layer's attention, as priced: ``ring`` (plait's fp32 blocks),
    ``flash`` (FlashAttention-2 or SDPA: the flash, sdpa and torch-ring kernels, and all-gather and
    Ulysses with what they pass SDPA), ``flex`` (FlexAttention: attn=flex without dropout;
    all-gather with a window, soft-cap or sinks; Ulysses with a soft-cap or sinks) or ``eager``
    (attn=eager, and attn=flex's fallback with dropout and a soft-cap or sinks)."""
    scored = bool(model.attn_softcap or model.sinks)
    if cp > 1:
        if cp_impl == "ring":
            return "ring"
        if (cp_impl == "allgather" and (scored or model.sliding_window)) or (cp_impl == "ulysses" and scored):
            return "flex"
        return "flash"
    if attn == "flex":
        return "eager" if model.dropout and scored else "flash" if model.dropout else "flex"
    return "eager" if attn == "eager" else "flash"


def masked_layer_share(model: ModelSpec) -> float:
    """The share of the layers whose sliding window SDPA takes as an explicit mask."""
    return model.local_layer_count() / model.n_layers


def flex_keys_per_query(model: ModelSpec, seq_len: int, doc_len: int = 0) -> float:
    """Keys per query FlexAttention computes, averaged over layers: its block mask keeps the
    blocks the causal, window and document masks touch. A windowed layer: W keys plus one
    ``FLEX_BLOCK`` for the ragged band's edge blocks, at most the causal half; packed documents:
    ``document_keys_per_query`` (whose block edges are not counted, as without the window)."""
    if doc_len:
        return kernel_keys_per_query(model, seq_len, doc_len)
    local = model.local_layer_count()
    causal = (seq_len + 1) / 2.0
    windowed = min(causal, document_keys_per_query(seq_len, seq_len, model.sliding_window) + FLEX_BLOCK)
    return (local * windowed + (model.n_layers - local) * causal) / model.n_layers


@lru_cache(maxsize=65536)
def layer_times(model: ModelSpec, gpu: GpuSpec, params: CostParams, tokens: float, seq_len: int,
                tp: int, cp: int, sequence_parallel: bool, attn: str, precision: str,
                norm: str = "fused", runtime: str = "torch", cp_impl: str = "torch", doc_len: int = 0,
                compiled: float = 0.0) -> LayerTimes:
    """Times for ``tokens`` = (seq_len / cp) · micro-batch tokens on this rank; ``runtime``: whose
    eager attention (``EAGER_SOFTMAX_BYTES``); at cp > 1 the attention is ``cp_impl``'s, whatever
    ``attn`` says (the context-parallel kernel replaces the layer's). ``doc_len``: packed documents
    of that mean length with a document mask (0: none; the module docstring). ``compiled``: the share
    of the blocks under torch.compile, whose element-wise work is ``compiled_elementwise``'s."""
    h, f, t = model.hidden, model.ffn_hidden, tp
    kv, q = model.kv_hidden, model.q_hidden
    gemm = gemm_time(gpu, params, tokens, h, (q + 2 * kv) / t, precision)
    gemm += gemm_time(gpu, params, tokens, q / t, h, precision)
    if model.arch == "llama":
        mlp_gemm = gemm_time(gpu, params, tokens, h, 2 * f / t, precision)
    else:
        mlp_gemm = gemm_time(gpu, params, tokens, h, f / t, precision)
    mlp_gemm += gemm_time(gpu, params, tokens, f / t, h, precision)
    gemm += mlp_gemm

    batch = tokens / (seq_len / cp)  # sequences in the micro-batch
    heads = model.n_heads / t
    s_q = seq_len / cp
    kernel = attention_kernel(model, attn, cp, cp_impl)
    if kernel == "ring":
        attn_fwd, attn_bwd = ring_attention_times(model, gpu, params, tokens, seq_len, tp, cp)
        scores_gemm = 0.0
    elif kernel in ("flash", "flex"):  # fused kernels; sdpa is FlashAttention-2 on these GPUs; a cp kernel
        # causal: each rank's (load-balanced) queries see on average half of the keys
        speed = (1.0, 1.0)
        if kernel == "flex":
            keys, speed = flex_keys_per_query(model, seq_len, doc_len), FLEX_SPEED
        elif doc_len and (cp > 1 or model.dropout):  # an explicit boolean mask: the whole square
            keys = float(seq_len) if cp == 1 else cp_keys_per_query(cp_impl, seq_len, (seq_len + 1) / 2.0, True)
        else:
            keys = kernel_keys_per_query(model, seq_len, doc_len)
            if cp > 1:
                keys = cp_keys_per_query(cp_impl, seq_len, keys)
            elif not doc_len and runtime == "torch":  # SDPA takes the window as a mask: memory-efficient kernel
                keys += masked_layer_share(model) * seq_len * (1 / MASKED_SDPA_SPEED - 1)
        flops = 4.0 * batch * heads * model.head_dim * s_q * keys
        peak = gpu.bf16_flops * gpu.attention_efficiency
        flash_fwd = flops / peak * (flops + params.gemm_half_flops) / flops
        attn_fwd = flash_fwd / speed[0] + gpu.kernel_overhead
        attn_bwd = params.flash_backward_factor * flash_fwd / speed[1] + params.flash_backward_factor * gpu.kernel_overhead
        scores_gemm = 0.0
    else:
        # eager: the full s×s square is computed and masked; scale, mask, softmax (+ dropout) in HBM
        one = gemm_time(gpu, params, batch * heads * s_q, model.head_dim, seq_len)
        elements = batch * heads * s_q * seq_len
        bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
        dropout = EAGER_DROPOUT_BYTES if model.dropout else 0.0
        fwd_bytes, bwd_bytes = EAGER_SOFTMAX_BYTES[runtime]
        for present, (fwd_extra, bwd_extra) in ((model.attn_softcap, EAGER_SOFTCAP_BYTES),
                                                (model.sinks, EAGER_SINK_BYTES)):
            if present and runtime == "torch":
                fwd_bytes, bwd_bytes = fwd_bytes + fwd_extra, bwd_bytes + bwd_extra
        attn_fwd = 2 * one + elements * (fwd_bytes + dropout) / bandwidth
        attn_bwd = 4 * one + elements * (bwd_bytes + dropout) / bandwidth
        scores_gemm = one
    rep = t if sequence_parallel else 1
    cast_passes = params.fp8_cast_passes if precision in FP8_PRECISIONS else 0.0

    def passes_bytes(passes: float) -> float:  # the passes outside the TP GEMMs on the sp shard, the rest split by tp
        outside = min(MEGATRON_REPLICATED_PASSES, passes / 2) if runtime in ("megatron", "megatron-core") else passes / 2
        return gpu.element_bytes * tokens * h * (outside / rep + (passes - outside) / t)

    elementwise_bytes = passes_bytes(params.elementwise_passes + cast_passes)
    kernels = 8
    if norm == "unfused":  # two norms per layer, on the sequence-parallel shard
        elementwise_bytes += 2 * (UNFUSED_NORM_BYTES[model.arch] - FUSED_NORM_BYTES) * tokens * h / rep
        kernels += 2 * (UNFUSED_NORM_KERNELS[model.arch] - 1)
    elementwise = elementwise_bytes / (gpu.hbm_bandwidth * gpu.memory_efficiency) + kernels * gpu.kernel_overhead
    mlp_elementwise = min(elementwise, mlp_elementwise_time(model, gpu, norm, tokens * h / rep, tokens * f / t))
    if not compiled:
        return LayerTimes(gemm, attn_fwd, attn_bwd, elementwise, scores_gemm, mlp_gemm, mlp_elementwise)
    fused = compiled_elementwise(model, gpu, tokens, t, rep, tokens * f / t)
    cast = passes_bytes(cast_passes) / (gpu.hbm_bandwidth * gpu.memory_efficiency)  # as eager (plait.plan.compiled)
    fused = (fused[0] + cast, fused[1] + 2 * cast, fused[2])
    fwd, bwd, mlp = blend((elementwise, 2 * elementwise, mlp_elementwise), fused, compiled)
    return LayerTimes(gemm, attn_fwd, attn_bwd, fwd, scores_gemm, mlp_gemm, mlp, bwd)


def mlp_elementwise_time(model: ModelSpec, gpu: GpuSpec, norm: str, norm_elements: float,
                         act_elements: float, moved_bytes: float = 0.0, extra_kernels: int = 0) -> float:
    """Forward seconds of the MLP half's element-wise kernels, tensor by tensor: its norm (two with
    sandwich norms) over ``norm_elements`` (read + write in the compute dtype, or the unfused chain's
    ``UNFUSED_NORM_BYTES``), the activation over ``act_elements`` (ffn-wide elements: SwiGLU's silu
    reads and writes one, the product reads two and writes one, 5 passes; GELU 2), ``moved_bytes``
    more (MoE: the dispatch's permutes, the router's softmax) and ``extra_kernels`` launches."""
    e = gpu.element_bytes
    norms = 2 if model.norm_position == "sandwich" else 1
    per_norm = UNFUSED_NORM_BYTES[model.arch] if norm == "unfused" else 2 * e
    kernels = norms * (UNFUSED_NORM_KERNELS[model.arch] if norm == "unfused" else 1) + (2 if model.gated else 1)
    moved = norms * per_norm * norm_elements + (5 if model.gated else 2) * e * act_elements + moved_bytes
    return moved / (gpu.hbm_bandwidth * gpu.memory_efficiency) + (kernels + extra_kernels) * gpu.kernel_overhead


@lru_cache(maxsize=16384)
def head_time(model: ModelSpec, gpu: GpuSpec, params: CostParams, tokens: float, tp: int, precision: str,
              loss: str = "unfused") -> float:
    """LM head forward + backward and the cross-entropy for one micro-batch, seconds
    (``loss=fused``: in chunks, the head's forward GEMM and cross entropy recomputed)."""
    loss_bytes = tokens * model.vocab / tp * params.logits_bytes_per_element * 2
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
    if loss != "fused":
        fwd = gemm_time(gpu, params, tokens, model.hidden, model.vocab / tp, precision)
        return 3 * fwd + loss_bytes / bandwidth
    chunk = min(tokens, LOSS_CHUNK_TOKENS)
    chunks = tokens / chunk
    fwd = chunks * gemm_time(gpu, params, chunk, model.hidden, model.vocab / tp, precision)
    return 4 * fwd + 1.5 * loss_bytes / bandwidth
