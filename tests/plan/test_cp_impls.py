"""Each context-parallel kernel priced as plait's runtime runs it (``plait.plan.context``,
``plait.plan.kernels``): the work its attention does and which of its collectives hide behind it.
The runtime's side - the collectives and bytes, the score elements of the ring kernel - is counted
in tests/run/test_context_parallel.py."""

from __future__ import annotations

import dataclasses

import pytest

from plait.plan import comm
from plait.plan.context.exchange import FP32, cp_exchange, exchanges
from plait.plan.cost import _groups, estimate_step
from plait.plan.kernels import RING_MASK_BYTES, RING_SCORE_BYTES, gemm_time, layer_times, ring_keys
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

MODEL = get_model("llama3-8b")
CLUSTER = dataclasses.replace(get_cluster("dgx-h100").with_gpus(8), gpus_per_node=8)
# no launch overhead and no small-kernel penalty: attention time is exactly FLOPs / rate
PURE = dataclasses.replace(CLUSTER.gpu, kernel_overhead=0.0)
PARAMS = dataclasses.replace(DEFAULT_PARAMS, gemm_half_flops=0.0)
SEQ = 8192


def times(cp_impl: str, cp: int = 4, tokens: float = SEQ / 4):
    return layer_times(MODEL, PURE, PARAMS, tokens, SEQ, 1, cp, False, "flash", "bf16", cp_impl=cp_impl)


def test_allgather_computes_the_whole_square_the_others_half_of_it():
    causal, gathered = times("torch"), times("allgather")
    assert times("ulysses").attn_fwd == causal.attn_fwd
    # SDPA with an explicit mask computes every key: seq keys per query against (seq + 1) / 2
    assert gathered.attn_fwd / causal.attn_fwd == pytest.approx(SEQ / ((SEQ + 1) / 2), rel=1e-12)
    assert gathered.attn_bwd / causal.attn_bwd == pytest.approx(SEQ / ((SEQ + 1) / 2), rel=1e-12)


def test_ring_is_priced_as_fp32_blocks_whatever_attn_says():
    cp, tokens = 4, SEQ / 4
    local = SEQ / cp
    assert ring_keys(SEQ, cp) == local + (cp - 1) * local / 2  # diagonal square, then half blocks
    ring = times("ring", cp, tokens)
    eager = layer_times(MODEL, PURE, PARAMS, tokens, SEQ, 1, cp, False, "eager", "bf16", cp_impl="ring")
    assert (eager.attn_fwd, eager.attn_bwd) == (ring.attn_fwd, ring.attn_bwd)  # the cp kernel replaces attn
    rows = tokens * MODEL.n_heads  # query rows of every head
    elements = rows * ring_keys(SEQ, cp)
    one = gemm_time(PURE, PARAMS, rows, MODEL.head_dim, ring_keys(SEQ, cp))  # Q·Kᵀ over all blocks
    bandwidth = PURE.hbm_bandwidth * PURE.memory_efficiency
    mask = RING_MASK_BYTES * local / ring_keys(SEQ, cp)  # on the diagonal block's share of the elements
    # two batched GEMMs forward, five backward (the scores recomputed), and the fp32 score traffic
    assert ring.attn_fwd == pytest.approx(2 * one + elements * (RING_SCORE_BYTES[0] + mask) / bandwidth, rel=1e-12)
    assert ring.attn_bwd == pytest.approx(5 * one + elements * (RING_SCORE_BYTES[1] + mask) / bandwidth, rel=1e-12)
    assert ring.attn_fwd > times("torch", cp, tokens).attn_fwd  # materialized scores cost more than flash


