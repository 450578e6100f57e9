"""GPT-OSS in the runtime (``plait.run.modules.experts``, ``.moe``) against transformers.

* ``tiny-gpt-oss`` (sinks, 16-token windows on the even layers, Q/K/V/O biases, 8 experts top-2
  with router and expert biases and the clamped SwiGLU) computes transformers 5.24's
  ``GptOssForCausalLM`` logits, from the same weights moved through plait's GPT-OSS weight table
  (``plait.run.checkpoint.hf.gpt_oss``: the fused, interleaved gate/up), within ``LOGIT_ATOL`` in
  fp32; its config is the one ``plait export`` writes for the preset.
* The experts alone equal transformers' ``GptOssExperts`` on inputs large enough that both clamps
  bite (gate above the limit, up on both sides), also through ``torch._grouped_mm``.
* The runtime model's parameters are exactly the planner's count (the preset and GPT-OSS-120B's
  widths on the meta device).
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tolerances
import torch

from plait.run.checkpoint.hf.load import plait_state_from_hf
from plait.run.model import apply_kernels, build_model, count_parameters, init_weights
from plait.run.modules.experts import OAI_LIMIT, GroupedExperts
from plait.spec.hf.writer import hf_config_of
from plait.spec.models import get_model

# fp32 logits O(0.1-1) of a 4-layer width-128 model: the two order their sums differently (eager
# attention with the sink column against plait's eager kernel, per-expert GEMMs in another order),
# a few ulps (1.2e-7 relative) per op over ~10^3-term sums and 4 layers stay below 1e-5; the bound:
LOGIT_ATOL = 1e-4


def both_models(spec, seed: int = 0):
    body = {k: v for k, v in hf_config_of(spec).items() if k != "model_type"}
    config = transformers.AutoConfig.for_model("gpt_oss", **body, attn_implementation="eager")
    torch.manual_seed(seed)
    hf = transformers.GptOssForCausalLM(config).float().eval()
    with torch.no_grad():  # every norm, bias and sink away from its initial value
        for name, value in hf.named_parameters():
            if "norm" in name:
                value.add_(torch.randn_like(value) * 0.1)
            elif value.dim() >= 2 and not name.endswith("_bias"):
                value.normal_(0.0, 0.05)
            else:  # biases (router, experts, attention) and sinks
                value.normal_(0.0, 0.1)
    ours = build_model(spec, "cpu").eval()
    init_weights(ours, spec, 0, "cpu")  # the RoPE tables; every parameter is then transformers'
    state = plait_state_from_hf(dict(hf.state_dict()), dataclasses.replace(spec, family="gpt_oss"))
    missing = {name for name, _ in ours.named_parameters()} - set(state)
    assert not missing, f"plait parameters transformers has no tensor for: {sorted(missing)}"
    ours.load_state_dict(state, strict=False)
    apply_kernels(ours, "eager", "fused")
    return hf, ours


def test_tiny_gpt_oss_matches_transformers_logits():
    spec = get_model("tiny-gpt-oss")
    hf, ours = both_models(spec)
    tokens = torch.randint(0, spec.vocab, (2, 40), generator=torch.Generator().manual_seed(1))  # 40 > window 16
    with torch.no_grad():
        want = hf(input_ids=tokens).logits
        got = ours(tokens)
    assert want.abs().max() > 0.1  # logits that say something
    assert (got - want).abs().max().item() <= LOGIT_ATOL


@pytest.mark.parametrize("grouped", [False, True])
def test_clamped_biased_experts_equal_transformers_experts(grouped):
    if grouped and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    config = transformers.GptOssConfig(hidden_size=32, intermediate_size=16, num_local_experts=4,
                                       num_experts_per_tok=1)
    theirs = transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts(config)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in theirs.parameters():  # weights of std 1: gate and up reach ~±20, past the limit 7
            param.copy_(torch.randn(param.shape, generator=generator))
    ours = GroupedExperts(4, 32, 16, bias=True, activation="oai")
    with torch.no_grad():
        ours.w1.copy_(theirs.gate_up_proj[..., 0::2])
        ours.w3.copy_(theirs.gate_up_proj[..., 1::2])
        ours.w1_bias.copy_(theirs.gate_up_proj_bias[..., 0::2])
        ours.w3_bias.copy_(theirs.gate_up_proj_bias[..., 1::2])
        ours.w2.copy_(theirs.down_proj)
        ours.w2_bias.copy_(theirs.down_proj_bias)
    counts = [3, 0, 5, 4]
    x = torch.randn(sum(counts), 32, generator=generator)
    expert = torch.repeat_interleave(torch.arange(4), torch.tensor(counts))
    gate_up = torch.einsum("nh,nhf->nf", x, theirs.gate_up_proj[expert]) + theirs.gate_up_proj_bias[expert]
    assert gate_up[:, 0::2].max() > OAI_LIMIT and gate_up[:, 1::2].min() < -OAI_LIMIT  # both clamps bite
    with torch.no_grad():  # transformers' experts with one expert per row and weight 1
        want = theirs(x, expert.unsqueeze(1), torch.ones(x.shape[0], 1))
        got = ours(x, counts) if not grouped else _grouped(ours, x, counts)
    # sums of 32 and 16 products of O(1)-O(10) terms: the reduction bound of the widest sum, on the scale
    assert (got - want).abs().max().item() <= tolerances.reduction_rtol(32) * 4 * want.abs().max().item()


def _grouped(experts, x, counts):
    from plait.run.modules.experts import expert_forward

    return expert_forward(x, counts, *experts.local_weights(), grouped=True, biases=experts.local_biases(),
                          activation="oai")


def test_the_runtime_model_holds_exactly_the_planners_parameters():
    spec = get_model("tiny-gpt-oss")
    assert count_parameters(build_model(spec)) == spec.total_params()
    oss = get_model("gpt-oss-120b")
    small = dataclasses.replace(oss, n_layers=2, vocab=1024)  # GPT-OSS-120B's widths, 2 layers
    assert count_parameters(build_model(small)) == small.total_params()
