"""Hugging Face configs read right: 16 released models give their exact parameter counts, both
readers (plain JSON and transformers' config classes) give the same ModelSpec, and what plait
does not model is refused by the key's name."""

from __future__ import annotations

import importlib.util
import json

import pytest
from hf_configs import CONFIGS, PARAMS

from plait.errors import PlaitError
from plait.spec.hf_config import model_from_hf_config, model_from_hf_dict
from plait.spec.model import ModelSpec

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def read(tmp_path, config, reader="plain"):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return model_from_hf_config(path, reader)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_published_parameter_counts(tmp_path, name):
    spec = read(tmp_path, CONFIGS[name])
    assert spec.total_params() == PARAMS[name]
    assert ModelSpec.from_dict(spec.to_dict()) == spec  # the plan file records every feature


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed")
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_both_readers_agree(tmp_path, name):
    assert read(tmp_path, CONFIGS[name], "transformers") == read(tmp_path, CONFIGS[name])


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed")
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma2", "phi3"])
def test_family_defaults_agree_with_transformers(tmp_path, family):
    """A config with only the sizes: every other key from the family's defaults, the same both ways."""
    sparse = {"model_type": family, "hidden_size": 256, "num_attention_heads": 8, "num_hidden_layers": 4,
              "intermediate_size": 512, "vocab_size": 1000, "num_key_value_heads": 4}
    assert read(tmp_path, sparse, "transformers") == read(tmp_path, sparse)


def test_features_read_from_the_configs(tmp_path):
    qwen3 = read(tmp_path, CONFIGS["Qwen3-0.6B"])
    assert (qwen3.head_dim, qwen3.q_hidden, qwen3.qk_norm) == (128, 2048, "head")  # q wider than hidden=1024
    qwen25 = read(tmp_path, CONFIGS["Qwen2.5-0.5B"])
    assert (qwen25.qkv_bias, qwen25.attn_out_bias, qwen25.sliding_window) == (True, False, 0)  # window unused
    olmo = read(tmp_path, CONFIGS["OLMo-2-7B"])
    assert (olmo.qk_norm, olmo.norm_position, olmo.norm_eps) == ("full", "post", 1e-6)
    mistral = read(tmp_path, CONFIGS["Mistral-7B-v0.1"])
    assert (mistral.sliding_window, mistral.local_layers) == (4096, "all")
    gemma = read(tmp_path, CONFIGS["Gemma-2-2B"])
    assert (gemma.sliding_window, gemma.local_layers, gemma.attn_softcap, gemma.logit_softcap) == (4096, "even", 50, 30)
    assert (gemma.norm_position, gemma.norm_offset, gemma.activation) == ("sandwich", True, "gelu_tanh")
    assert gemma.embed_scale == pytest.approx(2304 ** 0.5) and gemma.attn_scale == pytest.approx(1 / 16)
    llama31 = read(tmp_path, CONFIGS["Llama-3.1-8B"])
    assert dict(llama31.rope_scaling)["rope_type"] == "llama3" and llama31.rope_theta == 500000.0
    assert read(tmp_path, CONFIGS["Llama-3-8B"]).rope_scaling == ()


def test_head_dim_and_window_change_attention_flops(tmp_path):
    """Attention FLOPs per token: 4·n_heads·head_dim per key seen, keys from the window arithmetic."""
    qwen3 = read(tmp_path, CONFIGS["Qwen3-0.6B"])
    s = 4096
    assert qwen3.attention_flops_per_token(s) == 4.0 * 16 * 128 * 28 * (s + 1) / 2
    mistral = read(tmp_path, CONFIGS["Mistral-7B-v0.1"])
    s, w = 8192, 4096  # the first w queries see i+1 keys, the other s - w see w
    keys = (w * (w + 1) / 2 + (s - w) * w) / s
    assert mistral.attention_flops_per_token(s) == pytest.approx(4.0 * 4096 * 32 * keys, rel=1e-12)
    assert mistral.attention_flops_per_token(4096) == 4.0 * 4096 * 32 * (4096 + 1) / 2  # window covers all
    gemma = read(tmp_path, CONFIGS["Gemma-2-2B"])
    s, w = 8192, 4096
    local = (w * (w + 1) / 2 + (s - w) * w) / s
    assert gemma.attention_flops_per_token(s) == pytest.approx(4.0 * 8 * 256 * (13 * local + 13 * (s + 1) / 2))


def test_sizes_in_plan_output_are_exact_for_qwen3(tmp_path):
    """6·N + attention: the matmul weights include Q and O at n_heads·head_dim, not hidden."""
    spec = read(tmp_path, CONFIGS["Qwen3-0.6B"])
    h, q, kv, f = 1024, 2048, 1024, 3072
    assert spec.layer_matmul_params() == h * q + 2 * h * kv + q * h + 3 * h * f
    assert spec.layer_params() == spec.layer_matmul_params() + 2 * h + 2 * 128


@pytest.mark.parametrize("extra, fragment", [
    ({"num_local_experts": 8}, "num_local_experts=8: mixture-of-experts"),
    ({"some_new_knob": 3}, "config key 'some_new_knob'"),
    ({"attention_dropout": 0.1}, "attention_dropout=0.1"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial_rotary_factor=0.5"),
    ({"layer_types": ["full_attention", "sliding_attention"] * 2, "sliding_window": 64}, "layer_types"),
    ({"hidden_act": "relu"}, "activation 'relu'"),
])
def test_what_plait_does_not_model_is_refused_by_name(tmp_path, extra, fragment):
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
              "intermediate_size": 128, "vocab_size": 100, **extra}
    with pytest.raises(PlaitError, match=fragment):
        read(tmp_path, config)


def test_a_quantized_checkpoint_s_config_reads_as_the_same_architecture(tmp_path):
    """quantization_config says how the released weights are stored (int4 here), not what the model
    computes: the architecture plans as the unquantized one (importing the weights is refused:
    tests/run/test_hf_moe_numerics.py)."""
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
              "intermediate_size": 128, "vocab_size": 100}
    plain = read(tmp_path, config)
    quantized = read(tmp_path, {**config, "quantization_config": {"bits": 4, "quant_method": "gptq"}})
    assert quantized == plain


def test_granite_multipliers_are_refused(tmp_path):
    with pytest.raises(PlaitError, match="not supported"):
        read(tmp_path, {"model_type": "granite", "hidden_size": 64, "embedding_multiplier": 12.0})


def test_gpt2_reads_dropout_and_activation(tmp_path):
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
            "vocab_size": 50257, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
            "attn_pdrop": 0.1}
    spec = read(tmp_path, gpt2)
    assert spec.total_params() == 124_439_808 and spec.dropout and spec.activation == "gelu_tanh"
    with pytest.raises(PlaitError, match="resid_pdrop=0.2"):
        read(tmp_path, {**gpt2, "resid_pdrop": 0.2})
    if HAVE_TRANSFORMERS:
        assert read(tmp_path, gpt2, "transformers") == spec


def test_readers_refuse_a_bad_reader_name(tmp_path):
    with pytest.raises(ValueError):
        model_from_hf_dict(CONFIGS["Llama-2-7B"], tmp_path, "magic")
