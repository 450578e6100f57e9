"""Mixture-of-experts specs: exact total and active counts, HF config.json, JSON, the layout rules.

Expected counts were computed independently with transformers 5.23 (MixtralForCausalLM,
Qwen3MoeForCausalLM, OlmoeForCausalLM, DeepseekV3ForCausalLM, GptOssForCausalLM built from the
released configs on the meta device: ``sum(p.numel() for p in model.parameters())``; active =
total - (E - k)/E of the routed-expert tensors). Published figures: Mixtral-8x7B 46.7B (12.9B
active), Mixtral-8x22B 141B, Qwen3-30B-A3B 30.5B, Qwen3-235B-A22B 235B, OLMoE-1B-7B 6.9B,
DeepSeek-V3 671B without its multi-token-prediction module, GPT-OSS-120B 116.8B.
"""

from __future__ import annotations

import json

import pytest

from plait.errors import PlaitError
from plait.spec.hardware import get_cluster
from plait.spec.hf_config import model_from_hf_config
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.models import MODELS
from plait.spec.validate import validate

ATTENTION_FIELDS = ("head_dim", "qkv_bias", "attn_out_bias", "qk_norm", "sliding_window", "local_layers", "sinks")
TRANSFORMERS_COUNTS = {  # name: (total, active)
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248),
    "mixtral-8x22b": (140_630_071_296, 39_161_468_928),
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
    "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520),
    "olmoe-1b-7b": (6_919_161_856, 1_282_017_280),
    "deepseek-v3": (671_026_404_352, 37_552_282_624),
    "gpt-oss-120b": (116_829_156_672, 5_711_982_912),
}

MIXTRAL_CONFIG = {  # mistralai/Mixtral-8x7B-v0.1 config.json (the keys plait reads, as released)
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.02, "rope_theta": 1e6, "sliding_window": None, "tie_word_embeddings": False,
}
QWEN3_CONFIG = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                "mlp_only_layers": [], "norm_topk_prob": True, "max_position_embeddings": 40960,
                "tie_word_embeddings": False, "router_aux_loss_coef": 0.001}
DEEPSEEK_CONFIG = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                   "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                   "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
                   "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
                   "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
                   "n_group": 8, "topk_group": 4, "scoring_func": "sigmoid", "routed_scaling_factor": 2.5,
                   "norm_topk_prob": True, "aux_loss_alpha": 0.0001, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
                   "max_position_embeddings": 163840}
GPT_OSS_CONFIG = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
                  "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128, "attention_bias": True,
                  "layer_types": ["sliding_attention", "full_attention"] * 18, "tie_word_embeddings": False,
                  "max_position_embeddings": 131072, "router_aux_loss_coef": 0.9}


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_COUNTS))
def test_preset_counts_equal_transformers(name):
    total, active = TRANSFORMERS_COUNTS[name]
    assert MODELS[name].total_params() == total
    assert MODELS[name].active_params() == active


def test_mixtral_8x7b_from_the_preset_and_from_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL_CONFIG))
    model = model_from_hf_config(tmp_path)
    assert model.total_params() == MODELS["mixtral-8x7b"].total_params() == 46_702_792_704
    assert round(model.active_params() / 1e9, 1) == 12.9
    assert model.moe.n_experts == 8 and model.moe.top_k == 2 and model.moe.aux_loss_coef == 0.02


@pytest.mark.parametrize("config,preset", [(QWEN3_CONFIG, "qwen3-30b-a3b"), (DEEPSEEK_CONFIG, "deepseek-v3"),
                                           (GPT_OSS_CONFIG, "gpt-oss-120b")])
def test_hf_configs_of_each_family_give_the_preset(tmp_path, config, preset):
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = model_from_hf_config(tmp_path / "config.json")
    expected = MODELS[preset]
    assert (model.total_params(), model.active_params()) == TRANSFORMERS_COUNTS[preset]
    assert (model.moe, model.mla) == (expected.moe, expected.mla)
    for field in ATTENTION_FIELDS:  # one set of attention fields: the ModelSpec's own
        assert getattr(model, field) == getattr(expected, field), field


