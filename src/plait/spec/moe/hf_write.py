"""A mixture-of-experts ModelSpec as a Hugging Face ``config.json`` (the inverse of
``plait.spec.moe.hf``; no torch), for the families whose weights plait's runtime trains and
exports (``plait.run.checkpoint.hf.map``): Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3 and
GPT-OSS (sinks, windows on the even layers, biased experts with the clamped SwiGLU).

``plait.spec.hf.writer.hf_config_of`` calls ``moe_config_for`` for each candidate family
(``candidates``) and keeps the first whose config reads back as the spec. DeepSeek-V3 is written
with ``rope_interleave: true`` (the RoPE layout of plait's ``apply_rope``) and without
``moe_layer_freq`` (transformers makes every layer after the first dense ones an MoE layer).
Qwen2/3-MoE's expert layers are written as transformers places them (``_qwen_placement``).
DeepSeek-V2 (trained from scratch; its weights have no table) is read by plait but has no writer:
``NOT_WRITTEN`` says why, for export's refusal.
"""

from __future__ import annotations

from plait.spec.model import ModelSpec
from plait.spec.moe.parts import OAI_ALPHA, OAI_LIMIT, is_moe_layer

ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
                 "deepseek_v3": "DeepseekV3ForCausalLM"}
CANDIDATES = ("mixtral", "qwen3_moe", "olmoe", "qwen2_moe", "gpt_oss")  # tried in order for a spec of no family
NOT_WRITTEN = {"deepseek_v2": "DeepSeek-V2's config (its weights have no table; plait writes DeepSeek-V3's)"}
SWIGLU = {"swiglu_alpha": OAI_ALPHA, "swiglu_limit": OAI_LIMIT}  # GPT-OSS's clamped SwiGLU (plait.spec.moe.parts)


def candidates(spec: ModelSpec) -> tuple[str, ...]:
    """The families tried, in order, for an MoE or MLA ``spec`` of no family: DeepSeek-V3's alone holds MLA."""
    return ("deepseek_v3",) if spec.mla is not None else CANDIDATES


def unwritten(spec: ModelSpec) -> str | None:
    """What of ``spec`` no family plait writes can hold (``NOT_WRITTEN``'s words), or None."""
    if spec.family == "deepseek_v2":
        return NOT_WRITTEN["deepseek_v2"]
    return None


def _qwen_placement(spec: ModelSpec) -> dict:
    """decoder_sparse_step and mlp_only_layers that give ``spec``'s expert layers in transformers'
    Qwen2/3-MoE (experts where (i + 1) % step == 0 and i is not in mlp_only_layers): the spec's
    ``every`` as the step when its first expert layer is one of the step's, else step 1."""
    moe = spec.moe
    step = moe.every if (moe.first_dense + 1) % moe.every == 0 else 1
    dense = [i for i in range(spec.n_layers) if not is_moe_layer(spec, i) and (i + 1) % step == 0]
    return {"decoder_sparse_step": step, "mlp_only_layers": dense}


def _layer_types(spec: ModelSpec) -> list[str]:
    return ["sliding_attention" if spec.sliding_window and spec.is_local_layer(i) else "full_attention"
            for i in range(spec.n_layers)]


def moe_config_for(spec: ModelSpec, family: str, rope: dict) -> dict:
    """The body of the config.json of MoE ``spec`` as a ``family`` model (``rope``: rope_theta and
    rope_parameters, as ``plait.spec.hf.writer`` writes them), unchecked."""
    moe = spec.moe
    out = {"vocab_size": spec.vocab, "hidden_size": spec.hidden, "num_hidden_layers": spec.n_layers,
           "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim,
           "max_position_embeddings": spec.max_seq_len, "rms_norm_eps": spec.norm_eps, "hidden_act": "silu",
           **rope, "attention_dropout": 0.0, "tie_word_embeddings": spec.tied_embeddings,
           "num_experts_per_tok": moe.top_k, "router_aux_loss_coef": moe.aux_loss_coef,
           "output_router_logits": False}
    if family == "mixtral":
        out.update(intermediate_size=moe.expert_ffn, num_local_experts=moe.n_experts,
                   sliding_window=spec.sliding_window or None)
    elif family in ("qwen2_moe", "qwen3_moe"):
        window = spec.sliding_window or None
        out.update(intermediate_size=spec.ffn_hidden, moe_intermediate_size=moe.expert_ffn,
                   num_experts=moe.n_experts, **_qwen_placement(spec), norm_topk_prob=moe.norm_topk,
                   use_sliding_window=window is not None, sliding_window=window, max_window_layers=spec.n_layers)
        if family == "qwen2_moe":
            out.update(shared_expert_intermediate_size=moe.shared_width if moe.n_shared else 0,
                       qkv_bias=spec.qkv_bias, layer_types=_layer_types(spec))
        else:
            out["attention_bias"] = spec.qkv_bias
    elif family == "gpt_oss":
        out.update(intermediate_size=moe.expert_ffn, num_local_experts=moe.n_experts, sliding_window=spec.sliding_window,
                   layer_types=_layer_types(spec),
                   attention_bias=spec.qkv_bias, **SWIGLU)
    elif family == "deepseek_v3":
        mla = spec.mla
        del out["head_dim"]  # transformers sets it to qk_rope_head_dim
        out.update(intermediate_size=spec.ffn_hidden, moe_intermediate_size=moe.expert_ffn,
                   n_routed_experts=moe.n_experts, n_shared_experts=moe.n_shared, first_k_dense_replace=moe.first_dense,
                   n_group=moe.n_groups, topk_group=moe.topk_groups, routed_scaling_factor=moe.route_scale,
                   norm_topk_prob=moe.norm_topk, q_lora_rank=(mla.q_lora_rank or None) if mla else None,
                   kv_lora_rank=mla and mla.kv_lora_rank, qk_nope_head_dim=mla and mla.qk_nope_head_dim,
                   qk_rope_head_dim=mla and mla.qk_rope_head_dim, v_head_dim=mla and mla.v_head_dim,
                   rope_interleave=True, attention_bias=False)
    elif family == "olmoe":
        out.update(intermediate_size=moe.expert_ffn, num_experts=moe.n_experts, norm_topk_prob=moe.norm_topk,
                   attention_bias=spec.qkv_bias, clip_qkv=None)
    return out
