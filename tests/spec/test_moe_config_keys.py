"""Mixture-of-experts config.json keys read as transformers 5.24 builds the model, or refused by name.

* Keys left out read as transformers' config classes fill them in (``plait.spec.moe.hf_defaults``):
  a config holding only the sizes and the same config as transformers writes it give one ModelSpec.
* Values that change the outputs and that plait's runtime does not run are refused in one line naming
  the key, the value and what plait runs (``plait.spec.hf.values``), for ``plait plan --model``
  and ``plait train --model`` alike.
* DeepSeek-V2's router: softmax, group-limited only with topk_method group_limited_greedy, never
  renormalized; DeepSeek-V3's sigmoid router whatever scoring_func says is refused.
* Which layers have experts (Qwen2/3-MoE: (i + 1) % decoder_sparse_step == 0 and i not in
  mlp_only_layers, modeling_qwen3_moe.py's Qwen3MoeDecoderLayer) and which slide, and the writer
  that puts them back.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from plait.cli import main
from plait.errors import PlaitError
from plait.spec.hf.writer import hf_config_of
from plait.spec.hf_config import model_from_hf_dict
from plait.spec.moe.parts import is_moe_layer

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss")
SIZES = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4, "intermediate_size": 96,
         "vocab_size": 128, "num_experts_per_tok": 2}
SOURCE = Path("x/config.json")


EXPERTS = {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts", "qwen2_moe": "num_experts",
           "qwen3_moe": "num_experts", "olmoe": "num_experts", "deepseek_v2": "n_routed_experts",
           "deepseek_v3": "n_routed_experts"}
MLA = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}


def sizes(family: str) -> dict:
    """The sizes of a tiny ``family`` config: 8 experts of 48 (MLA: one key per head, as transformers needs)."""
    deepseek = family.startswith("deepseek")
    out = {**SIZES, "num_key_value_heads": 4 if deepseek else 2, EXPERTS[family]: 8, **(MLA if deepseek else {})}
    if family.startswith(("qwen", "deepseek")):
        out["moe_intermediate_size"] = 48
    return out


def read(family: str, **keys):
    return model_from_hf_dict({"model_type": family, **sizes(family), **keys}, SOURCE)


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed")
@pytest.mark.parametrize("family", FAMILIES)
def test_keys_left_out_read_as_transformers_fills_them_in(family):
    from transformers import AutoConfig

    full = json.loads(AutoConfig.for_model(family, **sizes(family)).to_json_string())
    sparse, written = read(family), model_from_hf_dict(full, SOURCE)
    assert sparse == written


def test_transformers_defaults_that_differ_from_plaits_own():
    v3 = read("deepseek_v3", n_routed_experts=16)
    assert (v3.moe.route_scale, v3.moe.n_groups, v3.moe.topk_groups, v3.moe.first_dense, v3.moe.norm_topk) == \
        (2.5, 8, 4, 3, True)
    assert v3.mla.q_lora_rank == 1536 and read("deepseek_v2").moe.n_shared == 2
    assert read("qwen3_moe").moe.norm_topk is False  # Qwen3MoeConfig.norm_topk_prob = False
    gpt_oss = read("gpt_oss")  # 128-token windows on the even layers, yarn x32, head_dim 64, theta 150k
    assert (gpt_oss.sliding_window, gpt_oss.local_layers, gpt_oss.head_dim, gpt_oss.rope_theta) == \
        (128, "even", 64, 150000.0)
    assert dict(gpt_oss.rope_scaling)["rope_type"] == "yarn" and dict(gpt_oss.rope_scaling)["factor"] == 32.0
    assert read("mixtral").rope_theta == 1e6


@pytest.mark.parametrize("family, keys, fragment", [
    ("deepseek_v3", {"hidden_act": "gelu"}, "hidden_act='gelu' (plait's runtime runs 'silu'"),
    ("mixtral", {"hidden_act": "relu"}, "hidden_act='relu' (plait's runtime runs 'silu'"),
    ("qwen3_moe", {"hidden_act": "gelu_pytorch_tanh"}, "hidden_act='gelu_pytorch_tanh'"),
    ("olmoe", {"clip_qkv": 8.0}, "clip_qkv=8.0 (plait's runtime runs None"),
    ("olmoe", {"sliding_window": 16}, "sliding_window=16"),
    ("deepseek_v3", {"scoring_func": "softmax"}, "scoring_func='softmax' (plait's runtime runs 'sigmoid'"),
    ("deepseek_v3", {"topk_method": "greedy"}, "topk_method='greedy'"),
    ("deepseek_v3", {"moe_layer_freq": 2}, "moe_layer_freq=2 (plait's runtime runs 1"),
    ("deepseek_v3", {"attention_bias": True}, "attention_bias=True"),
    ("deepseek_v2", {"scoring_func": "sigmoid"}, "scoring_func='sigmoid' (plait's runtime runs 'softmax'"),
    ("deepseek_v2", {"norm_topk_prob": True}, "norm_topk_prob=True"),
    ("deepseek_v2", {"topk_method": "noaux_tc"}, "topk_method='noaux_tc'"),
    ("deepseek_v2", {"topk_method": "group_limited_greedy"}, "group_limited_greedy needs n_group and topk_group"),
    ("gpt_oss", {"swiglu_limit": 5.0}, "swiglu_limit=5.0 (plait's runtime runs 7.0"),
    ("gpt_oss", {"swiglu_alpha": 1.0}, "swiglu_alpha=1.0"),
    ("gpt_oss", {"layer_types": ["chunked_attention", "full_attention"] * 2}, "layer_types holds 'chunked_attention'"),
    ("gpt_oss", {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types has 2 entries"),
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise=0.1"),
    ("qwen3_moe", {"attention_dropout": 0.1}, "attention_dropout=0.1"),
    ("qwen3_moe", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ("qwen2_moe", {"layer_types": ["sliding_attention", "full_attention"] * 2}, "use_sliding_window is false"),
    ("qwen3_moe", {"num_experts": 8, "num_local_experts": 4}, "are one setting of qwen3_moe with two values"),
    ("olmoe", {"head_dim": 32}, "OLMoE's q/k norms are as wide as the hidden state"),
])
def test_what_changes_the_outputs_and_is_not_run_is_refused_by_name(family, keys, fragment):
    with pytest.raises(PlaitError, match="^x/config.json: ") as info:
        read(family, **keys)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_gpt_oss_experts_ignore_hidden_act_as_transformers_does():
    # GptOssExperts runs its clamped SwiGLU whatever hidden_act says (modeling_gpt_oss.py reads no ACT2FN)
    assert read("gpt_oss", hidden_act="gelu").moe == read("gpt_oss").moe


def test_dense_families_read_hidden_act():
    dense = {k: v for k, v in SIZES.items() if k != "num_experts_per_tok"}
    llama = model_from_hf_dict({"model_type": "llama", **dense, "hidden_act": "gelu"}, SOURCE)
    assert llama.activation == "gelu"  # the dense MLP applies it (plait.run.modules.layers.activation_function)


def test_deepseek_v2_routing_reads_as_transformers_routes():
    greedy = read("deepseek_v2", n_routed_experts=8, n_group=4, topk_group=2)  # topk_method greedy: no groups
    assert (greedy.moe.router, greedy.moe.n_groups, greedy.moe.topk_groups, greedy.moe.norm_topk) == \
        ("softmax", 1, 1, False)
    limited = read("deepseek_v2", n_routed_experts=8, n_group=4, topk_group=2, topk_method="group_limited_greedy",
                   scoring_func="softmax", routed_scaling_factor=16.0)
    assert (limited.moe.router, limited.moe.n_groups, limited.moe.topk_groups, limited.moe.route_scale) == \
        ("softmax", 4, 2, 16.0)
    v3 = read("deepseek_v3", n_routed_experts=8, n_group=4, topk_group=2, scoring_func="sigmoid",
              topk_method="noaux_tc")
    assert (v3.moe.router, v3.moe.n_groups) == ("sigmoid", 4)


@pytest.mark.parametrize("family, keys, experts", [
    ("qwen3_moe", {"decoder_sparse_step": 2}, [1, 3]),  # (i + 1) % 2 == 0
    ("qwen2_moe", {"decoder_sparse_step": 2, "mlp_only_layers": [1]}, [3]),
    ("qwen3_moe", {"mlp_only_layers": [0, 1]}, [2, 3]),
    ("qwen3_moe", {"decoder_sparse_step": 4}, [3]),
    ("deepseek_v3", {"first_k_dense_replace": 1, "n_routed_experts": 8, "n_group": 2, "topk_group": 1}, [1, 2, 3]),
    ("deepseek_v2", {"moe_layer_freq": 1}, [0, 1, 2, 3]),
    ("mixtral", {}, [0, 1, 2, 3]),
])
def test_expert_layers_are_transformers(family, keys, experts):
    spec = read(family, **keys)
    assert [i for i in range(spec.n_layers) if is_moe_layer(spec, i)] == experts


def test_expert_layers_plait_cannot_place_are_refused_with_the_layers():
    with pytest.raises(PlaitError, match=r"put experts on layers 0, 2, 3;"):
        read("qwen3_moe", mlp_only_layers=[1])
    with pytest.raises(PlaitError, match=r"put experts on layers 0, 1, 2, 3, 4, 6, 7, 8, \.\.\. \(47 layers\);"):
        read("qwen3_moe", mlp_only_layers=[5], num_hidden_layers=48)  # a long list: the first 8 and the count
    with pytest.raises(PlaitError, match=r"mlp_only_layers='3' must be a list of layer numbers"):
        read("qwen3_moe", mlp_only_layers="3")
    with pytest.raises(PlaitError, match="no layer of 4 has experts"):
        read("qwen3_moe", decoder_sparse_step=8)


@pytest.mark.parametrize("family, keys, window", [
    ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 16}, (16, "all")),
    ("qwen3_moe", {"use_sliding_window": False, "sliding_window": 16}, (0, "all")),
    ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 4}, (16, "even")),
    ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}, (0, "all")),
    ("mixtral", {"sliding_window": 16}, (16, "all")),
    ("gpt_oss", {"sliding_window": 16, "layer_types": ["sliding_attention"] * 4}, (16, "all")),
])
def test_sliding_windows_are_transformers(family, keys, window):
    spec = read(family, **keys)
    assert (spec.sliding_window, spec.local_layers) == window


def test_a_window_on_some_even_layers_is_refused():
    # Qwen2-MoE slides on the even layers below max_window_layers: layer 0 alone of 4 is no pattern of plait's
    with pytest.raises(PlaitError, match=r"sliding windows on layers \[0\]"):
        read("qwen2_moe", use_sliding_window=True, sliding_window=16, max_window_layers=2)


def test_experts_on_every_second_layer_are_written_where_transformers_reads_them():
    odd = read("qwen3_moe", decoder_sparse_step=2)  # experts on 1, 3
    config = hf_config_of(odd)
    assert (config["decoder_sparse_step"], config["mlp_only_layers"]) == (2, [])
    even = model_from_hf_dict({**config, "decoder_sparse_step": 1, "mlp_only_layers": [1, 3]}, SOURCE)
    assert [is_moe_layer(even, i) for i in range(4)] == [True, False, True, False]
    again = hf_config_of(even)  # every=2 from layer 0: step 1, the odd layers dense
    assert (again["decoder_sparse_step"], again["mlp_only_layers"]) == (1, [1, 3])


def test_plan_and_train_refuse_what_init_from_refuses(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt_oss", **sizes("gpt_oss"), "num_local_experts": 4, "head_dim": 16,
                                "swiglu_limit": 5.0}))
    for command in (["plan", "--gpus", "8"], ["train", "--device", "cpu", "--dry-run"]):
        assert main([*command, "--model", str(path), "--global-batch", "8", "--seq-len", "16"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "swiglu_limit=5.0 (plait's runtime runs 7.0" in err
