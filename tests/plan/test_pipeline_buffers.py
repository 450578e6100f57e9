"""torch.distributed.pipelining's receive buffers in the planner's memory: one per micro-batch for
every stage chunk that receives activations (all but the first stage) and every one that receives
gradients (all but the last), priced as one micro-batch's hidden state in the compute dtype; the
schedules that wait on their sends only at the end of the step (interleaved, zero-bubble) hold as
many sent tensors again. Zero-bubble's deferred weight steps: the micro-batches every rank keeps
and the output gradients a rank holds for them."""

from __future__ import annotations

import dataclasses

import pytest

from plait.measure.report.stage_memory import stage_memories
from plait.plan.memory import (
    deferred_weight_grad_bytes,
    deferred_weight_grad_sets,
    estimate_memory,
    pipeline_buffer_bytes,
    rank_in_flight,
)
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

MODEL = get_model("tiny")
JOB = JobSpec(global_batch=8, seq_len=128)


@pytest.mark.parametrize("text,first,last", [
    ("pp=2,mbs=1", 1, 1),  # rank 0: gradients only; the last rank: activations only
    ("pp=2,vpp=2,mbs=1", 3 * 2, 3 * 2),  # two chunks each: 2 + 2, less the first stage's and the last's; sends held
    ("pp=4,mbs=2", 1, 1),
    ("pp=4,mbs=2,schedule=gpipe", 1, 1),
    ("pp=4,mbs=2,schedule=zero-bubble", 2, 2),  # sends held until the end of the step
])
def test_buffers_per_rank_and_micro_batch(text, first, last):
    layout = Layout.parse(text)
    m = layout.micro_batches(JOB.global_batch)
    one = 4.0 * JOB.seq_len * layout.mbs * MODEL.hidden  # fp32 hidden state of one micro-batch
    held = 2 if layout.schedule in ("interleaved-1f1b", "zero-bubble") else 1
    assert pipeline_buffer_bytes(MODEL, layout, JOB, 0, 4.0) == first * m * one
    assert pipeline_buffer_bytes(MODEL, layout, JOB, layout.pp - 1, 4.0) == last * m * one
    if layout.pp > 2:  # a middle rank receives both
        assert pipeline_buffer_bytes(MODEL, layout, JOB, 1, 4.0) == held * 2 * layout.vpp * m * one
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


def test_zero_bubble_keeps_p_micro_batches_on_every_rank_and_defers_weight_gradients():
    m = 8
    zb, one_f_one_b = Layout.parse("pp=4,mbs=1,schedule=zero-bubble"), Layout.parse("pp=4,mbs=1")
    assert [rank_in_flight(zb, m, r) for r in range(4)] == [4, 4, 4, 4]
    assert [rank_in_flight(one_f_one_b, m, r) for r in range(4)] == [4, 3, 2, 1]
    assert [rank_in_flight(zb, m, r, runtime="megatron") for r in range(4)] == [4, 3, 2, 1]  # ZB-H1
    assert [deferred_weight_grad_sets(zb, m, r) for r in range(4)] == [0, 2, 3, 4]
    assert deferred_weight_grad_sets(zb, 2, 3) == 2  # never more than the micro-batches there are
    assert deferred_weight_grad_sets(one_f_one_b, m, 3) == 0


def test_deferred_weight_gradients_are_the_outputs_of_every_weight_op():
    layout = Layout.parse("pp=2,mbs=2,schedule=zero-bubble")
    tokens = JOB.seq_len * layout.mbs
    layers = MODEL.n_layers // 2
    # q, k, v, o, gate, up, down and the two norms' outputs, fp32, per layer
    widths = MODEL.q_hidden + 2 * MODEL.kv_hidden + MODEL.hidden + 2 * MODEL.ffn_hidden + MODEL.hidden + 2 * MODEL.hidden
    middle = 4.0 * tokens * widths * layers
    assert deferred_weight_grad_bytes(MODEL, layout, JOB, False, 4.0) == middle
    # the last stage adds the final norm's output and the LM head's: the logits' gradient
    assert deferred_weight_grad_bytes(MODEL, layout, JOB, True, 4.0) == middle + 4.0 * tokens * (MODEL.hidden + MODEL.vocab)
    cluster = dataclasses.replace(get_cluster("dgx-h100").with_gpus(2), gpus_per_node=2)
    memory = estimate_memory(MODEL, cluster, JOB, layout)
    assert memory.stage == "last"
    assert memory.deferred_weight_grads == 2 * deferred_weight_grad_bytes(MODEL, layout, JOB, True, 2.0)
    assert memory.items()["deferred_weight_grads"] == memory.deferred_weight_grads
    plain = estimate_memory(MODEL, cluster, JOB, Layout.parse("pp=2,mbs=2"))
    assert plain.deferred_weight_grads == 0.0 and memory.total > plain.total
