"""Exact parameter and FLOP counts of a ModelSpec with experts, MLA or attention extras (``plait.spec.moe.parts``).

Per layer (h hidden, a heads, E routed experts, k top-k, f_e expert ffn, f_s shared ffn):
  attention, GQA/MHA (d = head_dim, q = a·d, g = n_kv_heads·d): Q h·q, K and V h·g each, output
      q·h; biases q + 2g (``qkv_bias``) and h (``attn_out_bias``); Q/K norms 2·d (``head``) or
      q + g (``full``); sinks a.
  attention, MLA (r_q, r_kv latent ranks, d_n, d_r, d_v head widths): Q h·r_q + r_q·a·(d_n+d_r)
      (or h·a·(d_n+d_r) without r_q), KV-down h·(r_kv + d_r), KV-up r_kv·a·(d_n + d_v), output
      a·d_v·h; latent RMSNorms r_q + r_kv.
  MLP: dense SwiGLU 3·h·ffn_hidden; MoE: router h·E (+E bias), E routed experts of 3·h·f_e
      (+2·f_e + h biases), shared experts 3·h·f_s each (+h for Qwen2-MoE's shared gate,
      left out of the FLOPs).
  two RMSNorms 2·h.
Active parameters (``active_params``): every parameter except the routed experts a token does not
use, (E - k) per MoE layer: embeddings and LM head included (Mixtral-8x7B: 12.9B of 46.7B).
Matmul FLOPs follow ``plait.spec.model``: 2 per active matmul weight per token forward, the router
included. Attention (forward, per token and layer): 2·a·(d_qk + d_v) per key a query sees (d_qk =
d_v = d for GQA); a query at position i sees i+1 keys (causal), at most ``sliding_window`` of
them in a local layer; ``causal=False`` counts s keys (global) or min(w, s) (local), Megatron's
full-square convention. DeepSeek-V3's multi-token-prediction module is not part of the model (off).
"""

from __future__ import annotations

from functools import lru_cache

from plait.spec.moe.parts import attention_head_dim, extras, is_local_layer, is_moe_layer, moe_layer_count


def attention_matmul_params(model) -> int:
    """Weights of one layer's attention that take part in matmuls."""
    h, a = model.hidden, model.n_heads
    mla = model.mla
    if mla is not None:
        q = (h * mla.q_lora_rank + mla.q_lora_rank * a * mla.qk_head_dim) if mla.q_lora_rank else h * a * mla.qk_head_dim
        kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
        return q + kv + a * mla.v_head_dim * h
    d = attention_head_dim(model)
    q, g = a * d, model.n_kv_heads * d
    return h * q + 2 * h * g + q * h


def attention_other_params(model) -> int:
    """Biases, Q/K or latent norms and sinks of one layer's attention."""
    if model.mla is not None:
        return model.mla.q_lora_rank + model.mla.kv_lora_rank
    extra, d = extras(model), attention_head_dim(model)
    q, g = model.n_heads * d, model.n_kv_heads * d
    out = (q + 2 * g if extra.qkv_bias else 0) + (model.hidden if extra.attn_out_bias else 0)
    out += {"none": 0, "head": 2 * d, "full": q + g}[extra.qk_norm]
    return out + (model.n_heads if extra.sinks else 0)


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
    return 3 * model.hidden * model.ffn_hidden


def layer_params_at(model, layer: int) -> int:
    """All parameters of layer ``layer``."""
    out = attention_matmul_params(model) + attention_other_params(model) + 2 * model.hidden
    if is_moe_layer(model, layer):
        return out + router_params(model) + model.moe.n_experts * routed_expert_params(model) + shared_expert_params(model)
    return out + dense_mlp_params(model)


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


def keys_per_query(seq_len: int, window: int, causal: bool) -> float:
    """Mean keys a query sees over a sequence of ``seq_len`` (window 0: no window)."""
    s = seq_len
    if not causal:
        return float(min(window, s) if window else s)
    if not window or window >= s:
        return (s + 1) / 2.0
    return (window * (window + 1) / 2.0 + (s - window) * window) / s


def attention_dims(model) -> tuple[int, int]:
    """(query/key width, value width) summed over heads."""
    if model.mla is not None:
        return model.n_heads * model.mla.qk_head_dim, model.n_heads * model.mla.v_head_dim
    width = model.n_heads * attention_head_dim(model)
    return width, width


@lru_cache(maxsize=1024)  # the planner asks for the same model's sums many times
def attention_flops_per_token(model, seq_len: int, causal: bool = True) -> float:
    """Forward FLOPs of Q·Kᵀ and P·V per token, summed over layers (module docstring)."""
    qk, v = attention_dims(model)
    window = extras(model).sliding_window
    local = sum(is_local_layer(model, i) for i in range(model.n_layers))
    keys = (model.n_layers - local) * keys_per_query(seq_len, 0, causal)
    keys += local * keys_per_query(seq_len, window, causal)
    return 2.0 * (qk + v) * keys
