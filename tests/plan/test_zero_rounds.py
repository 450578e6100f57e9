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
