"""What a mixture-of-experts ``config.json`` means where it leaves a key out: transformers 5.24's
config-class defaults for the keys ``plait.spec.moe.hf`` reads (no torch).

``with_defaults`` fills them in before the config is read, as ``plait.spec.hf.families.DEFAULTS``
does for the dense families: a config that leaves out ``routed_scaling_factor`` is read as
transformers builds it (DeepSeek-V3: 2.5), not as plait's MoESpec default. The sizes themselves
(hidden_size, num_hidden_layers, num_attention_heads, vocab_size, intermediate_size) have no
default here: a config without them is refused by name. ``tests/spec/test_moe_config_keys.py``
checks every family's defaults against transformers' own config classes.
"""

from __future__ import annotations

from pathlib import Path

from plait.errors import PlaitError

_COMMON = {"tie_word_embeddings": False, "rope_theta": 10000.0}  # hidden_act etc.: plait.spec.hf.values
# GPT-OSS's rotary scaling when the config gives none (transformers' GptOssConfig.__post_init__)
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}

MOE_DEFAULTS: dict[str, dict] = {
    "mixtral": {**_COMMON, "num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 4096 * 32,
                "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None, "num_local_experts": 8,
                "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001},
    "qwen2_moe": {**_COMMON, "num_key_value_heads": 16, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                  "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                  "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False, "router_aux_loss_coef": 0.001,
                  "mlp_only_layers": None, "qkv_bias": True, "layer_types": None},
    "qwen3_moe": {**_COMMON, "num_key_value_heads": 4, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                  "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128,
                  "norm_topk_prob": False, "router_aux_loss_coef": 0.001, "mlp_only_layers": None},
    "olmoe": {**_COMMON, "num_key_value_heads": None, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
              "attention_bias": False, "clip_qkv": None, "num_experts_per_tok": 8, "num_experts": 64,
              "router_aux_loss_coef": 0.01, "norm_topk_prob": False},
    "deepseek_v2": {**_COMMON, "num_key_value_heads": None, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                    "attention_bias": False, "mlp_bias": False, "first_k_dense_replace": 0, "kv_lora_rank": 512,
                    "q_lora_rank": 1536, "n_group": None, "n_routed_experts": 64, "n_shared_experts": 2,
                    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "routed_scaling_factor": 1.0, "topk_group": None,
                    "topk_method": "greedy", "norm_topk_prob": False, "v_head_dim": 128,
                    "moe_intermediate_size": 1407},
    "deepseek_v3": {**_COMMON, "num_key_value_heads": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                    "moe_intermediate_size": 2048, "n_shared_experts": 1, "n_routed_experts": 256,
                    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
                    "rope_interleave": True, "attention_bias": False},
    "gpt_oss": {**_COMMON, "num_local_experts": 128, "head_dim": 64, "num_key_value_heads": 8, "sliding_window": 128,
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
                "num_experts_per_tok": 4, "router_aux_loss_coef": 0.001, "attention_bias": True, "layer_types": None},
}


# Another name of a key, as each config class's ``attribute_map`` reads it: {family: {alias: key}}
ALIASES: dict[str, dict[str, str]] = {
    "mixtral": {"num_experts": "num_local_experts"}, "qwen3_moe": {"num_local_experts": "num_experts"},
    "olmoe": {"num_local_experts": "num_experts"}, "gpt_oss": {"num_experts": "num_local_experts"},
    "deepseek_v2": {"num_experts": "n_routed_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
}


def with_defaults(config: dict, kind: str, source: Path) -> dict:
    """``config`` (model_type ``kind``) with each alias under its key (``ALIASES``; transformers 5.24
    writes Qwen3-MoE's ``num_experts`` as ``num_local_experts``) and transformers' defaults for the
    keys it leaves out; a ``None`` it gives stays ``None`` (transformers keeps it too: DeepSeek's
    ``q_lora_rank: null`` is "no query rank"). GPT-OSS without rope settings gets its yarn scaling
    (``GPT_OSS_ROPE``)."""
    config = dict(config)
    for alias, key in ALIASES.get(kind, {}).items():
        if alias in config:
            value = config.pop(alias)
            if config.setdefault(key, value) != value:
                raise PlaitError(f"{source}: {alias}={value!r} and {key}={config[key]!r} are one setting of "
                                 f"{kind} with two values")
    merged = {**MOE_DEFAULTS.get(kind, {}), **config}
    if kind == "gpt_oss" and not (config.get("rope_parameters") or config.get("rope_scaling")):
        merged["rope_parameters"] = dict(GPT_OSS_ROPE)
    return merged
