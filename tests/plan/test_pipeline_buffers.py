"""torch.distributed.pipelining's receive buffers in the planner's memory: one per micro-batch for
every stage chunk that receives activations (all but the first stage) and every one that receives
gradients (all but the last), priced as one micro-batch's hidden state in the compute dtype."""

from __future__ import annotations

import dataclasses

import pytest

from plait.measure.report.stage_memory import stage_memories
from plait.plan.memory import estimate_memory, pipeline_buffer_bytes
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

MODEL = get_model("tiny")
JOB = JobSpec(global_batch=8, seq_len=128)


@pytest.mark.parametrize("text,first,last", [
    ("pp=2,mbs=1", 1, 1),  # rank 0: gradients only; the last rank: activations only
    ("pp=2,vpp=2,mbs=1", 3, 3),  # two chunks each: 2 + 2, less the first stage's and the last's
    ("pp=4,mbs=2", 1, 1),
])
def test_buffers_per_rank_and_micro_batch(text, first, last):
    layout = Layout.parse(text)
    m = layout.micro_batches(JOB.global_batch)
    one = 4.0 * JOB.seq_len * layout.mbs * MODEL.hidden  # fp32 hidden state of one micro-batch
    assert pipeline_buffer_bytes(MODEL, layout, JOB, 0, 4.0) == first * m * one
    assert pipeline_buffer_bytes(MODEL, layout, JOB, layout.pp - 1, 4.0) == last * m * one
    if layout.pp > 2:  # a middle rank receives both
        assert pipeline_buffer_bytes(MODEL, layout, JOB, 1, 4.0) == 2 * layout.vpp * m * one
    assert pipeline_buffer_bytes(MODEL, layout, JOB, 0, 4.0, runtime="megatron") == 0.0


def test_sequence_parallel_shards_them_and_no_pipeline_has_none():
    sp = Layout.parse("tp=2,pp=2,mbs=1")
    assert pipeline_buffer_bytes(MODEL, sp, JOB, 0, 2.0) == 8 * 2.0 * JOB.seq_len * MODEL.hidden / 2
    assert pipeline_buffer_bytes(MODEL, Layout.parse("dp=2,mbs=1"), JOB, 0, 2.0) == 0.0


def test_they_are_allocated_memory_of_the_planned_and_every_drawn_stage():
    cluster = dataclasses.replace(get_cluster("dgx-h100").with_gpus(4), gpus_per_node=4)
    layout = Layout.parse("pp=4,vpp=2,mbs=1")
    memory = estimate_memory(MODEL, cluster, JOB, layout)
    assert memory.pipeline_buffers == pipeline_buffer_bytes(MODEL, layout, JOB, 0, 2.0) > 0
    assert memory.items()["pipeline_buffers"] == memory.pipeline_buffers
    stages = stage_memories(MODEL, cluster, JOB, layout)
    assert [s.pipeline_buffers for s in stages] == [pipeline_buffer_bytes(MODEL, layout, JOB, r, 2.0) for r in range(4)]
    assert max(s.total for s in stages) == pytest.approx(memory.total)
