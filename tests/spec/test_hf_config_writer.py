"""``plait export``'s config.json (``plait.spec.hf.writer``): every config written reads back as the
spec it was written from, for the 16 released configs, GPT-2 and GPT-BigCode configs and plait's
presets; what no family's config can hold is refused by the field's name. No torch needed."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from hf_configs import CONFIGS

from plait.errors import PlaitError
from plait.spec.hf.writer import hf_config_of
from plait.spec.hf_config import model_from_hf_dict
from plait.spec.model import ModelSpec
from plait.spec.models import MODELS

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
GPT_CONFIGS = {
    "gpt2-124M": {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
                  "n_positions": 1024, "n_ctx": 1024, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
    "gpt-bigcode-mqa": {"model_type": "gpt_bigcode", "vocab_size": 49152, "n_embd": 2048, "n_layer": 24,
                        "n_head": 16, "n_positions": 2048, "multi_query": True, "resid_pdrop": 0.0,
                        "embd_pdrop": 0.0, "attn_pdrop": 0.0},
}
ALL = {**CONFIGS, **GPT_CONFIGS}


def read(config: dict, reader: str = "plain") -> ModelSpec:
    return model_from_hf_dict(config, Path("test/config.json"), reader)


def same_but_name(a: ModelSpec, b: ModelSpec) -> bool:
    return dataclasses.replace(a, name=b.name) == b


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_read_config_writes_back_to_the_same_spec(name):
    spec = read(ALL[name])
    written = hf_config_of(spec)
    assert written["model_type"] == spec.family
    assert same_but_name(read(written), spec)


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed")
@pytest.mark.parametrize("name", sorted(ALL))
def test_transformers_reads_the_written_config_the_same(name):
    spec = read(ALL[name])
    assert same_but_name(read(hf_config_of(spec), "transformers"), spec)


@pytest.mark.parametrize("name", sorted(n for n, m in MODELS.items() if m.moe is None and m.mla is None))
def test_presets_export_as_llama_or_gpt2(name):
    spec = MODELS[name]
    written = hf_config_of(spec)
    assert written["model_type"] == {"llama": "llama", "gpt": "gpt2"}[spec.arch]
    assert same_but_name(read(written), dataclasses.replace(spec, family=written["model_type"],
                                                            dropout=spec.dropout and spec.arch == "gpt"))


def test_a_spec_of_no_family_takes_the_first_family_that_holds_it():
    base = MODELS["tiny"]
    qwen3 = dataclasses.replace(base, qk_norm="head")
    assert hf_config_of(qwen3)["model_type"] == "qwen3"
    olmo = dataclasses.replace(base, qk_norm="full", norm_position="post")
    assert hf_config_of(olmo)["model_type"] == "olmo2"
    mqa = dataclasses.replace(MODELS["tiny-gpt"], n_kv_heads=1)
    assert hf_config_of(mqa)["model_type"] == "gpt_bigcode"


def test_what_no_config_holds_is_refused_by_field():
    post_without_qk_norm = dataclasses.replace(MODELS["tiny"], norm_position="post")
    with pytest.raises(PlaitError, match=r"a llama config\.json cannot express norm_position='post' \(tried llama, "):
        hf_config_of(post_without_qk_norm)
    grouped_gpt = dataclasses.replace(MODELS["tiny-gpt"], n_kv_heads=2)
    with pytest.raises(PlaitError, match=r"cannot express n_kv_heads=2"):
        hf_config_of(grouped_gpt)
    mistral_with_biases = dataclasses.replace(read(CONFIGS["Mistral-7B-v0.1"]), qkv_bias=True)
    with pytest.raises(PlaitError, match=r"a mistral config\.json cannot express qkv_bias=True;"):
        hf_config_of(mistral_with_biases)


@pytest.mark.parametrize("name, why", [("tiny-moe", "cannot express ffn_hidden=384")])  # dense first layer, ungated shared expert
def test_moe_and_mla_presets_are_refused_by_name(name, why):
    with pytest.raises(PlaitError, match=why):
        hf_config_of(MODELS[name])


@pytest.mark.parametrize("name, family", [("mixtral-8x7b", "mixtral"), ("qwen3-30b-a3b", "qwen3_moe"),
                                          ("olmoe-1b-7b", "olmoe"), ("gpt-oss-120b", "gpt_oss"),
                                          ("deepseek-v3", "deepseek_v3"), ("tiny-dsv3", "deepseek_v3")])
def test_moe_presets_are_written_as_their_family(name, family):
    assert hf_config_of(MODELS[name])["model_type"] == family


# what the released config.json files hold (deepseek-ai/DeepSeek-V3, openai/gpt-oss-120b on the Hub)
RELEASED_NUMERICS = {
    "deepseek-v3": {"rms_norm_eps": 1e-6, "rope_theta": 10000, "rope_scaling": {
        "type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096}},
    "gpt-oss-120b": {"rms_norm_eps": 1e-5, "rope_theta": 150000, "rope_scaling": {
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}},
}


@pytest.mark.parametrize("name", sorted(RELEASED_NUMERICS))
def test_the_deepseek_and_gpt_oss_presets_compute_as_the_released_models(name):
    """The presets carry the released configs' norm epsilon and RoPE (theta and yarn), so a run or an
    export of the preset computes as the released model: the released values read as plait reads a
    config are the preset's."""
    from plait.spec.hf.families import hf_rope_scaling

    spec, released = MODELS[name], RELEASED_NUMERICS[name]
    assert spec.norm_eps == released["rms_norm_eps"] and spec.rope_theta == released["rope_theta"]
    read = hf_rope_scaling(released["rope_scaling"], spec.max_seq_len)
    assert dict(spec.rope_scaling) == read
    written = hf_config_of(spec)
    assert written["rms_norm_eps"] == released["rms_norm_eps"] and written["rope_theta"] == released["rope_theta"]
