"""The dropless dispatcher's per-MoE-layer synchronisation (``plait.plan.moe.sync``), part by part."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from plait.plan import comm
from plait.plan.moe import sync as S
from plait.plan.moe.sync import moe_kernels, moe_sync_layer
from plait.plan.params import DEFAULT_PARAMS
from plait.plan.terms.expert import ep_microbatch
from plait.spec.hardware import get_cluster
from plait.spec.layout import Layout
from plait.spec.models import MODELS
from plait.spec.moe.layout import expert_groups

MIXTRAL = MODELS["mixtral-8x7b"]  # 8 experts
CLUSTER = get_cluster("dgx-h100", 64)
GPU = CLUSTER.gpu
CPU = dataclasses.replace(GPU, name="cpu", element_bytes=4.0)  # a CPU profile computes in fp32


def _eager_kernels(gemms: tuple[float, float]) -> tuple[float, float]:
    return tuple(S.ROUTER_KERNELS[w] + S.PREPROCESS_KERNELS[w] + S.PERMUTE_KERNELS[w] + S.EXPERT_FIXED_KERNELS[w]
                 + gemms[w] for w in (0, 1))


def test_launches_are_the_counted_kernels_times_the_launch_time():
    for ep in (1, 2, 8):
        lay = Layout.parse(f"dp=64,ep={ep}")
        forward, backward = _eager_kernels(S.PROJECTION_GEMMS)  # plait on a GPU: grouped, whatever ep
        assert moe_kernels(MIXTRAL, lay, DEFAULT_PARAMS, "torch", GPU) == pytest.approx((forward, backward))
        parts = moe_sync_layer(MIXTRAL, CLUSTER, lay, DEFAULT_PARAMS)
        assert parts.launches == pytest.approx((forward * DEFAULT_PARAMS.moe_launch_s,
                                                backward * DEFAULT_PARAMS.moe_launch_s))
        assert parts.sync == (S.SYNC_S, 0.0)  # one device-to-host copy, in the forward


def test_expert_gemms_are_per_local_expert_for_megatron_and_plait_on_a_cpu_grouped_for_plait_on_a_gpu():
    """Transformer Engine issues a GEMM per local expert (fc1, fc2), plait's CPU loop one per local
    expert and projection; plait's bf16 grouped GEMM one per projection at any ep, and with fp8
    torchao's casts around each (tests/run/test_moe_block.py counts the runtime's GEMMs)."""
    for ep in (1, 2, 8):
        lay, local = Layout.parse(f"dp=64,ep={ep}"), 8 / ep
        megatron = moe_kernels(MIXTRAL, lay, DEFAULT_PARAMS, "megatron-core", GPU)
        assert megatron == pytest.approx(_eager_kernels(tuple(local * k for k in S.EXPERT_KERNELS)))
        cpu = moe_kernels(MIXTRAL, lay, DEFAULT_PARAMS, "torch", CPU)
        assert cpu == pytest.approx(_eager_kernels(tuple(local * k for k in S.PROJECTION_GEMMS)))
        fp8 = S.expert_gemm_kernels(MIXTRAL, Layout.parse(f"dp=64,ep={ep},precision=fp8"), "torch", GPU)
        assert fp8 == pytest.approx(tuple(S.PROJECTION_GEMMS[w] + 3 * S.FP8_GROUPED_KERNELS[w] for w in (0, 1)))
    assert S.expert_gemm_kernels(MIXTRAL, Layout.parse("dp=64,precision=mxfp8"), "torch", GPU) == S.PROJECTION_GEMMS
    # no grouped GEMM of torch's own below Hopper, nor for rows that are not 16-byte multiples: the loop
    per_expert = tuple(4 * k for k in S.PROJECTION_GEMMS)  # ep=2: 4 local experts
    a100 = get_cluster("dgx-a100", 64).gpu
    assert S.expert_gemm_kernels(MIXTRAL, Layout.parse("dp=64,ep=2"), "torch", a100) == per_expert
    odd = replace(MIXTRAL, moe=replace(MIXTRAL.moe, expert_ffn=14340))  # 28,680-byte bf16 rows
    assert S.expert_gemm_kernels(odd, Layout.parse("dp=64,ep=2"), "torch", GPU) == per_expert
    assert S.expert_gemm_kernels(MIXTRAL, Layout.parse("dp=64,ep=2"), "torch", GPU) == S.PROJECTION_GEMMS
    many = MODELS["qwen3-30b-a3b"]  # 128 experts: at ep=1 the grouped GEMM launches what it does at ep=8
    assert moe_kernels(many, Layout.parse("dp=8"), DEFAULT_PARAMS, "torch", GPU) == \
        moe_kernels(many, Layout.parse("dp=8,ep=8"), DEFAULT_PARAMS, "torch", GPU)


def test_chunked_launches_every_chunk_s_exchange_and_expert_kernels_again():
    """plait's moe_overlap=chunked: the router and the preprocessing once, the permutation/exchange,
    the experts' fixed kernels and the grouped GEMMs once per chunk (plait.run.parallel.expert_overlap;
    tests/run/test_moe_overlap counts the runtime's expert GEMMs per chunk); at ep=1 the runtime runs
    it as none; Megatron's 1F1B overlap, read as chunked, repeats nothing."""
    from plait.plan.moe.timing import MOE_CHUNKS

    for ep in (2, 8):
        plain = moe_kernels(MIXTRAL, Layout.parse(f"dp=64,ep={ep}"), DEFAULT_PARAMS, "torch", GPU)
        chunked = moe_kernels(MIXTRAL, Layout.parse(f"dp=64,ep={ep},moe_overlap=chunked"), DEFAULT_PARAMS, "torch", GPU)
        for way in (0, 1):
            per_chunk = S.PERMUTE_KERNELS[way] + S.EXPERT_FIXED_KERNELS[way] + S.PROJECTION_GEMMS[way]
            assert chunked[way] - plain[way] == pytest.approx((MOE_CHUNKS - 1) * per_chunk)
        shared = moe_kernels(MIXTRAL, Layout.parse(f"dp=64,ep={ep},moe_overlap=shared"), DEFAULT_PARAMS, "torch", GPU)
        assert shared == plain
    megatron = Layout.parse("dp=64,ep=8,moe_overlap=chunked")
    assert moe_kernels(MIXTRAL, megatron, DEFAULT_PARAMS, "megatron-core", GPU) == \
        moe_kernels(MIXTRAL, Layout.parse("dp=64,ep=8"), DEFAULT_PARAMS, "megatron-core", GPU)
    assert moe_kernels(MIXTRAL, Layout.parse("dp=64,moe_overlap=chunked"), DEFAULT_PARAMS, "torch", GPU) == \
        moe_kernels(MIXTRAL, Layout.parse("dp=64"), DEFAULT_PARAMS, "torch", GPU)


