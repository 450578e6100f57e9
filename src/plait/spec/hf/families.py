"""What plait knows of each Hugging Face model family: the defaults of the config keys it reads
(as transformers 5.23's config classes set them), the keys it reads, and the keys that change
nothing it models (ids, dtypes, initialization, cache and generation settings); and the RoPE scaling
types plait runs with the keys of each (``hf_rope_scaling`` records a config's, ``rope_scaling_problems``
checks one).

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
             "embd_pdrop": 0.0, "partial_rotary_factor": 1.0, "original_max_position_embeddings": 4096},
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
    "sliding_window_size",  # a stray duplicate in Gemma-2-9B/27B's config.json that transformers never reads
    # how the released weights are stored (fp8 blocks: DeepSeek-V3, Kimi-K2; mxfp4: GPT-OSS; int4), not
    # what the model computes: plans and from-scratch runs train in the layout's precision; --init-from
    # refuses such weights (plait.run.checkpoint.hf.numerics.check_init_from)
    "quantization_config",
}

# Keys whose mere presence (with a value other than these) means a feature plait does not model.
REFUSED = {
    "num_experts": "mixture-of-experts layers", "num_local_experts": "mixture-of-experts layers",
    "n_routed_experts": "mixture-of-experts layers", "moe_intermediate_size": "mixture-of-experts layers",
    "num_experts_per_tok": "mixture-of-experts layers",
    "embedding_multiplier": "Granite's multipliers", "residual_multiplier": "Granite's multipliers",
    "attention_multiplier": "Granite's multipliers", "logits_scaling": "Granite's multipliers",
    "use_bidirectional_attention": "bidirectional attention",
}

# ---- RoPE scaling (a config's rope_scaling / rope_parameters), as transformers 5.24's
# modeling_rope_utils reads it: the types plait runs, the keys each type needs, the keys it may carry.
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
ROPE_ORIGINAL_TYPES = ("llama3", "yarn", "longrope")  # those with original_max_position_embeddings
ROPE_REQUIRED = {
    "default": (), "linear": ("factor",), "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
ROPE_OPTIONAL = {"yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
                 "longrope": ("attention_factor", "factor")}
ROPE_KEYS = {"rope_type"} | {k for keys in (*ROPE_REQUIRED.values(), *ROPE_OPTIONAL.values()) for k in keys}
# (smallest value, whether the smallest is allowed) of each number a rope_scaling may hold
_ROPE_NUMBERS = {"factor": (0.0, False), "low_freq_factor": (0.0, True), "high_freq_factor": (0.0, False),
                 "attention_factor": (0.0, False), "beta_fast": (0.0, True), "beta_slow": (0.0, True),
                 "mscale": (0.0, True), "mscale_all_dim": (0.0, True)}


def hf_rope_scaling(params: dict, max_positions: int, original: int | None = None) -> dict:
    """A config's rope_scaling / rope_parameters (``rope_theta`` and ``partial_rotary_factor`` taken
    out) as plait records it: ``type`` read as ``rope_type``, None values dropped, and for llama3, yarn
    and longrope ``original_max_position_embeddings`` filled in as transformers does (the config's
    top-level ``original`` first, as Phi-3 writes it, then the dict's own, then ``max_positions``).
    Plain RoPE (type default and nothing else) is ``{}``."""
    out = {k: v for k, v in params.items() if v is not None}
    if "type" in out:
        kind = out.pop("type")
        out.setdefault("rope_type", kind)
    kind = out.setdefault("rope_type", "default")
    if kind == "default" and set(out) == {"rope_type"}:
        return {}
    if kind in ROPE_ORIGINAL_TYPES:
        out["original_max_position_embeddings"] = original if original is not None else \
            out.get("original_max_position_embeddings", max_positions)
    return out


def rope_scaling_problems(scaling: dict, rotary_dim: int) -> list[str]:
    """What is wrong with a recorded rope_scaling (``hf_rope_scaling``'s form; lists may be tuples)
    for heads rotating ``rotary_dim`` elements: an unknown type or key, a missing key, a number out
    of range, longrope factors that are not one positive number per rotated pair."""
    if not scaling:
        return []
    kind = scaling.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        return [f"rope_scaling type {kind!r} is not one of {', '.join(ROPE_TYPES)}"]
    unknown = sorted(set(scaling) - ROPE_KEYS)
    if unknown:
        return [f"rope_scaling key {unknown[0]!r} is not understood by plait (it knows {', '.join(sorted(ROPE_KEYS))})"]
    missing = [k for k in ROPE_REQUIRED[kind] if k not in scaling]
    if missing:
        return [f"rope_scaling type {kind!r} needs {', '.join(missing)}"]
    problems = []
    for key, (low, inclusive) in _ROPE_NUMBERS.items():
        value = scaling.get(key)
        if value is not None and not (_is_number(value) and (value >= low if inclusive else value > low)):
            problems.append(f"rope_scaling {key}={value!r} must be a number {'>=' if inclusive else '>'} {low:g}")
    original = scaling.get("original_max_position_embeddings")
    if original is not None and not (_is_number(original) and original == int(original) and original >= 1):
        problems.append(f"rope_scaling original_max_position_embeddings={original!r} must be a positive integer")
    if kind == "llama3" and not problems and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        problems.append(f"rope_scaling high_freq_factor={scaling['high_freq_factor']} must be greater than "
                        f"low_freq_factor={scaling['low_freq_factor']}")
    if "truncate" in scaling and not isinstance(scaling["truncate"], bool):
        problems.append(f"rope_scaling truncate={scaling['truncate']!r} must be true or false")
    for key in ("short_factor", "long_factor"):
        if key in scaling:
            value = scaling[key]
            if not isinstance(value, (list, tuple)) or len(value) != rotary_dim // 2 \
                    or not all(_is_number(v) and v > 0 for v in value):
                problems.append(f"rope_scaling {key} must hold {rotary_dim // 2} positive numbers (one per rotated "
                                f"pair of a {rotary_dim}-wide head), not {str(value)[:40]}")
    return problems


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and abs(value) != float("inf")
