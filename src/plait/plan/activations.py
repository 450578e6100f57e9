"""Saved-activation bytes of one transformer layer for one micro-batch, tensor by tensor.

Notation (Korthikanti et al. 2022): s sequence length on this rank (seq_len / cp), b micro-batch,
h hidden, f ffn_hidden, a heads, t tensor-parallel degree. Activations are bf16 (2 bytes per
element), dropout masks 1 byte, per-token norm statistics and the attention log-sum-exp fp32.

Each item is either *replicated* across tensor-parallel ranks (norm inputs and outputs, dropout
masks after the row-parallel layers) or *sharded* by t (everything inside the attention and MLP
blocks). Sequence parallelism shards the replicated items by t as well, as in Megatron-LM: the
norm output that the column-parallel GEMM all-gathers is saved in its sharded form and
gathered again in the backward.

Without recomputation, for a GPT layer with dropout and eager attention, this gives exactly
Korthikanti's s·b·h·(34 + 5·a·s/h) bytes (t = 1), s·b·h·(10 + 24/t + 5·a·s/(h·t)) (TP) and
s·b·h/t·(34 + 5·a·s/h) (TP+SP), plus the per-token statistics that the paper leaves out
(items ``norm_stats`` and ``attn_lse``).

Checkpoint policies, per checkpointed layer:
  * ``selective`` (Megatron): recompute the attention core; drop softmax/dropout tensors of size
    a·s² and the log-sum-exp; keep Q, K, V and the attention output.
  * ``balanced`` (Kwai, "GEMM-last"): also recompute the cheap element-wise work - norm outputs,
    activation-function outputs, dropout masks - and keep only the layer input, the MLP residual
    input, the GEMM outputs Q, K, V, attention output and the MLP up-projection outputs.
    plait's runtime (``runtime="torch"``) runs it with torch's selective activation checkpoint
    and a policy on op types (``plait.run.memory.recompute``): it keeps the output of *every* linear
    GEMM and of the fused attention kernel, i.e. the layer input, Q, K, V, (flash) the attention
    output and its log-sum-exp, the output-projection GEMM output (``attn_proj_out``, the
    residual is recomputed from it instead of being kept), the MLP gate/up outputs and the
    down-projection GEMM output (``mlp_down_out``). Under tensor parallelism the two row-parallel
    GEMM outputs are full-width partial sums before their reduction: 2·s·b·h each. With eager
    attention the batched GEMMs of the core are recomputed (their output would be the s×s
    scores): no attention output or log-sum-exp is kept (``torch_balanced_items``).
  * ``mlp`` (Megatron-Core's ``--recompute-modules layernorm mlp``/``moe``, norms aside): the MLP
    half (its norm, GEMMs, activation, sandwich post norm; an MoE block's router, dispatch, experts
    and combine) runs inside a checkpoint: the layer keeps what the attention half keeps under
    ``none`` (its norm's rstd: half of ``norm_stats``) plus the MLP half's input, the residual
    stream after attention (``mlp_norm_input`` = ``residual_bytes``), and none of ``MLP_HALF_ITEMS``
    (``mlp_checkpoint_items``). Megatron's ``layernorm`` module would also recompute the
    attention norm's output (``attn_norm_output``): plait keeps it.
  * ``full``: keep only the layer input (2·s·b·h, sharded by t with sequence parallel).

Runtimes (``runtime=``): what a layer saves depends on the implementation, not only on the math.
  * ``"megatron"`` (default): Megatron-LM, as in Korthikanti et al. - the formulas above.
  * ``"megatron-core"``: Megatron-Core with Transformer Engine, as ``megatron`` but with its fused
    SwiGLU (one activation output kept) and, under fp8/mxfp8/nvfp4, the linear layers' inputs kept
    as their low-precision copies (``TE_FP8_SAVED_INPUTS``, ``PRECISION_STORED_BYTES``).
  * ``"torch"``: plait's own runtime (``plait.run``: PyTorch modules, DTensor tensor parallelism),
    as measured tensor by tensor with saved-tensor hooks in tests/run/test_memory_truth.py. It
    differs from Megatron in two places:
      - sequence parallelism: ``PrepareModuleInput`` all-gathers the norm output before the
        column-parallel GEMMs, and autograd saves that gathered, full-sequence tensor (DTensor
        has no "save the shard, gather again in the backward" as Megatron's
        ``LinearWithGradAccumulationAndAsyncCommunication`` does): ``attn_norm_output`` and
        ``mlp_norm_output`` are 2·s·b·h each, not 2·s·b·h/t - 4·s·b·h·(1 - 1/t) more per layer.
      - eager attention builds its s×s boolean causal mask in every layer and ``masked_fill``
        saves it (item ``attn_causal_mask``, 1 byte per query-key pair, the same on every
        tensor-parallel rank); Megatron passes one mask to all layers.
      - eager attention's softmax runs in fp32 (as Hugging Face's and Megatron's unfused paths):
        it saves its fp32 output (``attn_scores``, 4 bytes per pair) and the P·V GEMM the bf16
        copy (``attn_probs``, or ``attn_dropout_out`` with dropout); Megatron's fused
        scale-mask-softmax kernel saves one bf16 output.
Both runtimes: eager attention with grouped-query attention repeats K and V to all a heads
before the batched GEMMs, which save the repeated copies (item ``attn_kv_repeat``: the
2·2·s·b·(h - kv)/t bytes beyond ``kv``; zero for multi-head attention; recomputed under
``selective``). The flash kernel takes the un-repeated K and V.

Measured on the CPU (tests/run/test_memory_truth.py) the torch runtime saves exactly these items,
up to CPU kernel choices that the GPU runtime does not make (the test adds them explicitly):
  * RMSNorm: on the CPU ``torch.rms_norm`` is the composite upcast-to-fp32 implementation,
    which saves the fp32 input and the fp32 normalized output (4 + 4 bytes per element) instead
    of the bf16 input; CUDA's fused ``_fused_rms_norm`` saves the bf16 input and the fp32 rstd.
  * LayerNorm: the CPU kernel keeps mean and rstd in bf16 (2 bytes each, not 4).
  * dropout: the CPU kernel saves a scaled mask in the input dtype (2 bytes per element for
    bf16); CUDA's ``native_dropout`` saves a 1-byte bool mask, as Megatron does.
  * SDPA with dropout has no fused CPU kernel and runs the fp32 math fallback (not modeled;
    the GPU flash kernel with dropout saves the same tensors as without, plus an RNG state).
Normalization kernel (``Layout.norm``):
  * ``fused`` (default): one kernel per norm that saves its bf16 input and fp32 statistics
    (RMSNorm: rstd; LayerNorm: mean and rstd) - items ``*_norm_input`` and ``norm_stats``.
  * ``unfused``: the eager op chain (``plait.run.model.unfused_norm``: upcast to fp32, [centre],
    mean of squares, rsqrt, scale, cast back, times the weight) saves, per norm, the fp32 input
    (``*_norm_fp32_input``, 4 bytes per element; LayerNorm: the centred input), the bf16
    normalized value that the weight multiplies (``*_norm_normalized``, 2 bytes per element) and
    one fp32 rstd per token (``norm_stats``), the same on CPU and GPU. The bf16 layer input is
    then saved by nothing inside the layer; a checkpoint that keeps it (``full``, ``balanced``)
    keeps its 2 bytes per element (``residual_bytes``).
Attention kernel ``sdpa`` saves what ``flash`` saves: on the GPUs plait plans for, torch's SDPA
picks the FlashAttention-2 kernel, and where it cannot (head_dim > 256) the memory-efficient
kernel, which saves the same output and fp32 log-sum-exp.
Hugging Face model features (``ModelSpec``): ``head_dim`` sizes Q, the attention output and
K/V by n_heads·head_dim and n_kv_heads·head_dim; q/k norms save their input (the Q and K GEMM
outputs, ``qk_norm_input``) and an fp32 rstd per head and token (``"head"``) or per token
(``"full"``); sandwich norms (Gemma-2) save the sub-blocks' outputs (``attn_post_norm_input``,
``mlp_post_norm_input``) and two more rstd; post norms (OLMo-2) save what pre norms save (the norm
input has the same size; the QKV GEMM then saves the layer input itself). Biases save nothing.
A sliding window: eager attention's mask is the causal mask's size; with SDPA (torch runtime)
the boolean mask becomes an additive bf16 mask that the kernel saves (``attn_window_mask``, in
local layers only: averaged over the layers); ``attn=flex`` saves none (its block mask holds a
few bytes per 128×128 block). Soft-capped scores (eager) save tanh's bf16 output
(``attn_softcap_tanh``).
Not counted anywhere: constant tensors shared by all layers (RoPE cos/sin tables) and a few
bytes per layer (the flash kernel's RNG state).

Compute dtype (``element_bytes``, from ``GpuSpec.element_bytes``): the "bf16" items above are
priced at ``element_bytes`` per element - 2 on every GPU preset (the numbers above), 4 where the
runtime computes in fp32 (plait's runtime on a CPU: no autocast, no FSDP mixed precision).
fp32 statistics (``norm_stats``, ``attn_lse``, the torch runtime's fp32 softmax output) and
1-byte masks stay as they are. In fp32 the softmax output needs no cast: no ``attn_probs``
copy. With ``element_bytes >= 4`` the torch runtime is the CPU one, and its composite RMSNorm
(``torch.rms_norm`` on a CPU) saves the normalized value x·rstd beside its input, one more
``element_bytes·s·b·h`` per norm (and per q/k norm; item ``rmsnorm_normalized``; recomputed
under ``balanced`` and ``full``). tests/run/test_memory_truth_fp32.py checks these items
against the fp32 layer's saved tensors, byte for byte.
"""

