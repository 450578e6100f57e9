"""How often ZeRO-1/2 communicate per step, as plait's runtime does it (``plait.run.step``):
ZeRO-2 reduce-scatters its gradients and gathers its parameters again for every micro-batch;
ZeRO-1 accumulates full gradients and does both once per step, and so do the pipeline schedules
under any ZeRO stage (torch's stages reduce once per step). The runtime's side of this is
tests/run/test_fsdp_units.py (collectives counted)."""

from __future__ import annotations

import dataclasses

import pytest

from plait.plan.cost import estimate_step
from plait.plan.params import DEFAULT_PARAMS
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

MODEL = get_model("llama-7b")
CLUSTER = dataclasses.replace(get_cluster("dgx-h100").with_gpus(8), gpus_per_node=8)
NOTHING_HIDES = dataclasses.replace(DEFAULT_PARAMS, dp_overlap=0.0, overlap_slowdown=0.0)


def dp_comm(layout: str, micro_batches: int) -> float:
    lay = Layout.parse(layout)
    job = JobSpec(global_batch=lay.dp * lay.mbs * micro_batches, seq_len=2048)
    assert lay.micro_batches(job.global_batch) == micro_batches
    return estimate_step(MODEL, CLUSTER, job, lay, NOTHING_HIDES).dp_comm


def test_zero2_communicates_every_micro_batch_and_zero1_once_per_step():
    once = dp_comm("dp=8,mbs=1,zero=2", 1)
    assert once > 0
    assert dp_comm("dp=8,mbs=1,zero=1", 1) == pytest.approx(once)  # one micro-batch: the same run
    assert dp_comm("dp=8,mbs=1,zero=2", 4) == pytest.approx(4 * once)
    assert dp_comm("dp=8,mbs=1,zero=1", 4) == pytest.approx(once)


def test_pipeline_stages_reduce_once_per_step_under_zero2():
    assert dp_comm("pp=2,dp=4,mbs=1,zero=2", 8) == pytest.approx(dp_comm("pp=2,dp=4,mbs=1,zero=2", 1))



def test_hybrid_sharding_reduces_across_replicas_as_often_as_it_reduce_scatters():
    """dp=8, hsdp=2 on nodes of 4: each shard group inside a node, the replica all-reduce across
    the two. Slowing the network changes only the replica term, by as many all-reduces as FSDP2
    makes: one per micro-batch under ZeRO-2 and 3, one per step under ZeRO-1."""
    two_nodes = dataclasses.replace(get_cluster("dgx-h100").with_gpus(8), gpus_per_node=4)
    slow = dataclasses.replace(two_nodes, inter_node_bandwidth=two_nodes.inter_node_bandwidth / 10)

    def replica_cost(zero: int, micro_batches: int) -> float:
        lay = Layout.parse(f"dp=8,hsdp=2,mbs=1,zero={zero}")
        job = JobSpec(global_batch=8 * micro_batches, seq_len=2048)
        return (estimate_step(MODEL, slow, job, lay, NOTHING_HIDES).dp_comm
                - estimate_step(MODEL, two_nodes, job, lay, NOTHING_HIDES).dp_comm)

    for zero, reductions in ((1, 1), (2, 4), (3, 4)):
        assert replica_cost(zero, 1) > 0
        assert replica_cost(zero, 4) == pytest.approx(reductions * replica_cost(zero, 1)), zero
