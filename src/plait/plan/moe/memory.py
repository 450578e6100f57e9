"""Memory of mixture-of-experts and MLA models: parameters per rank, expert model states, saved activations.

Parameters on one rank (``stage_dense_params``, ``stage_expert_params``): the most loaded pipeline
stage holds ``stage_layers · vpp`` layers, as many of them MoE layers as the model has (at most
all): the worst case for DeepSeek-V3, whose three dense layers sit on the first stage.
  * dense part (attention, dense MLPs, shared experts, router, norms; embeddings and LM head as
    for a dense model): matmul weights split by tp (the router is replicated), model states as a
    dense model's (ZeRO over dp·cp, ``plait.plan.memory``).
  * routed experts: n_experts / ep experts per MoE layer, each split by etp; 2 + 2 + 12 bytes per
    parameter, ZeRO-1 shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the
    weights over the expert-data-parallel ranks edp = tp·cp·dp / (ep·etp) (``expert_states``).

Saved activations of one MoE block (``moe_layer_saved_bytes``, one layer and micro-batch; the
runtime's memory-truth test compares with it). T tokens on the rank enter the block (s·b, or
s·b/tp with sequence parallelism: the router and the dispatch see the sequence shard), R =
T·top_k·etp·c tokens reach its experts after dispatch (c: the capacity factor, 1 when dropless
and balanced; the etp ranks gather their tokens with sequence parallelism, without it they hold
the same ones: R = T·top_k·c):
  moe_router_probs     4·T·E        fp32 router probabilities (softmax or sigmoid output)
  moe_combine_weights  4·T·k        fp32 top-k weights (the combine's gradient w.r.t. expert outputs)
  moe_dispatched       2·R·h        tokens after dispatch: input of the experts' gate/up GEMM
  moe_up               2·2·R·f/etp  gate and up outputs
  moe_act_out          2·2·R·f/etp  silu(gate) and silu(gate)·up (input of the down GEMM); GPT-OSS's
                                    clamped SwiGLU 5·2·R·f/etp (``OAI_ACT_SAVED``)
  moe_expert_out       2·R·h        expert outputs (the combine's gradient w.r.t. the weights)
  moe_shared_up        2·2·S·n·f_s/tp   shared experts' gate and up outputs (S = s·b: the shared
  moe_shared_act_out   2·2·S·n·f_s/tp   experts take the gathered norm output, as a dense MLP)
  moe_topk_indices     8·T·k        int64 expert ids of the top-k (its backward scatters into them)
  moe_topk_norm        4·T·k + 4·T  with norm_topk: the top-k probabilities and their sum (the
                                    renormalizing division's inputs; 0 without norm_topk)
  moe_token_indices    8·2·T·k      int64 row -> token gather index and the un-permute index of the
                                    combine; with ep > 1 also 8·2·R: the receiving side's regroup
                                    by local expert and its inverse
  moe_aux_fraction     4·E          the aux loss's per-expert token fractions (aux_loss_coef > 0)
The last four are what plait's runtime (``plait.run.modules.moe``) saves besides the tensors every
MoE implementation keeps; the memory-truth test (tests/run/test_moe_memory_truth.py) measures all.
The block's input norm items (``mlp_norm_input``, ``mlp_norm_output``) are the dense layer's.
Transient buffers (item ``moe_buffers`` of the memory): the dispatch send and receive buffers of one
layer, 2·2·R·h bytes, live during its forward and again in its backward.

MLA attention (``mla_items``): Q and K of width a·(d_nope + d_rope), V of a·d_v, the attention
output a·d_v (all /tp), the latents (Q latent r_q, its norm output, KV latent r_kv + d_rope and
its norm output: 2·(2·r_q + 2·r_kv + d_rope) bytes per token, replicated) and the latent norms'
fp32 rstd (``mla_norm_stats``: 4 bytes per token and norm, two with a query rank, one without). The
runtime's memory-truth test (tests/run/test_memory_truth.py) measures them; it found the rstd
missing (8 bytes per token and layer) and the runtime keeping all of wkv_b's output for V
(a·d_nope·2 bytes per token more than counted; the runtime now copies V out). Under
``ckpt=balanced`` (plait's runtime keeps GEMM outputs) ``mla_balanced_items``: the four latent
GEMMs' outputs in place of Q, K and V.
"""

from __future__ import annotations

from plait.plan.states import sharded_states
from plait.spec.layout import FP8_PRECISIONS, PRECISION_STORED_BYTES, Layout
from plait.spec.moe.parts import moe_layer_count
from plait.spec.moe.counts import (attention_matmul_params, attention_other_params, dense_mlp_params,
                                   routed_expert_params, router_params)
from plait.spec.moe.layout import expert_data_parallel

BF16, FP32 = 2, 4  # bytes per element (as plait.plan.activations)
MOE_ITEMS = ("moe_router_probs", "moe_combine_weights", "moe_dispatched", "moe_up", "moe_act_out",
             "moe_expert_out", "moe_shared_up", "moe_shared_act_out", "moe_topk_indices", "moe_topk_norm",
             "moe_token_indices", "moe_aux_fraction")
