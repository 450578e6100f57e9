"""Collective model (plait.plan.comm) and a physical lower bound on exposed DP communication.

Property (issue 18): predicted exposed data-parallel communication is never less than the bytes
over the slowest link divided by its bandwidth, minus the compute available to overlap it.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.errors import PlaitError
from plait.plan import comm
from plait.plan.cost import _groups, estimate_step
from plait.plan.memory import stage_params
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import CLUSTERS, ClusterSpec
from plait.spec.layout import GroupPlacement, JobSpec, Layout
from plait.spec.models import MODELS
from plait.spec.validate import errors_of, stage_layers, validate


def test_ring_bytes_per_link_and_busbw():
    """A ring over 4 nodes of 8: each GPU sends (n-1)/n·S, 1/8 of it through its own NIC."""
    group = GroupPlacement(32, 1, 4, 8)
    moved = comm.traffic("ring", group, 32e9)
    assert moved.nic_bytes == pytest.approx(31e9 / 8) and moved.nvlink_bytes == pytest.approx(31e9 * 7 / 8)
    two = comm.traffic("two_level", group, 32e9)
    assert two.nic_bytes == pytest.approx(3 / 4 * 32e9 / 8) and two.nic_steps == 3
    cluster = CLUSTERS["dgx-a100"]
    # nccl-tests: busbw = S/t·(n-1)/n; bandwidth-bound, it is the NIC level's: 8 NIC shares
    busbw = 32e9 / comm.time_of(cluster, dataclasses.replace(moved, nic_steps=0)) * 31 / 32
    assert busbw == pytest.approx(8 * comm.nic_bandwidth(cluster))
    # one GPU per node: the ring is bound by that GPU's NIC share
    single = comm.traffic("ring", GroupPlacement(4, 8, 4, 1), 4e9)
    assert single.nic_bytes == pytest.approx(3e9) and single.nvlink_bytes == 0


def test_gpus_per_nic_shares_the_nic():
    frontier = CLUSTERS["frontier"]
    assert frontier.gpus_per_nic == 2 and frontier.nic_share == pytest.approx(12.5e9)
    assert CLUSTERS["dgx-a100"].gpus_per_nic == 1 and CLUSTERS["dgx-h100"].nic_share == pytest.approx(50e9)
    roundtrip = ClusterSpec.from_json(frontier.to_json())
    assert roundtrip == frontier
    with pytest.raises(PlaitError, match="gpus_per_nic"):
        dataclasses.replace(frontier, gpus_per_nic=0)
    with pytest.raises(PlaitError, match="gpus_per_nic"):
        dataclasses.replace(frontier, gpus_per_nic=16)


def test_all_reduce_takes_the_faster_of_ring_and_tree():
    cluster = CLUSTERS["dgx-h100"]
    group = GroupPlacement(1024, 1, 128, 8)
    small = comm.all_reduce(cluster, group, 1e6)
    assert small == pytest.approx(comm.time_of(cluster, comm.traffic("tree", group, 1e6, 2)))
    assert small < comm.time_of(cluster, comm.traffic("ring", group, 1e6, 2))


def _dp_nic_lower_bound(model, cluster, job, layout) -> float:
    """Seconds the DP bytes need on the NIC level (fewest bytes of any algorithm)."""
    groups = _groups(layout, cluster.gpus_per_node)
    local = max(stage_params(model, layout).values())
    m = layout.micro_batches(job.global_batch)
    bw = comm.nic_bandwidth(cluster)
    if layout.zero == 0:
        group = groups["dp_cp"]
        nic = min(comm.traffic(a, group, local * DEFAULT_PARAMS.grad_reduce_bytes, 2).nic_bytes
                  for a in ("ring", "tree", "two_level"))
        return nic / bw
    group = groups["shard"]
    gathers = 2 if layout.reshard else 1
    per_mb = (gathers * comm.traffic("ring", group, 2.0 * local).nic_bytes
              + comm.traffic("ring", group, DEFAULT_PARAMS.grad_reduce_bytes * local).nic_bytes)
    return m * per_mb / bw


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(["llama3-8b", "llama2-13b", "gpt3-175b", "llama3-70b"]),
       cluster=st.sampled_from(["dgx-a100", "dgx-h100", "frontier"]),
       nodes=st.sampled_from([2, 4, 16, 64]), tp=st.sampled_from([1, 2, 8]),
       zero=st.sampled_from([0, 3]), mbs=st.sampled_from([1, 2]), accum=st.sampled_from([1, 4]),
       reshard=st.booleans(), ckpt=st.sampled_from(["none", "full"]))
def test_exposed_dp_comm_is_never_below_the_link_bound(model, cluster, nodes, tp, zero, mbs, accum, reshard, ckpt):
    spec = MODELS[model]
    hw = CLUSTERS[cluster].with_gpus(nodes * CLUSTERS[cluster].gpus_per_node)
    dp = hw.n_gpus // tp
    layout = Layout(dp=dp, tp=tp, mbs=mbs, zero=zero, reshard=reshard, ckpt=ckpt)
    job = JobSpec(global_batch=dp * mbs * accum, seq_len=2048)
    if errors_of(validate(spec, hw, job, layout)):
        return
    step = estimate_step(spec, hw, job, layout)
    overlap_window = step.compute + step.recompute + step.elementwise
    bound = _dp_nic_lower_bound(spec, hw, job, layout) - overlap_window
    assert step.dp_comm >= bound - 1e-9
    assert stage_layers(spec, layout) >= 1
