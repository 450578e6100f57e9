"""Exact parameter and FLOP counts of a ModelSpec with experts or MLA (``plait.spec.moe.parts``).

The attention features are the ModelSpec's own (``head_dim``, ``qkv_bias``, ``attn_out_bias``,
``qk_norm``, ``sliding_window``/``local_layers``, ``sinks``) and are counted by its methods.
Per layer (h hidden, a heads, E routed experts, k top-k, f_e expert ffn, f_s shared ffn):
  attention, GQA/MHA (d = head_dim, q = a·d, g = n_kv_heads·d): Q h·q, K and V h·g each, output
      q·h; biases ``ModelSpec.attention_bias_params``; sinks a (``ModelSpec.layer_sink_params``).
  attention, MLA (r_q, r_kv latent ranks, d_n, d_r, d_v head widths): Q h·r_q + r_q·a·(d_n+d_r)
      (or h·a·(d_n+d_r) without r_q), KV-down h·(r_kv + d_r), KV-up r_kv·a·(d_n + d_v), output
      a·d_v·h; latent RMSNorms r_q + r_kv.
  MLP: dense SwiGLU 3·h·ffn_hidden (+ ``mlp_bias_params``); MoE: router h·E (+E bias), E routed
      experts of 3·h·f_e (+2·f_e + h biases), shared experts 3·h·f_s each (+h for Qwen2-MoE's
      shared gate, left out of the FLOPs).
  norms: ``ModelSpec.layer_norm_params`` (two RMSNorms 2·h, plus Q/K norms: 2·d ``head``, q + g ``full``).
Active parameters (``active_params``): every parameter except the routed experts a token does not
use, (E - k) per MoE layer: embeddings and LM head included (Mixtral-8x7B: 12.9B of 46.7B).
Matmul FLOPs follow ``plait.spec.model``: 2 per active matmul weight per token forward, the router
included. Attention of a GQA model: ``ModelSpec.attention_flops_per_token``; of an MLA model
(forward, per token and layer): 2·a·(d_qk + d_v) per key a query sees, the keys as
``ModelSpec.keys_per_query`` counts them. DeepSeek-V3's multi-token-prediction module is not part
of the model (off).
"""

from __future__ import annotations

from functools import lru_cache

from plait.spec.moe.parts import is_moe_layer, moe_layer_count


def attention_matmul_params(model) -> int:
    """Weights of one layer's attention that take part in matmuls."""
    h, a = model.hidden, model.n_heads
    mla = model.mla
    if mla is not None:
        q = (h * mla.q_lora_rank + mla.q_lora_rank * a * mla.qk_head_dim) if mla.q_lora_rank else h * a * mla.qk_head_dim
        kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
        return q + kv + a * mla.v_head_dim * h
    q, g = model.q_hidden, model.kv_hidden
    return h * q + 2 * h * g + q * h


def attention_other_params(model) -> int:
    """Biases (MLA: latent norms) and sinks of one layer's attention; its Q/K norms are in
    ``ModelSpec.layer_norm_params``."""
    if model.mla is not None:
        return model.mla.q_lora_rank + model.mla.kv_lora_rank + model.layer_sink_params()
    return model.attention_bias_params() + model.layer_sink_params()


def routed_expert_params(model) -> int:
    """All parameters of one routed expert (weights and biases)."""
    moe, h = model.moe, model.hidden
    return 3 * h * moe.expert_ffn + ((2 * moe.expert_ffn + h) if moe.expert_bias else 0)


def router_params(model) -> int:
    moe = model.moe
    return model.hidden * moe.n_experts + (moe.n_experts if moe.router_bias else 0)


def shared_expert_params(model) -> int:
    """Parameters of all shared experts of one MoE layer."""
    moe = model.moe
    return moe.n_shared * 3 * model.hidden * moe.shared_width + (model.hidden if moe.shared_gate else 0)


def dense_mlp_params(model) -> int:
    """Matmul weights of one dense (SwiGLU) MLP."""
    return 3 * model.hidden * model.ffn_hidden


def layer_params_at(model, layer: int) -> int:
    """All parameters of layer ``layer``."""
    out = attention_matmul_params(model) + attention_other_params(model) + model.layer_norm_params()
    if is_moe_layer(model, layer):
        return out + router_params(model) + model.moe.n_experts * routed_expert_params(model) + shared_expert_params(model)
    return out + dense_mlp_params(model) + model.mlp_bias_params()


def layer_active_matmul_at(model, layer: int) -> int:
    """Matmul weights one token uses in layer ``layer`` (router, top-k routed and shared experts)."""
    out = attention_matmul_params(model)
    if is_moe_layer(model, layer):
        moe, h = model.moe, model.hidden
        return out + h * moe.n_experts + moe.top_k * 3 * h * moe.expert_ffn + moe.n_shared * 3 * h * moe.shared_width
    return out + dense_mlp_params(model)


@lru_cache(maxsize=1024)  # the planner asks for the same model's sums many times
def blocks_params(model) -> int:
    """Parameters of all transformer blocks."""
    return sum(layer_params_at(model, i) for i in range(model.n_layers))


@lru_cache(maxsize=1024)  # the planner asks for the same model's sums many times
def blocks_active_matmul(model) -> int:
    """Matmul weights one token uses, summed over the blocks."""
    return sum(layer_active_matmul_at(model, i) for i in range(model.n_layers))


def expert_params_total(model) -> int:
    """Parameters of all routed experts of the model (what expert parallelism shards)."""
    if model.moe is None:
        return 0
    return moe_layer_count(model) * model.moe.n_experts * routed_expert_params(model)


def active_params(model) -> int:
    """Parameters a token uses: all but the (E - k) unchosen routed experts of each MoE layer."""
    if model.moe is None:
        return model.total_params()
    unused = moe_layer_count(model) * (model.moe.n_experts - model.moe.top_k) * routed_expert_params(model)
    return model.total_params() - unused


def attention_dims(model) -> tuple[int, int]:
    """(query/key width, value width) summed over heads."""
    if model.mla is not None:
        return model.n_heads * model.mla.qk_head_dim, model.n_heads * model.mla.v_head_dim
    return model.q_hidden, model.q_hidden


def mean_keys_per_query(model, seq_len: int, causal: bool = True) -> float:
    """Keys a query sees, averaged over the sequence and the layers (sliding-window layers fewer)."""
    local = model.local_layer_count()
    return (local * model.keys_per_query(seq_len, True, causal)
            + (model.n_layers - local) * model.keys_per_query(seq_len, False, causal)) / model.n_layers


@lru_cache(maxsize=1024)  # the planner asks for the same model's sums many times
def attention_flops_per_token(model, seq_len: int, causal: bool = True) -> float:
    """Forward FLOPs of Q·Kᵀ and P·V per token, summed over layers (module docstring)."""
    qk, v = attention_dims(model)
    return 2.0 * (qk + v) * model.n_layers * mean_keys_per_query(model, seq_len, causal)