INT64 = 8  # bytes of an index
# per routed row and ffn column, the tensors plait's eager clamped SwiGLU (GPT-OSS, run.modules.experts.glu)
# saves besides the gate and up GEMM outputs (which the clamps save): sigmoid's output, the clamped gate
# and the gated product (the second multiply's inputs), up + 1, and their product (the down GEMM's input)
OAI_ACT_SAVED = 5


def stage_layer_split(model, layout: Layout, layers: int) -> tuple[int, int]:
    """(dense, MoE) layers on the most loaded stage of ``layers`` layers (module docstring)."""
    moe = min(layers, moe_layer_count(model)) if model.moe is not None else 0
    return layers - moe, moe


def dense_layer_local(model, layout: Layout, moe_layer: bool) -> float:
    """Non-expert parameters of one layer on one rank (matmul weights split by tp)."""
    t = layout.tp
    out = attention_matmul_params(model) / t + attention_other_params(model) + model.layer_norm_params()
    if not moe_layer:
        return out + dense_mlp_params(model) / t + model.mlp_bias_params()
    moe = model.moe
    shared = moe.n_shared * 3 * model.hidden * moe.shared_width / t + (model.hidden if moe.shared_gate else 0)
    return out + router_params(model) + shared


def expert_layer_local(model, layout: Layout) -> float:
    """Routed-expert parameters of one MoE layer on one rank: n_experts / ep experts split by etp."""
    return model.moe.n_experts / layout.ep * routed_expert_params(model) / layout.etp


def stage_dense_blocks(model, layout: Layout, layers: int) -> float:
    """Non-expert parameters of ``layers`` blocks of the most loaded stage on one rank."""
    dense, moe = stage_layer_split(model, layout, layers)
    return dense * dense_layer_local(model, layout, False) + moe * dense_layer_local(model, layout, True)


def stage_expert_params(model, layout: Layout, layers: int) -> float:
    """Routed-expert parameters on one rank of the most loaded stage."""
    if model.moe is None:
        return 0.0
    return stage_layer_split(model, layout, layers)[1] * expert_layer_local(model, layout)