def test_qwen2_moe_shared_expert_and_its_gate(tmp_path):
    config = dict(QWEN3_CONFIG, model_type="qwen2_moe", shared_expert_intermediate_size=5632, num_hidden_layers=2)
    del config["head_dim"]  # Qwen2MoeAttention reads head_dim when the config holds it (below)
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = model_from_hf_config(tmp_path)
    h, moe = 2048, model.moe
    assert (moe.n_shared, moe.shared_ffn, moe.shared_gate) == (1, 5632, True)
    dense = MODELS["qwen3-30b-a3b"]
    attention = h * (h + 2 * 4 * 64) + h * h + (h + 2 * 4 * 64)  # head_dim 64, Q/K/V biases, no Q/K norm
    per_layer = attention + 2 * h + h * 128 + 128 * 3 * h * 768 + 3 * h * 5632 + h
    assert model.total_params() == 2 * per_layer + h + 2 * 151936 * h
    assert dense.moe.shared_gate is False
    (tmp_path / "config.json").write_text(json.dumps(dict(config, head_dim=128)))
    assert model_from_hf_config(tmp_path).q_hidden == 32 * 128  # transformers' q_proj: 2048 -> 4096


def test_moe_layer_placement_and_first_dense():
    from plait.spec.moe.parts import is_moe_layer, moe_layer_count

    v3 = MODELS["deepseek-v3"]
    assert [is_moe_layer(v3, i) for i in range(5)] == [False, False, False, True, True]
    assert moe_layer_count(v3) == 58
    every_second = ModelSpec(**{**MODELS["tiny-moe"].to_dict(), "moe": {**MODELS["tiny-moe"].moe.__dict__, "every": 2}})
    assert [is_moe_layer(every_second, i) for i in range(4)] == [False, True, False, True]


def test_mlp_only_layers_that_are_not_a_prefix_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(QWEN3_CONFIG, mlp_only_layers=[5])))
    with pytest.raises(PlaitError, match="mlp_only_layers"):
        model_from_hf_config(tmp_path)


def test_model_json_round_trip_and_bad_parts():
    for name in ("deepseek-v3", "gpt-oss-120b", "tiny-moe"):
        model = MODELS[name]
        assert ModelSpec.from_json(model.to_json()) == model
    data = MODELS["tiny-moe"].to_dict()
    with pytest.raises(PlaitError, match="top_k=9 is more than n_experts=8"):
        ModelSpec.from_dict({**data, "moe": {**data["moe"], "top_k": 9}})
    with pytest.raises(PlaitError, match="unknown fields"):
        ModelSpec.from_dict({**data, "moe": {**data["moe"], "experts": 8}})
    with pytest.raises(PlaitError, match="arch='llama'"):
        ModelSpec.from_dict({**MODELS["tiny-gpt"].to_dict(), "moe": data["moe"]})


def test_active_flops_count_top_k_experts_only():
    tiny = MODELS["tiny-moe"]
    h, f, e, k = 128, 96, 8, 2
    attention = h * h + 2 * h * 64 + h * h
    moe_layer = attention + h * e + k * 3 * h * f + 3 * h * f  # router, top-2, one shared expert
    dense_layer = attention + 3 * h * 384
    assert tiny.matmul_params() == dense_layer + 3 * moe_layer + 512 * h
    assert tiny.model_flops_per_token(256) == pytest.approx(
        6 * tiny.matmul_params() + 3 * 4 * 4 * h * (256 + 1) / 2)


def test_sliding_window_and_mla_attention_flops():
    oss = MODELS["gpt-oss-120b"]
    s, w, width = 4096, 128, 64 * 64
    local = (w * (w + 1) / 2 + (s - w) * w) / s  # keys per query of a local layer
    expected = 2 * 2 * width * (18 * (s + 1) / 2 + 18 * local)
    assert oss.attention_flops_per_token(s) == pytest.approx(expected)
    v3 = MODELS["deepseek-v3"]
    assert v3.attention_flops_per_token(s, causal=False) == pytest.approx(2 * 128 * (192 + 128) * s * 61)