from __future__ import annotations

import math

from plait.plan.memo import by_layout_fields
from plait.plan.moe.memory import MOE_ITEMS, adjust_layer_items, mla_balanced_items
from plait.spec.layout import FP8_PRECISIONS, PRECISION_STORED_BYTES, Layout
from plait.spec.model import ModelSpec

BF16 = 2
MASK = 1
FP32 = 4

RUNTIMES = ("megatron", "megatron-core", "torch")
# the layout fields a layer's saved tensors depend on (plait.plan.memo: every field layer_items reads)
ITEM_FIELDS = ("tp", "sp", "cp", "mbs", "ep", "etp", "attn", "norm", "precision")

SELECTIVE_DROPS = {"attn_scores", "attn_probs", "attn_dropout_mask", "attn_dropout_out", "attn_lse", "attn_kv_repeat",
                   "attn_causal_mask", "attn_window_mask", "attn_softcap_tanh"}
BALANCED_KEEPS = {"attn_norm_input", "mlp_norm_input", "q", "kv", "attn_out", "mlp_up"}
# what the MLP half saves (its norm, GEMM inputs and outputs, activation, sandwich post norm, the MoE
# block's): none of it is kept under ``ckpt=mlp``
MLP_HALF_ITEMS = {"mlp_norm_input", "mlp_norm_fp32_input", "mlp_norm_normalized", "mlp_norm_output", "mlp_up",
                  "mlp_act_out", "mlp_post_norm_input", *MOE_ITEMS}


