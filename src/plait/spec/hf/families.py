"""What plait knows of each Hugging Face model family: the defaults of the config keys it reads
(as transformers 5.23's config classes set them), the keys it reads, and the keys that change
nothing it models (ids, dtypes, initialization, cache and generation settings).

``plait.spec.hf_config`` reads a config.json with these tables (no transformers needed) and refuses
any key in none of them: a key plait does not know could change parameters, FLOPs or memory.
"""

from __future__ import annotations

# Families read as arch=llama (RMSNorm, RoPE, gated MLP) and as arch=gpt (LayerNorm, learned positions).
LLAMA_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma2", "phi3")
GPT_FAMILIES = ("gpt2", "gpt_bigcode")

# Defaults of the keys plait reads, by family, where config.json leaves them out.
_LLAMA_LIKE = {
    "num_key_value_heads": None,  # None: num_attention_heads
    "head_dim": None,  # None: hidden_size // num_attention_heads
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "sliding_window": None,
    "attention_dropout": 0.0,
}
DEFAULTS: dict[str, dict] = {
    "llama": dict(_LLAMA_LIKE),
    "mistral": {**_LLAMA_LIKE, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
                "sliding_window": 4096},
    "qwen2": {**_LLAMA_LIKE, "num_key_value_heads": 32, "max_position_embeddings": 32768,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {**_LLAMA_LIKE, "num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    "olmo2": {**_LLAMA_LIKE, "rms_norm_eps": 1e-5},
    "gemma2": {**_LLAMA_LIKE, "head_dim": 256, "max_position_embeddings": 8192, "tie_word_embeddings": True,
               "hidden_activation": "gelu_pytorch_tanh", "hidden_act": None, "sliding_window": 4096,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256,
               "use_bidirectional_attention": None},
    "phi3": {**_LLAMA_LIKE, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "resid_pdrop": 0.0,
             "embd_pdrop": 0.0, "partial_rotary_factor": 1.0},
    "gpt2": {"n_inner": None, "n_positions": 1024, "tie_word_embeddings": True, "activation_function": "gelu_new",
             "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
             "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False},
    "gpt_bigcode": {"n_inner": None, "n_positions": 1024, "tie_word_embeddings": True,
                    "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1,
                    "embd_pdrop": 0.1, "attn_pdrop": 0.1, "multi_query": True,
                    "num_key_value_heads": None,  # written by transformers as 1 (multi_query) or n_head; not read
                    "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False},
}

# Keys plait reads besides those with defaults (the sizes, and RoPE's settings).
READ_KEYS = {
    "model_type", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
    "n_embd", "n_head", "n_layer", "n_ctx", "rope_scaling", "rope_parameters", "layer_types",
    "original_max_position_embeddings", "_name_or_path",
}

# Keys that change no parameter, FLOP or saved activation (and nothing plait's runtime builds).
HARMLESS_KEYS = {
    "architectures", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "torch_dtype", "dtype", "transformers_version", "use_cache", "initializer_range",
    "pretraining_tp", "cache_implementation", "is_decoder", "output_attentions", "output_hidden_states",
    "return_dict", "tokenizer_class", "task_specific_params", "id2label", "label2id", "problem_type",
    "use_return_dict", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "reorder_and_upcast_attn", "scale_attn_weights", "attention_softmax_in_fp32",
    "scale_attention_softmax_in_fp32", "model_name", "name_or_path", "max_window_layers", "use_sliding_window",
    "finetuning_task", "prefix", "chunk_size_feed_forward", "tie_encoder_decoder", "is_encoder_decoder",
    "pruned_heads", "torchscript", "use_bfloat16", "tf_legacy_loss", "generation_config",
    "classifier_dropout",
}

# Keys whose mere presence (with a value other than these) means a feature plait does not model.
REFUSED = {
    "num_experts": "mixture-of-experts layers", "num_local_experts": "mixture-of-experts layers",
    "n_routed_experts": "mixture-of-experts layers", "moe_intermediate_size": "mixture-of-experts layers",
    "num_experts_per_tok": "mixture-of-experts layers", "quantization_config": "quantized weights",
    "embedding_multiplier": "Granite's multipliers", "residual_multiplier": "Granite's multipliers",
    "attention_multiplier": "Granite's multipliers", "logits_scaling": "Granite's multipliers",
    "use_bidirectional_attention": "bidirectional attention",
}
