"""Memory truth in fp32: the bytes one runtime layer saves for its backward when it computes in
fp32 (plait's runtime on a CPU), counted with saved-tensor hooks, against the planner's items
priced with ``element_bytes=4`` (``plait.plan.activations.layer_items``) - directly, without the
bf16 conversions of tests/run/test_memory_truth.py.

The planner's fp32 items include the CPU kernel difference: the composite CPU RMSNorm saves its
input (``*_norm_input``) and also its fp32 normalized value x·rstd (``rmsnorm_normalized``, one
more ``4·s·b·h`` per norm; none under ``balanced`` and ``full``, which recompute the norms, and the
attention norm's only under ``mlp``).
LayerNorm's CPU statistics are in the input dtype: fp32, as the planner counts them. In fp32 the
eager softmax's output needs no cast, so there is no second copy (``attn_probs``).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from activation_count import measure_layer

from plait.plan.activations import kept_items
from plait.spec.layout import Layout
from plait.spec.models import get_model

SEQ, MBS = 64, 2
FP32 = 4
CASES = [(model, policy, attn) for model in ("tiny", "tiny-gpt") for policy in ("none", "selective", "balanced", "mlp", "full")
         for attn in ("flash", "eager")]


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_fp32_saved_bytes_match_planner_at_four_bytes(case):
    name, policy, attn = case
    spec = get_model(name)
    layout = Layout(mbs=MBS, ckpt=policy, attn=attn)
    result = measure_layer(spec, layout, SEQ, MBS, dtype=torch.float32)
    items = kept_items(spec, layout, SEQ, mbs=MBS, runtime="torch", element_bytes=FP32)
    expected = sum(items.values())
    if spec.arch == "llama" and "norm_stats" in items:  # the norms ran (mlp: the attention's only): their x·rstd
        assert items["rmsnorm_normalized"] == (1 if policy == "mlp" else 2) * FP32 * SEQ * MBS * spec.hidden
    assert result["saved"] == result["live"]
    assert result["saved"] == expected, (items, [r for r in result["records"] if r.kind == "act"])


# DeepSeek-V3's latent attention over a dense MLP (as tests/run/test_memory_truth.py): its latent norms'
# composite also saves x·rstd (``rmsnorm_normalized``); V as wide as Q and K for the fused SDPA kernel
MLA = dataclasses.replace(get_model("tiny-dsv3"), name="tiny-mla", moe=None)
MLA_NO_Q = dataclasses.replace(MLA, name="tiny-mla-no-q", mla=dataclasses.replace(MLA.mla, q_lora_rank=0))
MLA_EVEN = dataclasses.replace(MLA, name="tiny-mla-even", mla=dataclasses.replace(MLA.mla, qk_nope_head_dim=16))
MLA_CASES = [(MLA, "eager"), (MLA_NO_Q, "eager"), (MLA_EVEN, "flash")]


@pytest.mark.parametrize("policy", ("none", "selective", "balanced", "mlp", "full"))
@pytest.mark.parametrize("case", MLA_CASES, ids=[f"{spec.name}-{attn}" for spec, attn in MLA_CASES])
def test_fp32_mla_saved_bytes_match_planner_at_four_bytes(case, policy):
    spec, attn = case
    layout = Layout(mbs=MBS, ckpt=policy, attn=attn)
    result = measure_layer(spec, layout, SEQ, MBS, dtype=torch.float32)
    items = kept_items(spec, layout, SEQ, mbs=MBS, runtime="torch", element_bytes=FP32)
    assert result["saved"] == result["live"] == sum(items.values()), (items, [r for r in result["records"]
                                                                              if r.kind == "act"])


def test_four_byte_items_are_the_two_byte_ones_rescaled():
    """Every compute-dtype item doubles from bf16 to fp32; fp32 statistics and 1-byte masks stay."""
    spec = get_model("tiny")
    layout = Layout(mbs=MBS)
    bf16 = kept_items(spec, layout, SEQ, mbs=MBS, runtime="torch")
    fp32 = kept_items(spec, layout, SEQ, mbs=MBS, runtime="torch", element_bytes=FP32)
    for item, value in bf16.items():
        assert fp32[item] == (value if item in ("attn_lse", "norm_stats") else 2 * value), item
    assert set(fp32) - set(bf16) == {"rmsnorm_normalized"}  # the CPU's composite RMSNorm