def test_ep1_has_no_token_count_exchange_and_ep_gt_1_gathers_the_counts():
    assert moe_sync_layer(MIXTRAL, CLUSTER, Layout.parse("dp=64"), DEFAULT_PARAMS).counts == (0.0, 0.0)
    lay = Layout.parse("dp=64,ep=8")
    group = expert_groups(lay, CLUSTER.gpus_per_node, "torch")["ep"]
    expected = comm.all_gather(CLUSTER, group, S.COUNT_BYTES * 8 * 8)
    parts = moe_sync_layer(MIXTRAL, CLUSTER, lay, DEFAULT_PARAMS)
    assert parts.counts == (pytest.approx(expected), 0.0)
    assert expected > 0.0


def test_router_graphs_remove_exactly_the_router_and_preprocessing_launches():
    lay = Layout.parse("dp=64,ep=8")
    eager = moe_sync_layer(MIXTRAL, CLUSTER, lay, DEFAULT_PARAMS)
    graphed = moe_sync_layer(MIXTRAL, CLUSTER, lay, replace(DEFAULT_PARAMS, moe_router_graphed=1.0))
    for way in (0, 1):
        removed = S.ROUTER_KERNELS[way] + S.PREPROCESS_KERNELS[way] - S.GRAPH_LAUNCHES[way]
        assert eager.launches[way] - graphed.launches[way] == pytest.approx(removed * DEFAULT_PARAMS.moe_launch_s)
    assert (graphed.counts, graphed.sync) == (eager.counts, eager.sync)


def test_a_whole_iteration_graph_removes_every_launch_and_the_sync_not_the_exchange():
    lay = Layout.parse("dp=64,ep=8")
    eager = moe_sync_layer(MIXTRAL, CLUSTER, lay, DEFAULT_PARAMS)
    graphed = moe_sync_layer(MIXTRAL, CLUSTER, lay, replace(DEFAULT_PARAMS, moe_layer_graphed=1.0))
    assert graphed.launches == (0.0, 0.0) and graphed.sync == (0.0, 0.0)
    assert graphed.counts == eager.counts and graphed.total == pytest.approx(sum(eager.counts))


def test_the_step_charges_each_moe_layer_once_and_the_recomputed_forward_again():
    layers = MIXTRAL.n_layers
    lay = Layout.parse("dp=64,ep=8,ckpt=full")
    parts = moe_sync_layer(MIXTRAL, CLUSTER, lay, DEFAULT_PARAMS)
    _, kept = ep_microbatch(MIXTRAL, CLUSTER, lay, 4096, 4096, layers, 0, DEFAULT_PARAMS)
    _, recomputed = ep_microbatch(MIXTRAL, CLUSTER, lay, 4096, 4096, layers, layers, DEFAULT_PARAMS)
    assert kept == pytest.approx(layers * parts.total)
    assert recomputed - kept == pytest.approx(layers * parts.forward)
    assert ep_microbatch(MODELS["llama3-8b"], CLUSTER, Layout.parse("dp=64"), 4096, 4096, 32, 0,
                         DEFAULT_PARAMS) == (0.0, 0.0)
