"""Multi-head latent attention in parallel: ``tiny-dsv3`` trains under every parallelism as one process does.

``tiny-dsv3`` (4 layers, the first dense; MLA with query rank 64 and kv rank 32; 8 routed experts
top-2 by the bias-balanced sigmoid router in 4 groups of which 2 are chosen, route scale 2.5; one
shared expert) trains 3 AdamW steps on a global batch of 4 × 32 tokens, fp32 on gloo ranks, and is
compared with the single-process run, as tests/run/test_moe_parity.py compares ``tiny-moe``:
losses and gradient norms within tolerances.LOSS_RTOL, every parameter after the 3 steps within
the AdamW bound of tests/support/tolerances.py for tiny-dsv3's parameter count.

Layouts: tp=2 with and without sequence parallelism (the latent up-projections column-parallel by
heads, the down-projections and latent norms replicated, the shared RoPE key's gradient summed over
tp), dp=2 × ep=2 with ZeRO-3; on 4 ranks pp=2 × dp=2 × ep=2, dp=2 × tp=2 × ep=2, and that with
ZeRO-3, full activation checkpointing and the fused loss (the kind of layout plait plan ranks first
for deepseek-v3 on 2048 H100s: dp=1024, tp=2, ep=8, zero=3, ckpt=full, loss=fused), and with ckpt=mlp
(the MoE half recomputed, the latent attention's tensors kept).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import moe_tasks
import tolerances
from runtime_tasks import in_one_process, train_layout

from plait.spec.models import get_model

MODEL = "tiny-dsv3"
LOSS_RTOL = tolerances.LOSS_RTOL
PARAM_ATOL = tolerances.adamw_atol(tolerances.TINY_LR, moe_tasks.STEPS, tolerances.TINY_EPS,
                                   1.0 / math.sqrt(get_model(MODEL).total_params()),
                                   tolerances.TINY_LONGEST_SUM, tolerances.TINY_LAYERS)

LAYOUTS_2 = ["tp=2", "tp=2,sp=0", "dp=2,ep=2,zero=3"]
LAYOUTS_4 = ["pp=2,dp=2,ep=2", "dp=2,tp=2,ep=2", "dp=2,tp=2,ep=2,zero=3,ckpt=full,loss=fused",
             "dp=2,tp=2,ep=2,ckpt=mlp"]


@pytest.fixture(scope="module")
def reference():
    return in_one_process(train_layout, "dp=1", part_fields=(), **{**moe_tasks.RUN, "model": MODEL})


def assert_same_training(result: dict, reference: dict, layout: str) -> None:
    moe_tasks.assert_same_training(result, reference, layout, LOSS_RTOL, PARAM_ATOL)


def test_the_reference_trains_latent_attention(reference):
    assert reference["params"]["layers.0.attention.wkv_a.weight"].shape == (32 + 16, 128)
    assert reference["params"]["layers.1.feed_forward.experts.w1"].shape == (8, 128, 96)


@pytest.mark.parametrize("world,layouts", [(2, LAYOUTS_2), (4, LAYOUTS_4)], ids=["2-ranks", "4-ranks"])
def test_mla_layouts_match_one_process(dist_pool, reference, world, layouts):
    out = dist_pool(world).run(moe_tasks.train_model_layouts, MODEL, layouts, timeout=600)
    for index, layout in enumerate(layouts):
        assert_same_training(out[0][index], reference, layout)
        assert all(rank[index]["losses"] == out[0][index]["losses"] for rank in out), f"{layout}: ranks disagree"