# The inputs of a layer's linear layers (QKV, output projection, fc1, fc2): under fp8, mxfp8 or nvfp4
# Transformer Engine (Megatron-Core, the ``megatron`` accounting) saves each for the weight-gradient
# GEMM as the fp8 copy it computed with (its Linear and LayerNormLinear keep the quantized input), not
# in bf16. plait's runtime (torchao's float8 linears) is counted in its own dtype.
TE_FP8_SAVED_INPUTS = ("attn_norm_output", "attn_out", "mlp_norm_output", "mlp_act_out")



@by_layout_fields(*ITEM_FIELDS)
def layer_items(model: ModelSpec, layout: Layout, seq_len: int, mbs: int | None = None, *,
                runtime: str = "megatron", element_bytes: float = BF16) -> dict[str, float]:
    """Bytes saved for the backward by one layer, one micro-batch, no recomputation.

    ``runtime`` is ``"megatron"`` (Korthikanti's accounting) or ``"torch"`` (plait's runtime);
    see the module docstring for the difference. ``element_bytes``: bytes per element of the
    compute dtype (``GpuSpec.element_bytes``; module docstring, "Compute dtype").
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; expected one of {', '.join(RUNTIMES)}")
    torch_sp = runtime == "torch" and layout.sequence_parallel
    e = element_bytes
    s = seq_len / layout.cp
    b = layout.mbs if mbs is None else mbs
    h, f, a, t = model.hidden, model.ffn_hidden, model.n_heads, layout.tp
    kv = model.kv_hidden
    rep = t if layout.sequence_parallel else 1  # divisor of the 'replicated' items
    sb = s * b
    items: dict[str, float] = {}
    # ---- attention block
    unfused = layout.norm == "unfused"
    if unfused:
        items["attn_norm_fp32_input"] = FP32 * sb * h / rep
        items["attn_norm_normalized"] = e * sb * h / rep
    else:
        items["attn_norm_input"] = e * sb * h / rep
    # input of the QKV GEMM: saved sharded (Megatron) or all-gathered (DTensor)
    items["attn_norm_output"] = e * sb * h / (1 if torch_sp else rep)
    q = model.q_hidden
    items["q"] = e * sb * q / t
    items["kv"] = e * sb * 2 * kv / t
    if model.qk_norm != "none":  # the norms save their input (the Q / K GEMM outputs) and an rstd
        items["qk_norm_input"] = e * sb * (q + kv) / t
        rows = (a + model.n_kv_heads) / t if model.qk_norm == "head" else 2
        items["qk_norm_stats"] = FP32 * sb * rows
    if layout.attn == "eager":
        if kv < q:  # GQA: K and V repeated to every query head for the batched GEMMs
            items["attn_kv_repeat"] = e * sb * 2 * (q - kv) / t
        if runtime == "torch":  # built per layer (s local queries × seq_len keys, bool)
            items["attn_causal_mask"] = MASK * s * seq_len
        # probabilities after softmax: s local queries × seq_len keys per head
        scores = a / t * b * s * seq_len
        if runtime == "torch" and model.attn_softcap:  # c·tanh(x/c): tanh saves its output
            items["attn_softcap_tanh"] = e * scores
        if runtime == "torch":  # fp32 softmax output, and its bf16 copy that P·V saves
            items["attn_scores"] = FP32 * scores
            if not model.dropout and e < FP32:  # in fp32 the cast is a no-op: no copy
                items["attn_probs"] = e * scores
        else:  # Megatron's fused scale-mask-softmax kernel writes bf16
            items["attn_scores"] = e * scores
        if model.dropout:
            items["attn_dropout_mask"] = MASK * scores
            items["attn_dropout_out"] = e * scores
    else:
        items["attn_lse"] = FP32 * sb * a / t
        if runtime == "torch" and model.sliding_window and not (layout.attn == "flex" and not model.dropout):
            # (FlexAttention's block mask is a few bytes per 128×128 block: not counted) the window's boolean mask, which SDPA turns into an additive mask in the compute dtype
            # and saves (one per layer; global layers of an alternating model have none: averaged)
            items["attn_window_mask"] = e * s * seq_len * model.local_layer_count() / model.n_layers
    items["attn_out"] = e * sb * q / t  # input of the output projection
    if model.dropout:
        items["attn_resid_dropout_mask"] = MASK * sb * h / rep
    # ---- MLP block
    if unfused:
        items["mlp_norm_fp32_input"] = FP32 * sb * h / rep
        items["mlp_norm_normalized"] = e * sb * h / rep
    else:
        items["mlp_norm_input"] = e * sb * h / rep
    items["mlp_norm_output"] = e * sb * h / (1 if torch_sp else rep)  # input of the up-projection GEMM
    if model.arch == "llama":
        items["mlp_up"] = 2 * e * sb * f / t  # gate and up outputs
        # PyTorch's ops (plait's runtime, Megatron-LM 2021-22) keep silu(gate) and silu(gate)·up;
        # Megatron-Core's fused SwiGLU (bias_swiglu_fusion) recomputes silu in its backward, so only
        # fc2's input stays
        items["mlp_act_out"] = (1 if runtime == "megatron-core" else 2) * e * sb * f / t
    else:
        items["mlp_up"] = e * sb * f / t  # GELU input
        items["mlp_act_out"] = e * sb * f / t  # GELU output = input of fc2
    if model.dropout:
        items["mlp_dropout_mask"] = MASK * sb * h / rep
    # fused LayerNorm: mean and rstd; RMSNorm and every unfused chain: rstd
    stats_per_norm = 2 if model.arch == "gpt" and not unfused else 1
    norms = 4 if model.norm_position == "sandwich" else 2
    if model.norm_position == "sandwich":  # the post norms save their input (the sub-block's output)
        items["attn_post_norm_input"] = e * sb * h / rep
        items["mlp_post_norm_input"] = e * sb * h / rep
    items["norm_stats"] = norms * stats_per_norm * FP32 * sb / rep
    if runtime == "torch" and e >= FP32 and model.arch == "llama" and not unfused:
        # fp32: plait's CPU runtime, whose composite RMSNorm also saves its normalized value x·rstd
        items["rmsnorm_normalized"] = norms * e * sb * h / rep + (
            e * sb * (q + kv) / t if model.qk_norm != "none" else 0.0)
    if runtime == "megatron-core" and layout.precision in FP8_PRECISIONS:
        for key in TE_FP8_SAVED_INPUTS:  # Transformer Engine keeps these as low-precision copies
            if key in items:
                items[key] *= PRECISION_STORED_BYTES[layout.precision] / e
    if model.moe is not None or model.mla is not None:  # experts, MLA: the mean layer's items (plait.plan.moe.memory)
        items = adjust_layer_items(items, model, layout, seq_len, mbs, runtime, element_bytes)
    return items


def residual_bytes(model: ModelSpec, layout: Layout, seq_len: int, mbs: int | None = None,
                   element_bytes: float = BF16) -> float:
    """Bytes of one norm's input in the compute dtype (the residual stream: the layer input, the
    MLP's residual input), sharded by t with sequence parallelism: what a checkpoint keeps as its input."""
    b = layout.mbs if mbs is None else mbs
    rep = layout.tp if layout.sequence_parallel else 1
    return element_bytes * seq_len / layout.cp * b * model.hidden / rep