def test_what_hides_behind_attention_and_what_does_not():
    group = _groups(Layout(cp=4), 8)["cp"]
    tokens = SEQ / 4
    hop = comm.send_recv(CLUSTER, False, FP32 * 2 * tokens * MODEL.kv_hidden)
    everything = dataclasses.replace(PARAMS, cp_comm_overlap=1.0)
    nothing = dataclasses.replace(PARAMS, cp_comm_overlap=0.0)
    ring = Layout(cp=4, cp_impl="ring")
    # a long attention hides the K/V hops; the dK/dV accumulator's cp hops are awaited one by one
    assert cp_exchange(MODEL, CLUSTER, group, ring, tokens, 1.0, 1.0, everything) == (0.0, pytest.approx(4 * hop))
    assert cp_exchange(MODEL, CLUSTER, group, ring, tokens, 1.0, 1.0, nothing) == (
        pytest.approx(3 * hop), pytest.approx(7 * hop))
    # the all-gather kernel waits for every collective, however long the attention
    gathered = Layout(cp=4, cp_impl="allgather")
    whole = CLUSTER.gpu.element_bytes * tokens * MODEL.kv_hidden * 4
    assert cp_exchange(MODEL, CLUSTER, group, gathered, tokens, 1.0, 1.0, everything) == (
        pytest.approx(2 * comm.all_gather(CLUSTER, group, whole)),
        pytest.approx(2 * comm.reduce_scatter(CLUSTER, group, whole)))
    assert all(not e.hidden for e in exchanges(MODEL, Layout(cp=4, cp_impl="ulysses"), tokens, 2.0))
    assert exchanges(MODEL, Layout(cp=1), tokens, 2.0) == [] and cp_exchange(
        MODEL, CLUSTER, group, Layout(), tokens, 1.0, 1.0, PARAMS) == (0.0, 0.0)


@pytest.mark.parametrize("impl", ["ring", "allgather", "torch", "ulysses"])
def test_the_step_carries_the_exchange_of_every_layer_and_micro_batch(impl):
    lay = Layout(dp=2, cp=4, mbs=1, cp_impl=impl)
    job = JobSpec(global_batch=2 * 3, seq_len=SEQ)  # 3 micro-batches
    step = estimate_step(MODEL, CLUSTER, job, lay, PARAMS)
    tokens = SEQ / 4
    layer = layer_times(MODEL, CLUSTER.gpu, PARAMS, tokens, SEQ, 1, 4, False, "flash", "bf16", cp_impl=impl)
    per_layer = sum(cp_exchange(MODEL, CLUSTER, _groups(lay, 8)["cp"], lay, tokens, layer.attn_fwd, layer.attn_bwd,
                                PARAMS))
    assert step.cp_comm == pytest.approx(3 * MODEL.n_layers * per_layer, rel=1e-12) and step.cp_comm > 0


@pytest.mark.parametrize("layout", ["cp=4,mbs=1", "tp=2,cp=4,ckpt=selective", "dp=2,cp=4,zero=3,ckpt=full"])
def test_the_search_gives_a_layout_the_kernel_with_the_fastest_step(layout):
    """fastest_cp_impl compares only the attention and exchange terms; the whole step agrees."""
    from plait.plan.context.choice import fastest_cp_impl
    from plait.spec.validate import ulysses_splits_heads

    lay = Layout.parse(layout)
    job = JobSpec(global_batch=lay.dp * lay.mbs * 2, seq_len=32768)
    steps = {impl: estimate_step(MODEL, CLUSTER, job, dataclasses.replace(lay, cp_impl=impl), DEFAULT_PARAMS).step_time
             for impl in ("ring", "allgather", "torch", "ulysses")
             if impl != "ulysses" or ulysses_splits_heads(MODEL, lay)}
    chosen = fastest_cp_impl(MODEL, CLUSTER, job, lay, DEFAULT_PARAMS)
    assert steps[chosen] <= min(steps.values()) * (1 + 1e-9), steps
    assert len(set(steps.values())) > 1  # the kernels are priced apart


def test_ulysses_is_chosen_only_where_it_runs_and_a_pinned_kernel_is_kept():
    from plait.plan.context.choice import fastest_cp_impl
    from plait.plan.search import SearchConstraints, search

    job = JobSpec(global_batch=8, seq_len=65536)
    # llama3-8b has 8 K/V heads: at tp=2 a rank holds 4, which cp=8 does not divide
    lay = Layout(tp=2, cp=8, mbs=1)
    wide = dataclasses.replace(CLUSTER, gpus_per_node=16).with_gpus(16)
    assert fastest_cp_impl(MODEL, wide, job, lay, DEFAULT_PARAMS) != "ulysses"
    plans = search(MODEL, CLUSTER, job, SearchConstraints(fixed=(("cp", 8),))).plans
    assert plans and all(p.layout.cp == 8 for p in plans)
    pinned = search(MODEL, CLUSTER, job, SearchConstraints(fixed=(("cp", 8), ("cp_impl", "ring")))).plans
    assert pinned and all(p.layout.cp_impl == "ring" for p in pinned)
    assert pinned[0].step.step_time > plans[0].step.step_time  # the fp32 score blocks cost more
