"""The planner side of the kernel knobs (``Layout.attn``, ``norm``, ``loss``): what each changes,
in bytes saved (``plait.plan.activations``, ``plait.plan.memory``) and bytes moved
(``plait.plan.kernels``), and how the search treats them."""

from __future__ import annotations

import dataclasses

from plait.plan.activations import layer_items
from plait.plan.cost import estimate_step
from plait.plan.kernels import FUSED_NORM_BYTES, UNFUSED_NORM_BYTES, layer_times
from plait.plan.memory import estimate_memory
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.search import SearchConstraints, search
from plait.spec.hardware import cluster_for_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model


def test_unfused_norm_saves_fp32_input_and_normalized_value():
    model, s, b = get_model("llama2-7b"), 4096, 2
    for arch_model in (model, dataclasses.replace(model, arch="gpt", name="gpt-like")):
        fused = layer_items(arch_model, Layout(mbs=b), s, runtime="torch")
        unfused = layer_items(arch_model, Layout(mbs=b, norm="unfused"), s, runtime="torch")
        sbh = s * b * model.hidden
        # per norm: fp32 input (4) + bf16 normalized (2) instead of the bf16 input (2)
        assert unfused["attn_norm_fp32_input"] == unfused["mlp_norm_fp32_input"] == 4 * sbh
        assert unfused["attn_norm_normalized"] == unfused["mlp_norm_normalized"] == 2 * sbh
        assert "attn_norm_input" not in unfused and fused["attn_norm_input"] == 2 * sbh
        # one fp32 rstd per token and norm (fused LayerNorm also keeps the mean)
        assert unfused["norm_stats"] == 2 * 4 * s * b
        assert fused["norm_stats"] == 2 * 4 * s * b * (2 if arch_model.arch == "gpt" else 1)


def test_checkpoints_keep_the_bf16_layer_input_whatever_the_norm():
    model = get_model("llama2-7b")
    for ckpt in ("full", "balanced"):
        fused = estimate_memory(model, cluster_for_gpu("h100", 8), JobSpec(8, 4096), Layout(dp=8, ckpt=ckpt))
        unfused = estimate_memory(model, cluster_for_gpu("h100", 8), JobSpec(8, 4096),
                                  Layout(dp=8, ckpt=ckpt, norm="unfused"))
        # only the one layer being recomputed holds the unfused chain's larger tensors
        assert 0 < unfused.activations - fused.activations < 8 * 4096 * model.hidden + 1


def test_unfused_norm_time_is_its_extra_hbm_bytes():
    model, gpu = get_model("llama2-7b"), cluster_for_gpu("h100", 8).gpu
    args = (model, gpu, DEFAULT_PARAMS, 4096.0, 4096, 1, 1, False, "flash", "bf16")
    fused, unfused = layer_times(*args, "fused"), layer_times(*args, "unfused")
    extra = 2 * (UNFUSED_NORM_BYTES["llama"] - FUSED_NORM_BYTES) * 4096 * model.hidden
    kernels = 2 * 7 * gpu.kernel_overhead
    expected = extra / (gpu.hbm_bandwidth * gpu.memory_efficiency) + kernels
    assert abs((unfused.elementwise_fwd - fused.elementwise_fwd) - expected) < 1e-12


def test_sdpa_is_planned_as_flash():
    model, cluster, job = get_model("llama2-7b"), cluster_for_gpu("h100", 8), JobSpec(64, 4096)
    flash, sdpa = Layout(dp=8, mbs=2), Layout(dp=8, mbs=2, attn="sdpa")
    assert estimate_memory(model, cluster, job, flash).total == estimate_memory(model, cluster, job, sdpa).total
    assert estimate_step(model, cluster, job, flash).step_time == estimate_step(model, cluster, job, sdpa).step_time


def test_chunked_loss_costs_a_head_gemm_and_saves_logits():
    model, cluster, job = get_model("llama3-8b"), cluster_for_gpu("h100", 8), JobSpec(64, 8192)
    plain, chunked = Layout(dp=8), Layout(dp=8, loss="fused")
    assert estimate_memory(model, cluster, job, chunked).logits < estimate_memory(model, cluster, job, plain).logits / 7
    assert estimate_step(model, cluster, job, chunked).step_time > estimate_step(model, cluster, job, plain).step_time


def test_search_chunks_the_loss_only_where_full_logits_do_not_fit():
    model, cluster, job = get_model("llama3-8b"), cluster_for_gpu("a100-40g", 8), JobSpec(8, 8192)
    result = search(model, cluster, job)
    chunked = [p for p in result.plans if p.layout.loss == "fused"]
    assert chunked, "no layout needed the chunked loss"
    for plan in chunked[:20]:
        full = dataclasses.replace(plan.layout, loss="unfused")
        assert not estimate_memory(model, cluster, job, full).fits, plan.layout
    # without offload, the chunked loss is what makes those layouts fit
    pinned = search(model, cluster, job, SearchConstraints(fixed=(("loss", "unfused"),), allow_offload=False))
    free = search(model, cluster, job, SearchConstraints(allow_offload=False))
    assert all(p.layout.loss == "unfused" for p in pinned.plans)
    assert len(pinned.plans) < len(free.plans)
