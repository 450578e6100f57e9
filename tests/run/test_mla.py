"""Multi-head latent attention in the runtime (``plait.run.modules.mla``) against transformers.

``tiny-dsv3`` (MLA with low-rank queries, the sigmoid router with a non-zero balancing bias in 4
groups of which 2 are chosen, route scale 2.5, one shared expert, the first layer dense) computes
transformers 5.24's ``DeepseekV3ForCausalLM`` logits from the same weights (mapped by name) within
``LOGIT_ATOL`` in fp32, with and without ``q_lora_rank`` and under a yarn RoPE scaling (its mscale
on the softmax scale). The runtime model's parameters are exactly the planner's count.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch

from plait.run.model import build_model, count_parameters
from plait.spec.models import get_model
from plait.spec.moe.parts import MLASpec

# fp32 logits of a 4-layer model of width 128 whose logits are O(0.1-1): the two implementations
# order their sums differently (SDPA against eager, a fused split against separate GEMMs), a few
# ulps (1.2e-7 relative) per op over ~10^3-term sums and 4 layers stay below 1e-5; the bound:
LOGIT_ATOL = 1e-4


def hf_config(spec, **extra):
    mla, moe = spec.mla, spec.moe
    return transformers.DeepseekV3Config(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.ffn_hidden,
        moe_intermediate_size=moe.expert_ffn, num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_heads, n_shared_experts=moe.n_shared, n_routed_experts=moe.n_experts,
        routed_scaling_factor=moe.route_scale, kv_lora_rank=mla.kv_lora_rank, q_lora_rank=mla.q_lora_rank or None,
        qk_rope_head_dim=mla.qk_rope_head_dim, v_head_dim=mla.v_head_dim, qk_nope_head_dim=mla.qk_nope_head_dim,
        n_group=moe.n_groups, topk_group=moe.topk_groups, num_experts_per_tok=moe.top_k,
        first_k_dense_replace=moe.first_dense, norm_topk_prob=moe.norm_topk, max_position_embeddings=spec.max_seq_len,
        rms_norm_eps=spec.norm_eps, tie_word_embeddings=False, rope_interleave=True, attention_bias=False,
        **extra)


def plait_state(hf_state: dict, spec) -> dict:
    """transformers' DeepSeek-V3 tensors under plait's names (``plait.run.modules.mla``, ``.moe``)."""
    names = {"q_a_proj": "wq_a", "q_a_layernorm": "q_norm", "q_b_proj": "wq_b", "q_proj": "wq",
             "kv_a_proj_with_mqa": "wkv_a", "kv_a_layernorm": "kv_norm", "kv_b_proj": "wkv_b", "o_proj": "wo",
             "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    out = {"tok_embeddings.weight": hf_state["model.embed_tokens.weight"],
           "norm.weight": hf_state["model.norm.weight"], "output.weight": hf_state["lm_head.weight"]}
    f = spec.moe.expert_ffn
    for name, value in hf_state.items():
        parts = name.split(".")
        if parts[:2] != ["model", "layers"]:
            continue
        prefix, rest = f"layers.{parts[2]}.", parts[3:]
        if rest[0] in ("input_layernorm", "post_attention_layernorm"):
            key = {"input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm"}[rest[0]] + ".weight"
        elif rest[0] == "self_attn":
            key = f"attention.{names[rest[1]]}.weight"
        elif rest[1] == "gate":
            key = "feed_forward." + ("router.weight" if rest[2] == "weight" else "score_bias")
        elif rest[1] == "shared_experts":
            key = f"feed_forward.shared.{names[rest[2]]}.weight"
        elif rest[1] == "experts" and rest[2] == "gate_up_proj":  # (E, 2f, h): gate rows, then up rows
            out[prefix + "feed_forward.experts.w1"] = value[:, :f].transpose(1, 2)
            out[prefix + "feed_forward.experts.w3"] = value[:, f:].transpose(1, 2)
            continue
        elif rest[1] == "experts":  # down_proj (E, h, f)
            out[prefix + "feed_forward.experts.w2"] = value.transpose(1, 2)
            continue
        else:  # a dense layer's MLP
            key = f"feed_forward.{names[rest[1]]}.weight"
        out[prefix + key] = value
    return out


def both_models(spec, seed: int = 0, **extra):
    torch.manual_seed(seed)
    hf = transformers.DeepseekV3ForCausalLM(hf_config(spec, **extra)).float().eval()
    with torch.no_grad():  # norms and the balancing bias away from their initial ones and zeros
        for name, value in hf.named_parameters():
            if "norm" in name:
                value.add_(torch.randn_like(value) * 0.1)
            elif value.dim() >= 2:
                value.normal_(0.0, 0.05)
        for module in hf.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0.0, 0.05)
    state = {**dict(hf.named_parameters()), **{k: v for k, v in hf.named_buffers()
                                               if k.endswith("e_score_correction_bias")}}
    ours = build_model(spec, "cpu").eval()
    ours.load_state_dict(plait_state(state, spec), strict=False)
    missing = {name for name, _ in ours.named_parameters()} - set(plait_state(state, spec))
    assert not missing, f"plait parameters transformers has no tensor for: {sorted(missing)}"
    ours.rope_cos, ours.rope_sin = _tables(spec)  # weights loaded above: only the RoPE tables to build
    return hf, ours


def _tables(spec):
    from plait.run.modules.layers import rope_tables
    from plait.run.modules.mla import rotary_dim

    return rope_tables(rotary_dim(spec), spec.max_seq_len, "cpu", spec.rope_theta, spec.rope_scaling,
                       max_positions=spec.max_seq_len)


def assert_same_logits(spec, **extra):
    hf, ours = both_models(spec, **extra)
    tokens = torch.randint(0, spec.vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=tokens).logits
        got = ours(tokens)
    assert want.abs().max() > 0.1  # logits that say something
    assert (got - want).abs().max().item() <= LOGIT_ATOL


def test_tiny_dsv3_matches_transformers_logits():
    assert_same_logits(get_model("tiny-dsv3"))


def test_mla_without_query_rank_matches_transformers_logits():
    spec = get_model("tiny-dsv3")
    assert_same_logits(dataclasses.replace(spec, mla=dataclasses.replace(spec.mla, q_lora_rank=0)))


def test_mla_under_yarn_scales_the_softmax_like_transformers():
    spec = get_model("tiny-dsv3")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
            "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    scaled = dataclasses.replace(spec, rope_scaling=yarn)
    assert_same_logits(scaled, rope_parameters={"rope_theta": spec.rope_theta, **yarn})


def test_the_runtime_model_holds_exactly_the_planners_parameters():
    for mla in (get_model("tiny-dsv3").mla, MLASpec(0, 32, 32, 16, 32)):
        spec = dataclasses.replace(get_model("tiny-dsv3"), mla=mla)
        assert count_parameters(build_model(spec)) == spec.total_params()
    v3 = get_model("deepseek-v3")
    small = dataclasses.replace(v3, n_layers=4, vocab=1024)  # DeepSeek-V3's widths, 4 layers (3 dense)
    assert count_parameters(build_model(small)) == small.total_params()