def expert_states(model, layout: Layout, layers: int, element_bytes: float = BF16,
                  runtime: str = "megatron") -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer, ZeRO-3 buffers, host bytes) of the routed experts on one rank
    (``element_bytes``: the compute dtype's, ``plait.plan.states``; ``runtime``: whose expert-data-parallel
    ranks shard them, ``plait.spec.moe.layout.expert_data_parallel``)."""
    params = stage_expert_params(model, layout, layers)
    if params == 0.0:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    layer = expert_layer_local(model, layout) if layout.zero >= 3 else 0.0  # gathered: one layer of experts
    return sharded_states(params, layout, expert_data_parallel(layout, runtime), layer, element_bytes)


def routed_tokens(model, layout: Layout, seq_len: int, mbs: int | None = None, load: float = 1.0) -> tuple[float, float]:
    """(T, R): tokens entering the MoE block on a rank, and routed tokens its experts compute
    (``load``: the most loaded rank's share over the mean; a capacity factor caps it)."""
    b = layout.mbs if mbs is None else mbs
    rep = layout.tp if layout.sequence_parallel else 1
    tokens = seq_len / layout.cp * b / rep
    moe = model.moe
    factor = min(load, moe.capacity_factor) if moe.capacity_factor else load
    gathered = layout.etp if layout.sequence_parallel else 1  # without sp the etp ranks hold the same tokens
    return tokens, tokens * moe.top_k * gathered * factor


def moe_layer_saved_bytes(model, layout: Layout, seq_len: int, mbs: int | None = None, *,
                          runtime: str = "torch", element_bytes: float = BF16) -> dict[str, float]:
    """Bytes one MoE block (router to combine, and the shared experts) saves for its backward, for
    one micro-batch, by item (module docstring; the 2-byte items are in the compute dtype,
    ``element_bytes`` each). ``runtime``: as ``plait.plan.activations.layer_items``; Megatron's
    fused SwiGLU keeps one activation output per expert (fc2's input), and under fp8 Transformer
    Engine keeps the experts' GEMM inputs as 1-byte copies (``TE_FP8_MOE_INPUTS``)."""
    e = element_bytes
    moe, h = model.moe, model.hidden
    tokens, routed = routed_tokens(model, layout, seq_len, mbs)
    f = moe.expert_ffn / layout.etp
    b = layout.mbs if mbs is None else mbs
    full = seq_len / layout.cp * b  # the shared experts see the gathered sequence, as a dense MLP
    shared = moe.n_shared * moe.shared_width / layout.tp
    # fc2's input alone (Megatron's fused activation), or plait's eager ops: silu(gate) and the
    # product; GPT-OSS's clamped SwiGLU (``OAI_ACT_SAVED``) more
    act = 1 if runtime == "megatron-core" else OAI_ACT_SAVED if moe.activation == "oai" else 2
    shared_act = 1 if runtime == "megatron-core" else 2  # the shared experts are SwiGLU MLPs
    items = {
        "moe_router_probs": FP32 * tokens * moe.n_experts,
        "moe_combine_weights": FP32 * tokens * moe.top_k,
        "moe_dispatched": e * routed * h,
        "moe_up": 2 * e * routed * f,
        "moe_act_out": act * e * routed * f,
        "moe_expert_out": e * routed * h,
        "moe_shared_up": 2 * e * full * shared,
        "moe_shared_act_out": shared_act * e * full * shared,
        "moe_topk_indices": INT64 * tokens * moe.top_k,
        "moe_topk_norm": FP32 * tokens * (moe.top_k + 1) if moe.norm_topk else 0.0,
        "moe_token_indices": 2 * INT64 * (tokens * moe.top_k + (routed if layout.ep > 1 else 0.0)),
        "moe_aux_fraction": FP32 * moe.n_experts if moe.aux_loss_coef else 0.0,
    }
    if runtime == "megatron-core" and layout.precision in FP8_PRECISIONS:
        for key in TE_FP8_MOE_INPUTS:
            items[key] *= PRECISION_STORED_BYTES[layout.precision] / e
    return items


# the experts' GEMM inputs (fc1's: the dispatched tokens; fc2's: the activation output, routed and
# shared) that Transformer Engine keeps as fp8 copies (``plait.plan.activations.TE_FP8_SAVED_INPUTS``)
TE_FP8_MOE_INPUTS = ("moe_dispatched", "moe_act_out", "moe_shared_act_out")


def dispatch_buffer_bytes(model, layout: Layout, seq_len: int, element_bytes: float = BF16) -> float:
    """Send and receive buffers of one MoE layer's dispatch (or combine), bytes (compute dtype)."""
    if model.moe is None:
        return 0.0
    return 2 * element_bytes * routed_tokens(model, layout, seq_len)[1] * model.hidden


def mla_items(model, layout: Layout, seq_len: int, b: int, element_bytes: float = BF16) -> dict[str, float]:
    """Saved bytes of an MLA attention block that differ from GQA's (module docstring)."""
    mla, a, t, e = model.mla, model.n_heads, layout.tp, element_bytes
    sb = seq_len / layout.cp * b
    return {"q": e * sb * a * mla.qk_head_dim / t,
            "kv": e * sb * a * (mla.qk_head_dim + mla.v_head_dim) / t,
            "attn_out": e * sb * a * mla.v_head_dim / t,
            "mla_latents": e * sb * (2 * mla.q_lora_rank + 2 * mla.kv_lora_rank + mla.qk_rope_head_dim),
            "mla_norm_stats": FP32 * sb * (2 if mla.q_lora_rank else 1)}


def mla_balanced_items(model, layout: Layout, seq_len: int, b: int, element_bytes: float = BF16) -> dict[str, float]:
    """What ``ckpt=balanced`` keeps of an MLA attention (it saves GEMM outputs) in place of GQA's Q, K
    and V: the up-projections' outputs (``q``: a·(d_nope + d_rope); ``kv``: wkv_b's a·(d_nope + d_v),
    /tp) and the down-projections' (``mla_latents``: r_q and r_kv + d_rope, replicated)."""
    mla, a, t, e = model.mla, model.n_heads, layout.tp, element_bytes
    sb = seq_len / layout.cp * b
    return {"q": e * sb * a * mla.qk_head_dim / t,
            "kv": e * sb * a * (mla.qk_nope_head_dim + mla.v_head_dim) / t,
            "mla_latents": e * sb * (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim)}


def adjust_layer_items(items: dict[str, float], model, layout: Layout, seq_len: int, mbs: int | None,
                       runtime: str, element_bytes: float = BF16) -> dict[str, float]:
    """``plait.plan.activations.layer_items`` of a dense layer, made those of the model's mean layer:
    MLA's attention widths, and for an MoE model the MoE block's items in place of the dense MLP's,
    weighted by the fraction of MoE layers (the rest keep the dense MLP's). A GQA model's head_dim,
    Q/K norms and windows are already in ``layer_items`` (ModelSpec fields): nothing is added here."""
    out = dict(items)
    b = layout.mbs if mbs is None else mbs
    if model.mla is not None:
        out.update(mla_items(model, layout, seq_len, b, element_bytes))
        out.pop("attn_kv_repeat", None)
        if "rmsnorm_normalized" in out:  # fp32 on a CPU: the latent norms' composite also saves x·rstd
            mla = model.mla
            out["rmsnorm_normalized"] += element_bytes * seq_len / layout.cp * b * (mla.q_lora_rank + mla.kv_lora_rank)
    if model.moe is None:
        return out
    fraction = moe_layer_count(model) / model.n_layers
    for key in ("mlp_up", "mlp_act_out"):
        out[key] = (1.0 - fraction) * out[key]
    for key, value in moe_layer_saved_bytes(model, layout, seq_len, mbs, runtime=runtime,
                                            element_bytes=element_bytes).items():
        out[key] = fraction * value
    return out
