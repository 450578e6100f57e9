"""Counted tensor memory of CPU runs (``plait.run.memory.counted``) against exact byte counts and
the planner's memory for a device that computes in fp32 (``GpuSpec.element_bytes = 4``).

* ``window_peak`` on made-up allocation events: bytes alive when the window starts plus the
  peak increase during it, the marker's own byte taken off.
* One process, the tiny model (2 steps, the window is the second): the counted peak lies between
  what must be alive when the backward starts - fp32 weights, Adam's m and v and every tensor the
  layers save (the planner's activation items; gradients are freed by ``zero_grad(set_to_none=True)``
  and not yet made) - and the planner's whole prediction plus the one saved tensor the CPU's
  composite RMSNorm adds per norm (its fp32 normalized input, 4 bytes per element; 2 norms per
  layer and the final one).
* Two gloo processes: the train summary and a sweep row on the CPU fill the new memory columns.
* Two gloo pipeline ranks (sequence 128, 8 micro-batches): 1F1B, interleaved 1F1B and
  zero-bubble count within the issue's 15% of the planner's prediction; zero-bubble's deferred
  weight gradients and held sends are what keeps it there (without them it is far outside).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import memory_count_tasks
from runtime_tasks import in_one_process

from plait.measure.sweep.csv_file import SweepRow
from plait.measure.sweep.run_one import measured_memory_of
from plait.plan.memory import estimate_memory
from plait.plan.params import DEFAULT_PARAMS
from plait.run.memory.counted import window_peak, window_step
from plait.spec.hardware import cluster_for_gpu
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

SEQ, BATCH = 32, 8
CPU_PARAMS = dataclasses.replace(DEFAULT_PARAMS, cuda_context_bytes=0.0, comm_buffer_bytes=0.0, fragmentation=0.0)


def cpu_cluster(n: int):
    cluster = cluster_for_gpu("h100-sxm", n)
    return dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu, element_bytes=4.0))


def event(ptr: int, size: int):
    return SimpleNamespace(ptr=ptr, alloc_size=size)


def test_window_peak_counts_what_is_alive_at_its_start():
    events = [(1, event(10, 1000)), (2, event(11, 500)), (3, event(11, -500)),
              (4, event(99, 1)),  # the marker: the window starts here, 1000 bytes alive
              (5, event(12, 300)), (6, event(12, -300)), (7, event(10, -1000))]
    assert window_peak(events, marker_ptr=99, marker_bytes=1) == 1300
    assert window_peak(events[:3], marker_ptr=99, marker_bytes=1) is None


def test_window_peak_takes_off_a_block_freed_where_the_profiler_did_not_see_it():
    # block 20 (800 bytes) is freed on a foreign thread (no event); a later allocation at its
    # address shows that it is gone: 1000 + 600 alive at the peak, not 1000 + 800 + 600
    events = [(1, event(10, 1000)), (2, event(20, 800)), (3, event(20, 600)), (4, event(99, 1)),
              (5, event(21, 200)), (6, event(21, -200))]
    assert window_peak(events, marker_ptr=99, marker_bytes=1) == 1000 + 600 + 200


def test_window_is_the_second_step():
    assert [window_step(0, n) for n in (1, 2, 3, 10)] == [None, 1, 1, 1]
    assert window_step(5, 10) == 6 and window_step(9, 10) is None  # resumed at step 5, at step 9


def test_counted_peak_of_one_process_between_exact_bounds():
    summary = in_one_process(memory_count_tasks.train_summary, "dp=1,mbs=8", steps=2, seq_len=SEQ,
                             global_batch=BATCH)
    counted = summary["peak_tensor_bytes"]
    model, layout = get_model("tiny"), Layout.parse("dp=1,mbs=8")
    memory = estimate_memory(model, cpu_cluster(1), JobSpec(global_batch=BATCH, seq_len=SEQ), layout, CPU_PARAMS)
    params = model.total_params()
    # fp32 weights, Adam's m and v; no gradient alive when the backward starts (one micro-batch, no DDP)
    assert memory.weights == 4 * params and memory.optimizer == 8 * params and memory.gradients == 0
    lower = memory.weights + memory.optimizer + memory.activations
    final_norm = 3 * 4 * SEQ * BATCH * model.hidden  # not in the planner: its input, x·rstd and output
    upper = memory.allocated + final_norm
    assert lower <= counted <= upper, (lower, counted, upper, memory.items())


def test_two_process_summary_and_sweep_row_fill_the_memory_columns(dist_pool):
    summaries = dist_pool(2).run(memory_count_tasks.train_summary, "dp=2,mbs=4", steps=2, seq_len=SEQ,
                                 global_batch=BATCH, timeout=120)
    counted = {s["peak_tensor_bytes"] for s in summaries}
    assert len(counted) == 1 and next(iter(counted)) > 0  # max over ranks: the same on both
    measured, kind = measured_memory_of(summaries[0])
    assert (measured, kind) == (summaries[0]["peak_tensor_bytes"], "host_tensors")
    predicted = 0.9 * measured
    row = SweepRow(layout="dp=2,mbs=4", status="ok", device="cpu", predicted_memory_bytes=predicted,
                   measured_memory_bytes=float(measured), memory_kind=kind).with_errors()
    assert row.memory_error == pytest.approx(measured / predicted - 1)
    for_gpu = dataclasses.replace(row, gpu="h100-sxm", memory_error=None).with_errors()
    assert for_gpu.memory_error is None  # a GPU's prediction is not compared with a CPU's tensors


@pytest.mark.parametrize("text", ["pp=2,mbs=1", "pp=2,vpp=2,mbs=1", "pp=2,mbs=1,schedule=zero-bubble"])
def test_pipeline_schedules_count_what_the_planner_predicts(dist_pool, text):
    seq = 128  # long enough for the activations, not the model states, to tell the schedules apart
    summaries = dist_pool(2).run(memory_count_tasks.train_summary, text, steps=2, seq_len=seq,
                                 global_batch=BATCH, timeout=180)
    counted = summaries[0]["peak_tensor_bytes"]
    layout, job = Layout.parse(text), JobSpec(global_batch=BATCH, seq_len=seq)
    memory = estimate_memory(get_model("tiny"), cpu_cluster(2), job, layout, CPU_PARAMS)
    assert abs(counted / memory.allocated - 1) <= 0.15, (counted, memory.items())
    if layout.schedule == "zero-bubble":
        without = memory.allocated - memory.deferred_weight_grads - memory.pipeline_buffers / 2
        assert counted / without - 1 > 0.15 and memory.stage == "last"


def test_storage_bytes_counts_each_storage_once_and_looks_inside_wrapper_subclasses():
    """Shared storages count once; a wrapper subclass (torchao's fp8 / MX weights are such) has no
    storage of its own and counts the tensors it wraps."""
    from plait.run.memory.counted import storage_bytes

    a = torch.zeros(10)
    assert storage_bytes([a, a[2:5], a.view(2, 5)]) == 40
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    wrapped = two_tensor.TwoTensor(torch.zeros(4), torch.ones(4))
    assert storage_bytes([wrapped, a]) == 16 + 16 + 40
