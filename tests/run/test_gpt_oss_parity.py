"""GPT-OSS in parallel: ``tiny-gpt-oss`` trains under every parallelism as one process does.

``tiny-gpt-oss`` (4 layers; sinks, 16-token windows on the even layers, Q/K/V/O biases; 8 experts
top-2 with router and expert biases and the clamped SwiGLU) trains 3 AdamW steps on a global batch
of 4 × 32 tokens, fp32 on gloo ranks, with the eager attention kernel (the sinks' kernel on the
CPU), and is compared with the single-process run as tests/run/test_mla_parity.py compares
``tiny-dsv3``: losses and gradient norms within tolerances.LOSS_RTOL, every parameter (the expert
biases, sharded on dim 0 by ep with their weights, included) after the 3 steps within the AdamW
bound of tests/support/tolerances.py for tiny-gpt-oss's parameter count.

Layouts (the MLA parity set): dp=2 × ep=2 with ZeRO-3, tp=2 with and without sequence parallelism
and dp=2 × ep=2 with ckpt=mlp (the MoE half recomputed) on 2 ranks; pp=2 × dp=2 × ep=2 and dp=2 ×
tp=2 × ep=2, without and with ZeRO-3, on 4 ranks, each world size one pool task.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import moe_tasks
import tolerances
from runtime_tasks import in_one_process, train_layout

from plait.spec.models import get_model

MODEL = "tiny-gpt-oss"
PARAM_ATOL = tolerances.adamw_atol(tolerances.TINY_LR, moe_tasks.STEPS, tolerances.TINY_EPS,
                                   1.0 / math.sqrt(get_model(MODEL).total_params()),
                                   tolerances.TINY_LONGEST_SUM, tolerances.TINY_LAYERS)
KERNEL = ",attn=eager"  # sinks: attn=flex or eager (rule runtime-attn-softcap); flex runs eager on the CPU

LAYOUTS_2 = ["dp=2,ep=2,zero=3" + KERNEL, "tp=2" + KERNEL, "tp=2,sp=0" + KERNEL, "dp=2,ep=2,ckpt=mlp" + KERNEL]
LAYOUTS_4 = ["pp=2,dp=2,ep=2" + KERNEL, "dp=2,tp=2,ep=2" + KERNEL, "dp=2,tp=2,ep=2,zero=3" + KERNEL]


@pytest.fixture(scope="module")
def reference():
    return in_one_process(train_layout, "dp=1" + KERNEL, part_fields=(), **{**moe_tasks.RUN, "model": MODEL})


def test_the_reference_trains_biased_experts(reference):
    params = reference["params"]
    assert params["layers.0.feed_forward.experts.w1_bias"].shape == (8, 96)
    assert params["layers.0.feed_forward.experts.w2_bias"].shape == (8, 128)
    assert params["layers.0.feed_forward.experts.w2_bias"].abs().max() > 0  # moved from zero by training
    assert params["layers.0.feed_forward.router.bias"].abs().max() > 0
    assert params["layers.0.attention.sinks"].shape == (4,)


@pytest.mark.parametrize("world,layouts", [(2, LAYOUTS_2), (4, LAYOUTS_4)], ids=["2-ranks", "4-ranks"])
def test_gpt_oss_layouts_match_one_process(dist_pool, reference, world, layouts):
    out = dist_pool(world).run(moe_tasks.train_model_layouts, MODEL, layouts, timeout=600)
    for index, layout in enumerate(layouts):
        moe_tasks.assert_same_training(out[0][index], reference, layout, tolerances.LOSS_RTOL, PARAM_ATOL)
        assert all(rank[index]["losses"] == out[0][index]["losses"] for rank in out), f"{layout}: ranks disagree"