def checkpointed_items(items: dict[str, float], policy: str, residual: float | None = None,
                       mlp_norms: int = 1) -> dict[str, float]:
    """The items a checkpointed layer keeps under ``policy``; ``residual``: bytes of a norm's bf16
    input (``residual_bytes``; needed when the norm itself saves something else, ``norm=unfused``);
    ``mlp_norms``: the MLP half's norms under ``mlp`` (``mlp_checkpoint_items``)."""
    residual = items["attn_norm_input"] if residual is None else residual
    if policy == "none":
        return dict(items)
    if policy == "selective":
        return {k: v for k, v in items.items() if k not in SELECTIVE_DROPS}
    if policy == "balanced":
        kept = {k: v for k, v in items.items() if k in BALANCED_KEEPS}
        kept.update(attn_norm_input=residual, mlp_norm_input=residual)
        return kept
    if policy == "full":
        return {"attn_norm_input": residual}
    if policy == "mlp":
        return mlp_checkpoint_items(items, residual, mlp_norms)
    raise ValueError(f"unknown checkpoint policy {policy!r}")


def mlp_checkpoint_items(items: dict[str, float], residual: float, mlp_norms: int = 1) -> dict[str, float]:
    """What a layer keeps under ``ckpt=mlp`` (module docstring): ``items`` less ``MLP_HALF_ITEMS``, half of
    the norms' statistics (each half runs as many norms), the MLP input ``residual`` (bytes), and of
    the CPU composite RMSNorm's normalized values (``rmsnorm_normalized``) those of the attention half:
    ``mlp_norms`` (the MLP half's norms: 2 with sandwich norms, else 1) times ``residual`` fewer."""
    kept = {k: v for k, v in items.items() if k not in MLP_HALF_ITEMS}
    kept["norm_stats"] = items["norm_stats"] / 2
    if "rmsnorm_normalized" in kept:
        kept["rmsnorm_normalized"] -= mlp_norms * residual
    kept["mlp_norm_input"] = residual
    return kept


