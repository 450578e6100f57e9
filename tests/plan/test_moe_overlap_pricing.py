"""The planner's moe_overlap pricing against the mechanism plait.run.parallel.expert_overlap runs.

shared: only the dispatch (and, in the backward, its reverse) hides behind the shared experts;
the combine stays exposed, so at most one of the two all-to-alls is hidden. chunked: MOE_CHUNKS
all-to-alls of a chunk each, the first chunk's dispatch and the last one's combine never hidden,
the expert GEMMs split into smaller grouped GEMMs that cost at least as much as one, and the rows
gathered into chunk order and back.
"""

from __future__ import annotations

import pytest

from plait.plan.moe.timing import MOE_CHUNKS, expert_a2a, moe_comm_layer, moe_mlp_times, routed_expert_gemms
from plait.plan.moe.memory import routed_tokens
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import get_cluster
from plait.spec.layout import Layout
from plait.spec.models import MODELS

CLUSTER = get_cluster("dgx-h100", 64)
SEQ = 4096


@pytest.mark.parametrize("name,base", [("deepseek-v3", "dp=64,ep=64,mbs=1"), ("qwen3-30b-a3b", "dp=64,ep=8,mbs=2"),
                                       ("mixtral-8x7b", "dp=8,tp=8,ep=8,mbs=2")])
def test_overlap_hides_what_the_runtime_can_hide(name, base):
    model, params = MODELS[name], DEFAULT_PARAMS
    lay = {mode: Layout.parse(f"{base},moe_overlap={mode}") for mode in ("none", "shared", "chunked")}
    tokens = lay["none"].mbs * SEQ  # one micro-batch on a rank (plait.plan.cost)
    a2a = expert_a2a(model, CLUSTER, lay["none"], SEQ, params)
    _, shared, experts = moe_mlp_times(model, CLUSTER.gpu, params, lay["none"], tokens, SEQ)
    none = moe_comm_layer(model, CLUSTER, lay["none"], tokens, SEQ, params)
    assert none == (2 * a2a, 2 * a2a)
    # shared: the dispatch hidden up to the shared experts' GEMMs (twice them in the backward)
    got = moe_comm_layer(model, CLUSTER, lay["shared"], tokens, SEQ, params)
    for factor, exposed in zip((1.0, 2.0), got):
        hidden = min(a2a, factor * shared)
        assert exposed == pytest.approx(2 * a2a - hidden * (1 - params.overlap_slowdown))
        assert exposed >= a2a  # the combine is never hidden
    # chunked: at least the first dispatch and the last combine of a chunk each, plus the split's cost
    chunk = expert_a2a(model, CLUSTER, lay["chunked"], SEQ, params, fraction=1.0 / MOE_CHUNKS)
    _, routed = routed_tokens(model, lay["chunked"], SEQ, load=params.moe_load_imbalance)
    split = routed_expert_gemms(model, CLUSTER.gpu, params, lay["chunked"], routed, MOE_CHUNKS)
    assert split >= experts and MOE_CHUNKS * chunk >= a2a
    got = moe_comm_layer(model, CLUSTER, lay["chunked"], tokens, SEQ, params)
    gpu = CLUSTER.gpu
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
    regroup = 4.0 * gpu.element_bytes * routed * model.hidden / bandwidth
    # the backward adds the chunks' expert weight gradients: two reads and a write of each of the
    # rank's three matrices per expert, MOE_CHUNKS - 1 times
    matrices = model.moe.n_experts / lay["chunked"].ep * 3 * model.hidden * model.moe.expert_ffn / lay["chunked"].etp
    grad_sums = (MOE_CHUNKS - 1) * 3 * gpu.element_bytes * matrices / bandwidth
    assert grad_sums > 0.0
    for factor, exposed in zip((1.0, 2.0), got):
        sums = grad_sums if factor > 1.0 else 0.0
        assert exposed >= 2 * chunk + factor * (split - experts) + regroup + sums - 1e-12
        assert exposed <= 2 * MOE_CHUNKS * chunk + factor * (split - experts) + regroup + sums + 1e-12


def test_fp8_experts_pay_their_weight_preparation_once_per_call_in_plait_s_runtime(monkeypatch):
    """plait's fp8 experts cast their weights for torchao's grouped GEMM at every call
    (``FP8_WEIGHT_PREP_BYTES`` per local expert parameter): once per layer and micro-batch in the
    layer's element-wise time (forward and backward apart, weighted by the share of MoE layers), and
    again for every extra chunk under moe_overlap=chunked; nothing in bf16 or for Megatron-Core."""
    from plait.plan.memo import clear_caches
    from plait.plan.moe import timing as T
    from plait.spec.moe.parts import moe_layer_count

    model, gpu, tokens = MODELS["deepseek-v3"], CLUSTER.gpu, SEQ
    fp8 = Layout.parse("dp=64,ep=64,mbs=1,precision=fp8")
    chunked = Layout.parse("dp=64,ep=64,mbs=1,precision=fp8,moe_overlap=chunked")
    prep = T.fp8_weight_prep(model, gpu, fp8)
    weights = 256 / 64 * 3 * model.hidden * model.moe.expert_ffn  # 4 local experts, three matrices each
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
    assert prep == pytest.approx(tuple(b * weights / bandwidth for b in T.FP8_WEIGHT_PREP_BYTES))
    assert T.fp8_weight_prep(model, gpu, Layout.parse("dp=64,ep=64,mbs=1")) == (0.0, 0.0)
    assert T.fp8_weight_prep(model, gpu, fp8, "megatron-core") == (0.0, 0.0)

    def priced():
        clear_caches()
        layer = T.moe_layer_times(model, gpu, DEFAULT_PARAMS, fp8, tokens, SEQ)
        comm = T.moe_comm_layer(model, CLUSTER, chunked, tokens, SEQ, DEFAULT_PARAMS)
        return layer.elementwise_fwd, layer.elementwise_bwd, layer.mlp_elementwise_fwd, comm

    with_prep = priced()
    monkeypatch.setattr(T, "FP8_WEIGHT_PREP_BYTES", (0.0, 0.0))
    without = priced()
    clear_caches()
    share = moe_layer_count(model) / model.n_layers
    assert with_prep[0] - without[0] == pytest.approx(share * prep[0])
    assert with_prep[1] - without[1] == pytest.approx(share * prep[1])
    assert with_prep[2] - without[2] == pytest.approx(share * prep[0])
    for way in (0, 1):
        assert with_prep[3][way] - without[3][way] == pytest.approx((MOE_CHUNKS - 1) * prep[way])
