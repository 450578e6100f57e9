"""Expert overlap (``moe_overlap=chunked`` and ``shared``, plait.run.parallel.expert_overlap) on 2 gloo ranks.

One pool task per test, several cases each:

  * the exchange alone (8 experts, ep=2, random rows): the overlapped dispatchers give the plain
    all-to-all's output and every gradient (rows, expert weights, the shared input) to the rounding
    of one expert GEMM's sums, and their timelines show the overlap: in the forward and in the
    backward every chunk's expert GEMMs run while an all-to-all is in flight (issued before the
    GEMMs started, waited after they ended); with ``shared`` the dispatch is in flight while the
    shared MLP runs, forward and backward. Order of events only, never wall time. The backward
    builds no zero-padded whole-size gradient per chunk or expert (the chunks are one ``split`` of
    the rows, the experts one ``unbind`` of each weight: ``op_record``).
  * training: ``tiny-moe`` under dp=2 × ep=2 (and with ZeRO-3, and chunked with full activation
    checkpointing: the overlapped all-to-alls recomputed) gives the losses, gradient norms and
    parameters of moe_overlap=none on the same ranks, within tests/support/tolerances.py's bounds
    for two runs that sum in different orders (the expert weight gradients are summed per chunk).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

import moe_tasks
import overlap_tasks
import tolerances

from plait.plan.moe.timing import MOE_CHUNKS, chunk_gradient_sums
from plait.spec.layout import Layout
from plait.spec.models import get_model

LOSS_RTOL = tolerances.LOSS_RTOL
PARAM_ATOL = tolerances.adamw_atol(tolerances.TINY_LR, moe_tasks.STEPS, tolerances.TINY_EPS,
                                   1.0 / math.sqrt(get_model(moe_tasks.MODEL).total_params()),
                                   tolerances.TINY_LONGEST_SUM, tolerances.TINY_LAYERS)
# the exchange alone: values O(scale) out of sums of at most FFN terms (an expert's down projection)
# and, for a weight gradient, of the rows of all ranks (at most 2·ROWS), in another order
EXCHANGE_RTOL = 2 * tolerances.reduction_rtol(max(overlap_tasks.FFN, 2 * overlap_tasks.ROWS))

# the exchange's shapes as the planner reads them (fp32: 4-byte gradients)
EXCHANGE_MODEL = SimpleNamespace(hidden=overlap_tasks.HIDDEN, moe=SimpleNamespace(
    n_experts=overlap_tasks.EXPERTS, expert_ffn=overlap_tasks.FFN))

BASE = "dp=2,ep=2"
OVERLAPPED = ["dp=2,ep=2,moe_overlap=chunked", "dp=2,ep=2,moe_overlap=shared",
              "dp=2,ep=2,zero=3,moe_overlap=chunked", "dp=2,ep=2,zero=3,moe_overlap=shared",
              "dp=2,ep=2,ckpt=full,moe_overlap=chunked"]


def in_flight(timeline: list, what: str, chunk: int) -> list:
    """The exchanges (name, chunk) issued before the GEMMs ``what`` of ``chunk`` started and waited
    after they ended: the collectives in flight while they ran."""
    start = timeline.index(("gemm-start", what, chunk))
    end = timeline.index(("gemm-end", what, chunk))
    assert start < end, f"{what} {chunk}: the GEMMs end before they start"
    issued = {(name, c): i for i, (event, name, c) in enumerate(timeline) if event == "issue"}
    waited = {(name, c): i for i, (event, name, c) in enumerate(timeline) if event == "wait"}
    return [key for key, i in issued.items() if i < start and waited[key] > end]


def test_overlapped_exchange_matches_and_overlaps(dist_pool):
    out = dist_pool(2).run(overlap_tasks.exchange_timelines, ["chunked", "shared"], timeout=120)
    for rank, result in enumerate(out):
        for mode, got in result.items():
            for key, diff in got["diff"].items():
                assert diff <= EXCHANGE_RTOL * got["scale"][key], f"rank {rank} {mode}: {key} differs by {diff:.3g}"
        for mode, got in result.items():
            padded = got["ops"]["padded"]
            assert not padded, f"rank {rank} {mode}: zero-padded gradients in the backward: {padded}"
        chunked = result["chunked"]
        assert chunked["chunks"] == MOE_CHUNKS
        # what the planner prices chunked for beyond the all-to-alls (plait.plan.moe): every chunk
        # runs every local expert's GEMMs again (3 forward, a data and a weight gradient each
        # backward: the launches of plait.plan.moe.sync's per-chunk kernels), and the backward adds
        # the chunks' expert weight gradients (chunk_gradient_sums, counted here byte for byte)
        local = overlap_tasks.EXPERTS // 2
        extra_gemms = chunked["ops"]["gemms"] - chunked["plain_ops"]["gemms"]
        assert extra_gemms == (chunked["chunks"] - 1) * 9 * local, f"rank {rank}: {extra_gemms} more GEMMs"
        assert chunked["plain_ops"]["weight_sum_bytes"] == 0
        assert chunked["ops"]["weight_sum_bytes"] == chunk_gradient_sums(
            EXCHANGE_MODEL, SimpleNamespace(element_bytes=4), Layout.parse("dp=2,ep=2,moe_overlap=chunked"))
        for chunk in range(chunked["chunks"]):
            for what in ("experts", "experts-grad"):
                flying = in_flight(chunked["timeline"], what, chunk)
                assert flying, f"rank {rank}: no all-to-all in flight during chunk {chunk}'s {what} GEMMs"
        # the forward's first chunk overlaps the later dispatches; the backward's first (last chunk)
        # the other reverse combines
        assert ("dispatch", 1) in in_flight(chunked["timeline"], "experts", 0)
        assert ("combine-grad", 0) in in_flight(chunked["timeline"], "experts-grad", 3)
        shared = result["shared"]
        assert shared["chunks"] == 1
        events = shared["timeline"]
        forward = [events.index(e) for e in (("issue", "dispatch", 0), ("shared-start", "shared", 0),
                                             ("shared-end", "shared", 0), ("wait", "dispatch", 0))]
        assert forward == sorted(forward), f"rank {rank}: shared experts not inside the dispatch: {events}"
        assert ("dispatch-grad", 0) in in_flight(events, "shared-grad", 0), f"rank {rank}: {events}"


def test_chunked_casts_the_expert_weights_once_and_sums_their_gradients_in_bf16(dist_pool):
    """Under bf16 autocast with fp32 master weights, chunked casts each expert weight once for all
    chunks (GroupedExperts.run_chunked) and sums the chunks' weight gradients in bf16: the bytes the planner
    prices with a 2-byte compute dtype (chunk_gradient_sums); per-chunk casts would sum them in fp32."""
    out = dist_pool(2).run(overlap_tasks.autocast_chunk_casts, timeout=120)
    want = chunk_gradient_sums(EXCHANGE_MODEL, SimpleNamespace(element_bytes=2),
                               Layout.parse("dp=2,ep=2,moe_overlap=chunked"))
    for rank, got in enumerate(out):
        assert got["chunks"] == MOE_CHUNKS
        assert got["weight_casts"] == 3, f"rank {rank}: {got['weight_casts']} casts of the expert weights"
        assert got["add_element_bytes"] == [2], f"rank {rank}: sums in {got['add_element_bytes']}-byte elements"
        assert got["weight_sum_bytes"] == want, f"rank {rank}"
        assert got["grads_fp32"]


def test_overlap_trains_as_no_overlap(dist_pool):
    out = dist_pool(2).run(moe_tasks.train_layouts, [BASE] + OVERLAPPED, timeout=600)
    base = out[0][0]
    for index, layout in enumerate(OVERLAPPED, start=1):
        result = out[0][index]
        for key in ("losses", "grad_norms"):
            for step, (got, want) in enumerate(zip(result[key], base[key], strict=True)):
                assert abs(got - want) <= LOSS_RTOL * abs(want), f"{layout}: step {step} {key} {got} vs {want}"
        worst = max(((result["params"][name] - value).abs().max().item(), name) for name, value in base["params"].items())
        assert worst[0] <= PARAM_ATOL, f"{layout}: parameter {worst[1]} differs by {worst[0]:.3g}"
        assert all(rank[index]["losses"] == result["losses"] for rank in out), f"{layout}: ranks disagree"
