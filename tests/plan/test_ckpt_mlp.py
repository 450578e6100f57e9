"""``ckpt=mlp`` in the planner: its kept bytes and its recomputation are built from the formulas' own
parts (the attention half's items and the MLP input; the MLP half's GEMMs, element-wise work, half of
the TP collectives and, for MoE layers, the dispatch and combine again), and both sit strictly between
``none`` and ``full`` for dense (SwiGLU, GELU), MoE (shared experts) and MLA models under tp, sp and cp."""

from __future__ import annotations

import pytest

from plait.plan.activations import MLP_HALF_ITEMS, kept_items, layer_items, residual_bytes
from plait.plan.cost import _groups, _layer_times, estimate_step
from plait.plan.flops import recompute_flops_per_token
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.terms.expert import ep_microbatch
from plait.plan.terms.recompute import recompute_layer
from plait.plan.terms.tensor import tp_layer
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

SEQ = 16384
MODELS = ("llama3-8b", "gpt3-175b", "qwen3-30b-a3b", "deepseek-v3")
LAYOUTS = ("dp=8,mbs=1", "dp=4,tp=2,mbs=1", "dp=4,tp=2,sp=0,mbs=1", "dp=2,tp=2,cp=2,mbs=1")
RUNTIMES = ("torch", "megatron", "megatron-core")


def layout_for(model, text: str, ckpt: str) -> Layout:
    return Layout.parse(f"{text},ckpt={ckpt}" + (",ep=2" if model.moe is not None else ""))


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("text", LAYOUTS)
@pytest.mark.parametrize("name", MODELS)
def test_mlp_keeps_the_attention_half_and_the_mlp_input(name, text, runtime):
    model = get_model(name)
    lay = layout_for(model, text, "mlp")
    items = layer_items(model, lay, SEQ, runtime=runtime)
    kept = kept_items(model, lay, SEQ, runtime=runtime)
    residual = residual_bytes(model, lay, SEQ)
    dropped = sum(v for k, v in items.items() if k in MLP_HALF_ITEMS)
    assert dropped > residual  # the MLP's internals outweigh its input
    assert not set(kept) & (MLP_HALF_ITEMS - {"mlp_norm_input"})
    assert kept["mlp_norm_input"] == residual
    assert kept["norm_stats"] == items["norm_stats"] / 2  # one norm of two runs outside the checkpoint
    attention_half = {k: v for k, v in items.items() if k not in MLP_HALF_ITEMS and k != "norm_stats"}
    assert {k: v for k, v in kept.items() if k not in ("mlp_norm_input", "norm_stats")} == attention_half
    none = sum(kept_items(model, layout_for(model, text, "none"), SEQ, runtime=runtime).values())
    full = sum(kept_items(model, layout_for(model, text, "full"), SEQ, runtime=runtime).values())
    assert full < sum(kept.values()) < none
    assert sum(kept.values()) == pytest.approx(none - dropped - items["norm_stats"] / 2 + residual, rel=1e-12)


@pytest.mark.parametrize("text", LAYOUTS)
@pytest.mark.parametrize("name", MODELS)
def test_mlp_recomputes_the_mlp_half_forward(name, text):
    model, cluster, job = get_model(name), get_cluster("dgx-h100", 8), JobSpec(64, SEQ)
    lay = layout_for(model, text, "mlp")
    tokens = SEQ / lay.cp * lay.mbs
    times = _layer_times(model, cluster, job, lay, tokens, DEFAULT_PARAMS, "torch")
    act_bytes = cluster.gpu.element_bytes * tokens * model.hidden
    one_way, _ = tp_layer(cluster, _groups(lay, cluster.gpus_per_node)["tp"], lay, act_bytes, DEFAULT_PARAMS)
    mlp = recompute_layer(lay, times, one_way)
    assert mlp == times.mlp_gemm_fwd + times.mlp_elementwise_fwd + one_way / 2
    assert 0 < times.mlp_gemm_fwd < times.gemm_fwd and 0 < times.mlp_elementwise_fwd <= times.elementwise_fwd
    full = recompute_layer(layout_for(model, text, "full"), times, one_way)
    assert 0 < mlp < full
    assert full - mlp >= times.attn_fwd  # the attention core is never recomputed under mlp
    steps = {ckpt: estimate_step(model, cluster, job, layout_for(model, text, ckpt)) for ckpt in ("none", "mlp", "full")}
    assert steps["none"].recompute == 0 < steps["mlp"].recompute < steps["full"].recompute
    assert steps["none"].step_time < steps["mlp"].step_time < steps["full"].step_time
    flops = {ckpt: recompute_flops_per_token(model, layout_for(model, text, ckpt), SEQ) for ckpt in ("none", "mlp", "full")}
    assert flops["none"] == 0 < flops["mlp"] < flops["full"]


@pytest.mark.parametrize("name", ("qwen3-30b-a3b", "deepseek-v3"))
def test_mlp_repeats_the_expert_all_to_all_as_full_does(name):
    """Megatron's ``moe`` recompute module checkpoints the token dispatcher with the experts: the forward's
    dispatch and combine run again in the backward under mlp, exactly as under full."""
    model, cluster = get_model(name), get_cluster("dgx-h100", 16)
    tokens, layers = SEQ * 1.0, 8
    a2a = {ckpt: ep_microbatch(model, cluster, Layout.parse(f"dp=16,ep=8,ckpt={ckpt}"), tokens, SEQ, layers, layers,
                               DEFAULT_PARAMS)[0] for ckpt in ("none", "selective", "mlp", "full")}
    assert a2a["none"] == a2a["selective"] < a2a["mlp"] == a2a["full"]
