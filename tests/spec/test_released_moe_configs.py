"""The released config.json files of DeepSeek-V3 and gpt-oss-120b, as published on the Hub
(deepseek-ai/DeepSeek-V3, openai/gpt-oss-120b; every key kept), read as the presets of the same
model: the architecture, parameter count, norm epsilon and RoPE are the preset's (whose counts
tests/spec/test_moe_counts.py checks against transformers). Both hold a ``quantization_config``
(fp8 blocks; mxfp4): how the released weights are stored, not what the model computes, so they
plan; importing such weights is refused (tests/run/test_hf_moe_numerics.py)."""

from __future__ import annotations

import json

import pytest

from plait.spec.models import MODELS, get_model

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}

GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}

RELEASED = {"deepseek-v3": DEEPSEEK_V3, "gpt-oss-120b": GPT_OSS_120B}
SAME = ("n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "vocab", "head_dim", "mla", "qkv_bias",
        "attn_out_bias", "sliding_window", "local_layers", "sinks", "norm_eps", "rope_theta", "rope_scaling")
ROUTING = ("n_experts", "top_k", "expert_ffn", "n_shared", "first_dense", "router", "n_groups", "topk_groups",
           "route_scale", "norm_topk", "router_bias", "expert_bias", "activation")


@pytest.mark.parametrize("name", sorted(RELEASED))
@pytest.mark.parametrize("file_name", ["config.json", "released.json"])
def test_a_released_config_reads_as_its_preset(tmp_path, name, file_name):
    """Also under another file name than config.json: a JSON file with a model_type is a Hugging Face
    config (a plait model JSON has none)."""
    path = tmp_path / file_name
    path.write_text(json.dumps(RELEASED[name]))
    read, preset = get_model(str(path)), MODELS[name]
    assert read.total_params() == preset.total_params() and read.active_params() == preset.active_params()
    for field in SAME:
        assert getattr(read, field) == getattr(preset, field), field
    for field in ROUTING:
        assert getattr(read.moe, field) == getattr(preset.moe, field), f"moe.{field}"


def test_gpt_oss_routes_to_num_experts_per_tok_and_refuses_a_different_experts_per_token(tmp_path):
    """transformers' GPT-OSS routes to num_experts_per_tok experts; the released configs repeat it as
    experts_per_token. Two different values are refused, naming both; use_sliding_window, which
    transformers' GPT-OSS ignores, leaves the even layers windowed."""
    from plait.errors import PlaitError

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GPT_OSS_120B, "experts_per_token": 2}))
    with pytest.raises(PlaitError, match="experts_per_token=2 but num_experts_per_tok=4"):
        get_model(str(path))
    path.write_text(json.dumps({k: v for k, v in GPT_OSS_120B.items() if k != "layer_types"}
                               | {"use_sliding_window": False}))
    read = get_model(str(path))
    assert (read.sliding_window, read.local_layers) == (128, "even")


@pytest.mark.parametrize("changes, message", [
    ({"norm_topk_prob": "false"}, "norm_topk_prob='false' must be true or false"),
    ({"first_k_dense_replace": None}, "first_k_dense_replace=None must be an integer"),
])
def test_mistyped_values_are_refused_not_read_as_something_else(tmp_path, changes, message):
    """A string "false" is truthy and null is not a layer number: each is refused by key and value."""
    from plait.errors import PlaitError

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DEEPSEEK_V3, **changes}))
    with pytest.raises(PlaitError, match=message):
        get_model(str(path))