def torch_balanced_items(items: dict[str, float], model: ModelSpec, layout: Layout, seq_len: int,
                         mbs: int | None = None, element_bytes: float = BF16) -> dict[str, float]:
    """What a ``balanced`` layer of plait's runtime keeps (see the module docstring), from the
    ``runtime="torch"`` items of ``layer_items``."""
    s = seq_len / layout.cp
    b = layout.mbs if mbs is None else mbs
    kept = {k: items[k] for k in ("q", "kv", "mlp_up")}
    kept["attn_norm_input"] = residual_bytes(model, layout, seq_len, mbs, element_bytes)
    if layout.attn != "eager":
        kept["attn_out"] = items["attn_out"]
        kept["attn_lse"] = items["attn_lse"]
    kept["attn_proj_out"] = element_bytes * s * b * model.hidden  # row-parallel: full width, before the reduction
    kept["mlp_down_out"] = element_bytes * s * b * model.hidden
    if model.mla is not None:  # the latent GEMMs' outputs instead of Q, K, V (plait.plan.moe.memory)
        kept.update(mla_balanced_items(model, layout, seq_len, b, element_bytes))
    return kept


@by_layout_fields(*ITEM_FIELDS, "ckpt")
def kept_items(model: ModelSpec, layout: Layout, seq_len: int, policy: str | None = None,
               mbs: int | None = None, *, runtime: str = "megatron", element_bytes: float = BF16) -> dict[str, float]:
    """Bytes a layer keeps for its backward under ``policy`` (default: the layout's), by item."""
    items = layer_items(model, layout, seq_len, mbs, runtime=runtime, element_bytes=element_bytes)
    policy = layout.ckpt if policy is None else policy
    if policy == "balanced" and runtime == "torch":
        return torch_balanced_items(items, model, layout, seq_len, mbs, element_bytes)
    return checkpointed_items(items, policy, residual_bytes(model, layout, seq_len, mbs, element_bytes),
                              2 if model.norm_position == "sandwich" else 1)