def _check(model, layout, gpus=64):
    return [v.message for v in validate(MODELS[model], get_cluster("dgx-h100", gpus), JobSpec(512, 4096),
                                        Layout.parse(layout)) if v.severity == "error"]


def test_layout_rules_with_numbers():
    assert _check("mixtral-8x7b", "dp=64,ep=16") == ["ep=16 does not divide n_experts=8; ep that would: 1, 2, 4, 8"]
    assert _check("llama3-8b", "dp=64,ep=2") == ["ep=2, etp=1 but llama3-8b is dense (no experts): use ep=1, etp=1"]
    errors = _check("qwen3-30b-a3b", "dp=64,ep=128")
    assert errors == ["ep·etp = 128·1 = 128 does not divide tp·cp·dp = 1·1·64 = 64: expert-parallel ranks are "
                      "carved out of tp·cp·dp"]
    assert _check("qwen3-235b-a22b", "tp=2,pp=2,dp=16,ep=32", 64) == []  # ep reaches into tp (Megatron)
    assert "etp=5 does not divide the expert ffn 14336" in _check("mixtral-8x7b", "dp=64,ep=4,etp=5")[-1]


def test_expert_groups_follow_megatron_order():
    from plait.spec.moe.layout import expert_data_parallel, expert_groups

    layout = Layout.parse("tp=2,pp=8,dp=16,ep=32")  # 256 GPUs: ep spans tp and dp, 8 per node
    groups = expert_groups(layout, 8)
    assert (groups["ep"].size, groups["ep"].nodes, groups["ep"].stride) == (32, 4, 1)
    assert expert_data_parallel(layout) == 1 and groups["edp"].size == 1
    wide = expert_groups(Layout.parse("tp=2,dp=32,ep=8,etp=2"), 8)
    assert (wide["etp"].size, wide["ep"].size, wide["ep"].stride, wide["edp"].size) == (2, 8, 2, 4)


def test_expert_groups_follow_plaits_runtime_for_torch():
    # plait.run.parallel.mesh.expert_view: ep from the dp·cp ranks in the layout's order, tp left out
    from plait.spec.moe.layout import expert_groups

    layout = Layout.parse("tp=2,dp=32,ep=8")  # 64 GPUs, 8 per node, tp innermost
    megatron, torch_rule = expert_groups(layout, 8), expert_groups(layout, 8, "torch")
    assert (megatron["ep"].size, megatron["ep"].stride, megatron["ep"].nodes) == (8, 1, 1)  # ranks 0..7
    assert (torch_rule["ep"].size, torch_rule["ep"].stride, torch_rule["ep"].nodes) == (8, 2, 2)  # 0, 2, .., 14
    assert (torch_rule["edp"].size, torch_rule["edp"].stride, torch_rule["edp"].nodes) == (4, 16, 4)  # 0, 16, 32, 48
    assert torch_rule["etp"].size == 1
    dp_inside = expert_groups(Layout.parse("tp=2,dp=32,ep=8,order=dp-tp-cp-pp"), 8, "torch")
    assert (dp_inside["ep"].stride, dp_inside["ep"].nodes) == (1, 1)  # dp innermost: ranks 0..7
    split = expert_groups(Layout.parse("tp=2,dp=32,ep=8,etp=2"), 8, "torch")
    assert (split["etp"].size, split["etp"].stride, split["etp"].nodes) == (2, 1, 1)  # etp = tp: ranks 0, 1


def test_plait_models_lists_total_and_active(capsys, monkeypatch):
    from plait.cli import main

    monkeypatch.setenv("COLUMNS", "250")
    assert main(["models"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "mixtral-8x7b" in line)
    assert "46,702,792,704" in row and "12,879,925,248" in row and "8 top-2" in row