def layer_bytes(model: ModelSpec, layout: Layout, seq_len: int, policy: str | None = None, *,
                runtime: str = "megatron", element_bytes: float = BF16) -> float:
    """Saved bytes of one layer and micro-batch under ``policy`` (default: the layout's)."""
    return sum(kept_items(model, layout, seq_len, policy, runtime=runtime, element_bytes=element_bytes).values())


def offloadable_items(kept: dict[str, float], policy: str, runtime: str = "torch") -> dict[str, float]:
    """The part of a layer's kept bytes that activation offload moves to the host.

    Offload works on autograd's saved tensors (``plait.run.memory.offload``). A ``balanced`` layer of
    plait's runtime keeps its GEMM outputs in the selective checkpoint's own cache, which no
    saved-tensor hook sees: only its input (the checkpoint's saved input) is offloaded.
    """
    if policy == "balanced" and runtime == "torch":
        return {"attn_norm_input": kept["attn_norm_input"]}
    return dict(kept)


def offloaded_layer_count(layout: Layout, layers_on_stage: int, stage: int = 0) -> int:
    """How many of a pipeline stage's layers offload their activations (the first ones).

    ``offload`` is Kwai's fraction α of the first stage's layers (``stage`` is the pipeline
    rank). Pipeline-stage aware: with 1F1B-type schedules pipeline rank s holds p - s
    micro-batches in flight, fewer than the first rank's p, so it offloads only what brings its
    activations down to the first rank's level after offload: α_s = max(0, 1 - p·(1 - α)/(p - s)),
    rounded up to whole layers. GPipe holds every micro-batch on every stage: α everywhere.
    A stage's first layers are the ones offloaded: their activations wait longest for their
    backward, which leaves the most time to hide the transfers.
    """
    alpha = float(layout.offload)
    if alpha <= 0.0:
        return 0
    p = layout.pp
    if p > 1 and layout.schedule != "gpipe" and stage > 0:
        alpha = max(0.0, 1.0 - p * (1.0 - alpha) / (p - stage))
    return min(layers_on_stage, math.ceil(alpha * layers_on_stage - 1e-9))


def checkpointed_layer_count(model: ModelSpec, layout: Layout, layers_on_stage: int) -> int:
    """How many of a stage's layers use the checkpoint policy (the rest keep everything)."""
    if layout.ckpt == "none":
        return 0
    return min(layers_on_stage, layout.ckpt_layers) if layout.ckpt_layers else layers_on_stage


@by_layout_fields(*ITEM_FIELDS, "ckpt", "ckpt_layers", "offload", "pp", "schedule")
def stage_layer_bytes(model: ModelSpec, layout: Layout, seq_len: int, layers_on_stage: int, stage: int = 0, *,
                      runtime: str = "torch", element_bytes: float = BF16) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(bytes kept, bytes of them offloaded) by each layer a GPU holds, for one micro-batch.

    The first ``checkpointed_layer_count`` layers use the checkpoint policy, the first
    ``offloaded_layer_count`` layers offload (``offloadable_items``) what they keep.
    ``element_bytes``: bytes per element of the compute dtype (``layer_items``).
    """
    full = sum(layer_items(model, layout, seq_len, runtime=runtime, element_bytes=element_bytes).values())
    kept_map = kept_items(model, layout, seq_len, runtime=runtime, element_bytes=element_bytes)
    kept = sum(kept_map.values())
    movable = sum(offloadable_items(kept_map, layout.ckpt, runtime).values())
    n_ckpt = checkpointed_layer_count(model, layout, layers_on_stage)
    n_off = offloaded_layer_count(layout, layers_on_stage, stage)
    per_layer = tuple(kept if i < n_ckpt else full for i in range(layers_on_stage))
    moved = tuple((movable if i < n_ckpt else full) if i < n_off else 0.0 for i in range(layers_on_stage))
    return per_layer, moved
