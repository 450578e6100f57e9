"""A CPU profile describes the CPU as plait's runtime uses it (issue 12): fp32 elements, no CUDA
context or NCCL buffers, the measured overlap of communication with compute, the runtime's host
time per layer beyond the planner's own terms, and the processes x threads it was taken with.
The fits are checked by inversion (no torch): timings made from the planner's own formula plus a
known extra give that extra back, and the planner with the fitted file reproduces the timings.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from plait.measure.profile.cpu_fit import (
    BLOCK_BATCHES,
    HOST_LAYERS,
    HOST_MICRO_BATCHES,
    ENDS_PARAMS,
    MECHANISM_PARAMS,
    block_passes,
    cpu_device,
    overlap_hidden,
    planned_run_seconds,
)
from plait.measure.profile.fit import calibration_fields
from plait.measure.profile.machine import host_overhead_layouts, host_overhead_spec
from plait.plan.calibration import read_calibration
from plait.plan.cost import estimate_step
from plait.plan.kernels import layer_times
from plait.plan.terms.overlap import exposed
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.hardware import get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.models import get_model

TINY = get_model("tiny")
CPU_RATE, CPU_COPY, OVERHEAD_S = 80e9, 30e9, 3e-6


def _raw(layer_host: dict | None = None, overlap: float | None = 0.25) -> dict:
    """Synthetic measurements of a CPU on the planner's curves (F_half = 0), 2 processes."""
    gemm = [{"flops": f, "time_s": f / CPU_RATE + OVERHEAD_S, "flops_per_s": f / (f / CPU_RATE + OVERHEAD_S)}
            for f in (1e6, 1e7, 1e8, 1e9)]
    raw = {"dtype": "float32", "kernel_overhead_s": OVERHEAD_S, "gemm": gemm,
           "attention": [{"flops": f, "fwd_s": f / 40e9 + OVERHEAD_S, "fwd_bwd_s": 3 * (f / 40e9 + OVERHEAD_S)}
                         for f in (1e7, 1e8)],
           "memory": [{"bytes_per_s": CPU_COPY}],
           "collectives": [{"op": op, "scope": "intra", "group_size": 2, "bytes": b,
                            "time_s": (2 if op == "all_reduce" else 1) * (b / 2 / 1e9 + 5e-4)}
                           for op in ("all_reduce", "all_gather", "reduce_scatter") for b in (1e4, 1e6)]}
    if overlap is not None:
        raw["overlap"] = {"hidden": overlap}
    if layer_host is not None:
        raw["layer_host_s"] = layer_host
    return raw


def test_cpu_profile_writes_fp32_elements_no_gpu_memory_items_and_the_measured_overlap():
    fields = calibration_fields(_raw(), None, 1.0, 8e9)
    assert fields["gpu_overrides"]["element_bytes"] == 4.0
    params = fields["params"]
    assert params["cuda_context_bytes"] == params["comm_buffer_bytes"] == params["fragmentation"] == 0.0
    assert params["dp_overlap"] == params["offload_overlap"] == params["cp_comm_overlap"] == 0.25
    assert params["tp_comm_overlap"] == min(0.25, DEFAULT_PARAMS.tp_comm_overlap)
    # an overlap above the default TP overlap keeps the default for TP (the runtime issues it synchronously)
    assert calibration_fields(_raw(overlap=0.9), None, 1.0)["params"]["tp_comm_overlap"] == DEFAULT_PARAMS.tp_comm_overlap
    # no overlap measured (one process): the defaults stay
    assert "dp_overlap" not in calibration_fields(_raw(overlap=None), None, 1.0)["params"]


def test_a_gradient_bucket_that_hides_poorly_is_priced_as_slowdown():
    """The bucket trial (a DDP bucket's all-reduces behind GEMMs three times as long): the fraction
    of the all-reduces that did not hide becomes overlap_slowdown, so that a backward longer than
    its gradient traffic exposes that rest of it; the 1 MiB trial still gives the capacities."""
    raw = _raw(overlap=0.6)
    raw["overlap_buckets"] = {"reduce_bytes": 25 * 2**20, "trials": [{"hidden": h} for h in (0.0, 0.5, 0.1)]}
    fields = calibration_fields(raw, None, 1.0, 8e9)
    params = fields["params"]
    assert params["overlap_slowdown"] == pytest.approx(0.8)
    assert params["dp_overlap"] == params["offload_overlap"] == params["cp_comm_overlap"] == 0.6
    assert fields["fits"]["overlap_buckets_hidden"] == pytest.approx(0.2)
    assert any("25 MiB all-reduce (a DDP gradient bucket)" in note for note in fields["notes"])
    assert "overlap_slowdown" not in calibration_fields(_raw(overlap=0.6), None, 1.0)["params"]  # older profiles
    # what the planner then exposes of a gradient all-reduce behind a longer backward
    calibrated = CostParams.from_dict({**DEFAULT_PARAMS.to_dict(), **params})
    assert exposed(0.1, 1.0, calibrated) == pytest.approx(0.08)


def test_the_bucket_trial_is_one_ddp_bucket_of_the_profiled_model():
    from plait.measure.profile.machine import DDP_BUCKET_BYTES, Where, profile_config

    tiny = profile_config(TINY, 128, Where("cpu", 2), quick=True, timeout_s=60)
    assert tiny["overlap_buckets"]["reduce_bytes"] == 4 * TINY.total_params() < DDP_BUCKET_BYTES  # one bucket holds it all
    assert tiny["overlap_buckets"]["compute_over_comm"] > 1  # the compute is the longer side
    large = profile_config(get_model("llama3-8b"), 4096, Where("cpu", 2), quick=True, timeout_s=60)
    assert large["overlap_buckets"]["reduce_bytes"] == DDP_BUCKET_BYTES == 25 * 2**20
    assert large["overlap"]["reduce_bytes"] == 2**20  # the small messages' trial stays
    assert "overlap_buckets" not in profile_config(TINY, 128, Where("cuda", 2, 1, "h100-sxm"), quick=True, timeout_s=60)


def test_overlap_is_the_mean_of_the_trials_not_their_median():
    """Trials that hide all or nothing (what a CPU's shared cores do): their median is 0.1, the
    expected fraction that a step's many collectives add up to is their mean, 0.42 (a fraction above
    1 counts as 1). A profile that recorded its trials is fitted from them, whatever its stored
    ``hidden`` says (an older profile's median)."""
    trials = [{"hidden": h} for h in (0.0, 1.2, 0.0, 1.0, 0.1)]
    assert overlap_hidden(trials) == pytest.approx((0.0 + 1.0 + 0.0 + 1.0 + 0.1) / 5)
    raw = _raw()
    raw["overlap"] = {"hidden": 0.1, "trials": trials}
    params = calibration_fields(raw, None, 1.0, 8e9)["params"]
    assert params["dp_overlap"] == params["offload_overlap"] == params["cp_comm_overlap"] == pytest.approx(0.42)
    with pytest.raises(ValueError):
        overlap_hidden([])


def test_host_time_is_what_the_planners_terms_leave_unexplained():
    """Update times = the planner's own time for each update + known per-layer, per-micro-batch and
    per-step extras: the fit gives the extras back, and with the fitted params the planner
    reproduces every timed update."""
    spec = host_overhead_spec(TINY)
    layouts = host_overhead_layouts(spec, 2)
    assert set(layouts) == {"plain", *MECHANISM_PARAMS}  # tp=2, cp=2, zero=2 and balanced are valid for tiny
    base = calibration_fields(_raw(), None, 1.0, 8e9)  # the device and links without host time
    device = cpu_device(base["gpu_overrides"])
    links = base["cluster_overrides"]
    truth = CostParams.from_dict({**DEFAULT_PARAMS.to_dict(), **base["params"], "layer_overhead_s": 1.5e-3,
                                  "microbatch_overhead_s": 0.7e-3, "step_overhead_s": 4e-3,
                                  "tp_layer_overhead_s": 7e-3, "cp_layer_overhead_s": 2e-3,
                                  "fsdp_layer_overhead_s": 0.5e-3, "sac_layer_overhead_s": 3e-3,
                                  "tp_ends_overhead_s": 11e-3, "cp_ends_overhead_s": 1.3e-3,
                                  "fsdp_ends_overhead_s": 6e-3})
    low, high = HOST_LAYERS
    runs = {f"{low}x1": (low, 1), f"{high}x1": (high, 1), f"{low}x{HOST_MICRO_BATCHES}": (low, HOST_MICRO_BATCHES)}
    host = {"spec": spec.name, "tokens": 32, "layouts": layouts}
    for mechanism, text in layouts.items():
        keys = runs if mechanism == "plain" else {k: v for k, v in runs.items() if v[1] == 1}
        host[mechanism] = {key: planned_run_seconds(spec, text, device, links, truth, 32, *shape)
                           for key, shape in keys.items()}
    fitted = calibration_fields(_raw(host), None, 1.0, 8e9, spec)["params"]
    for name in ("layer_overhead_s", "microbatch_overhead_s", "step_overhead_s", *MECHANISM_PARAMS.values(),
                 *ENDS_PARAMS.values()):
        assert fitted[name] == pytest.approx(getattr(truth, name), rel=1e-6, abs=1e-12), name
    # a machine faster than the planner's terms gets no negative host time
    fast = {**host, **{m: {k: v * 1e-3 for k, v in host[m].items()} for m in layouts}}
    fitted = calibration_fields(_raw(fast), None, 1.0, 8e9, spec)["params"]
    assert all(fitted[name] == 0.0 for name in ("layer_overhead_s", "step_overhead_s", *MECHANISM_PARAMS.values(),
                                                *ENDS_PARAMS.values()))
    # one process: data parallelism alone and the selective checkpoint
    assert host_overhead_layouts(spec, 1) == {"plain": "dp=1,tp=1,pp=1,cp=1,mbs=1",
                                              "sac": "dp=1,tp=1,pp=1,cp=1,mbs=1,ckpt=balanced"}


def test_a_layers_once_a_step_cost_is_told_apart_from_its_per_micro_batch_cost():
    """Update times made by the planner from known extras: a per-layer cost per micro-batch and one once
    a step (the optimizer's update and the gradient sync's rest). The runs with three micro-batches at
    both layer counts give each back, and the planner with the fitted params reproduces every timed
    update."""
    spec = host_overhead_spec(TINY)
    layouts = {"plain": host_overhead_layouts(spec, 2)["plain"]}
    base = calibration_fields(_raw(), None, 1.0, 8e9)
    device, links = cpu_device(base["gpu_overrides"]), base["cluster_overrides"]
    start = CostParams.from_dict({**DEFAULT_PARAMS.to_dict(), **base["params"]})
    truth = dataclasses.replace(start, layer_overhead_s=0.8e-3, layer_step_overhead_s=1.2e-3,
                                microbatch_overhead_s=0.7e-3, step_overhead_s=4e-3)
    low, high = HOST_LAYERS
    host = {"spec": spec.name, "tokens": 32, "layouts": layouts,
            "plain": {f"{layers}x{mbs}": planned_run_seconds(spec, layouts["plain"], device, links, truth, 32, layers, mbs)
                      for layers in (low, high) for mbs in (1, HOST_MICRO_BATCHES)}}
    fitted = calibration_fields(_raw(host), None, 1.0, 8e9, spec)["params"]
    for name in ("layer_overhead_s", "layer_step_overhead_s", "microbatch_overhead_s", "step_overhead_s"):
        assert fitted[name] == pytest.approx(getattr(truth, name), rel=1e-6, abs=1e-12), name
    # the once-a-step part is charged once a step: with 3 micro-batches the step grows by 3 per-micro-batch parts
    params = CostParams.from_dict({**DEFAULT_PARAMS.to_dict(), **base["params"], **fitted})
    one, three = (planned_run_seconds(spec, layouts["plain"], device, links, params, 32, high, m) -
                  planned_run_seconds(spec, layouts["plain"], device, links, params, 32, low, m) for m in (1, 3))
    plain = host["plain"]
    assert one == pytest.approx(plain[f"{high}x1"] - plain[f"{low}x1"], rel=1e-6)
    assert three == pytest.approx(plain[f"{high}x3"] - plain[f"{low}x3"], rel=1e-6)
    # without the five-layer run of three micro-batches (a profile from before) all of it is per micro-batch
    old = {**host, "plain": {k: v for k, v in host["plain"].items() if k != f"{high}x{HOST_MICRO_BATCHES}"}}
    fitted = calibration_fields(_raw(old), None, 1.0, 8e9, spec)["params"]
    assert fitted.get("layer_step_overhead_s", 0.0) == 0.0
    assert fitted["layer_overhead_s"] == pytest.approx(truth.layer_overhead_s + truth.layer_step_overhead_s, rel=1e-6)


def test_the_per_token_work_of_a_layer_is_written_as_element_wise_passes():
    """Forward-and-backward times made by the planner with 60 more element-wise passes (and host time per
    micro-batch, which the difference of two token counts cancels): the fit gives the passes back; times
    the planner already explains add none; a machine faster than the planner keeps the default (never
    fewer); the range's top caps a wild measurement."""
    spec = host_overhead_spec(TINY)
    base = calibration_fields(_raw(), None, 1.0, 8e9)
    device, links = cpu_device(base["gpu_overrides"]), base["cluster_overrides"]
    start = CostParams.from_dict({**DEFAULT_PARAMS.to_dict(), **base["params"]})
    truth = dataclasses.replace(start, elementwise_passes=start.elementwise_passes + 60.0, layer_overhead_s=2e-3)

    def timed(params: CostParams, scale: float = 1.0) -> dict:
        return {"seq_len": 32, "batches": list(BLOCK_BATCHES),
                **{f"{layers}x{b}": scale * planned_run_seconds(spec, f"dp=1,mbs={b}", device, links, params, 32, layers)
                   for layers in HOST_LAYERS for b in BLOCK_BATCHES}}

    assert block_passes(timed(truth), spec, device, links, start) == pytest.approx(truth.elementwise_passes, rel=1e-9)
    assert block_passes(timed(start), spec, device, links, start) == pytest.approx(start.elementwise_passes, abs=1e-9)
    assert block_passes(timed(start, 0.5), spec, device, links, start) == start.elementwise_passes
    assert block_passes(timed(truth, 50.0), spec, device, links, start) == 1000.0
    # a profile that timed the blocks writes the passes, and says so
    raw = _raw()
    raw["block_s"] = timed(truth)
    fields = calibration_fields(raw, None, 1.0, 8e9, spec)
    assert fields["params"]["elementwise_passes"] == pytest.approx(truth.elementwise_passes, rel=1e-9)
    assert any("elementwise_passes written as" in note for note in fields["notes"])


def test_host_time_terms_count_per_layer_and_micro_batch_and_only_where_the_mechanism_runs():
    cluster = get_cluster("dgx-h100").with_gpus(2)
    cluster = dataclasses.replace(cluster, gpus_per_node=2)
    job = JobSpec(global_batch=8, seq_len=128)
    params = dataclasses.replace(DEFAULT_PARAMS, layer_overhead_s=1e-3, tp_layer_overhead_s=10e-3,
                                 cp_layer_overhead_s=100e-3, fsdp_layer_overhead_s=1000e-3,
                                 sac_layer_overhead_s=10000e-3)
    layers = TINY.n_layers

    def extra(text: str, ckpt_layers: float = 0.0) -> float:
        layout = Layout.parse(text)
        with_host = estimate_step(TINY, cluster, job, layout, params)
        without = estimate_step(TINY, cluster, job, layout, DEFAULT_PARAMS)
        return (with_host.overhead - without.overhead) / layout.micro_batches(job.global_batch)

    assert extra("dp=2,mbs=2") == pytest.approx(layers * 1e-3)  # DDP: the plain layer only
    assert extra("tp=2,mbs=4") == pytest.approx(layers * 11e-3)
    assert extra("cp=2,mbs=4") == pytest.approx(layers * 101e-3)
    assert extra("dp=2,mbs=2,zero=2") == pytest.approx(layers * 1001e-3)
    assert extra("dp=2,mbs=2,ckpt=full") == pytest.approx((layers + layers / 3) * 1e-3)  # forward again
    assert extra("dp=2,mbs=2,ckpt=balanced") == pytest.approx(layers * 10001e-3)  # per checkpointed layer
    assert extra("dp=2,mbs=2,ckpt=balanced,ckpt_layers=1") == pytest.approx(layers * 1e-3 + 10000e-3)
    assert extra("dp=2,mbs=2,ckpt=selective") == pytest.approx(layers * 1e-3)  # no policy asked per op
    # the defaults (every GPU plan) carry no host time
    assert all(getattr(DEFAULT_PARAMS, n) == 0.0 for n in ("layer_overhead_s", *MECHANISM_PARAMS.values(),
                                                           *ENDS_PARAMS.values()))


def test_host_time_at_the_ends_counts_once_per_micro_batch_on_the_last_stage():
    """tp / cp / FSDP2 host time outside the layers: once per micro-batch wherever the mechanism
    runs, whatever the layer count; under pipelining on the last stage only: per micro-batch the
    step grows by it once (the slowest stage) and by the 1F1B bubble's (p-1)/m average stages,
    each holding 1/p of it."""
    cluster = dataclasses.replace(get_cluster("dgx-h100").with_gpus(2), gpus_per_node=2)
    job = JobSpec(global_batch=8, seq_len=128)
    params = dataclasses.replace(DEFAULT_PARAMS, tp_ends_overhead_s=10e-3, cp_ends_overhead_s=100e-3,
                                 fsdp_ends_overhead_s=1000e-3)

    def extra(text: str, model=TINY, gpus: int = 2) -> float:
        layout, on = Layout.parse(text), dataclasses.replace(cluster.with_gpus(gpus), gpus_per_node=gpus)
        with_host = estimate_step(model, on, job, layout, params)
        without = estimate_step(model, on, job, layout, DEFAULT_PARAMS)
        assert with_host.overhead - without.overhead == pytest.approx(with_host.step_time - without.step_time
                                                                      - (with_host.bubble - without.bubble))
        return (with_host.step_time - without.step_time) / layout.micro_batches(job.global_batch)

    assert extra("dp=2,mbs=2") == 0.0  # DDP: no mechanism at the ends
    assert extra("tp=2,mbs=4") == pytest.approx(10e-3)
    assert extra("tp=2,mbs=4", dataclasses.replace(TINY, n_layers=2 * TINY.n_layers)) == pytest.approx(10e-3)
    assert extra("cp=2,mbs=4") == pytest.approx(100e-3)
    assert extra("dp=2,mbs=2,zero=3") == pytest.approx(1000e-3)
    assert extra("dp=2,mbs=2,zero=2,ckpt=full") == pytest.approx(1000e-3)  # not recomputed: outside the layers
    # pp=2 with tp=2: on the last stage; the 1F1B bubble, (p-1) average stages, adds 1/p of it
    assert extra("pp=2,mbs=1", gpus=2) == 0.0
    m = Layout.parse("pp=2,tp=2,mbs=1").micro_batches(job.global_batch)
    assert extra("pp=2,tp=2,mbs=1", gpus=4) == pytest.approx(10e-3 * (1 + (2 - 1) / (2 * m)))


def test_element_bytes_prices_the_compute_dtype():
    """fp32 (a CPU) moves twice the element-wise bytes of bf16 and sends twice the TP activations."""
    gpu = get_cluster("dgx-h100").gpu
    fp32 = dataclasses.replace(gpu, element_bytes=4.0, kernel_overhead=0.0)
    bf16 = dataclasses.replace(gpu, kernel_overhead=0.0)
    times = [layer_times(TINY, g, DEFAULT_PARAMS, 1024.0, 128, 1, 1, False, "flash", "bf16") for g in (bf16, fp32)]
    assert times[1].elementwise_fwd == pytest.approx(2 * times[0].elementwise_fwd)
    cluster = dataclasses.replace(get_cluster("dgx-h100").with_gpus(2), gpus_per_node=2, intra_node_latency=0.0)
    params = dataclasses.replace(DEFAULT_PARAMS, tp_comm_overlap=0.0)
    job, layout = JobSpec(global_batch=8, seq_len=128), Layout.parse("tp=2,mbs=8")
    tp = [estimate_step(TINY, dataclasses.replace(cluster, gpu=g), job, layout, params).tp_comm for g in (bf16, fp32)]
    assert tp[1] == pytest.approx(2 * tp[0])


def test_calibration_records_processes_and_threads_and_says_when_runs_differ(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"device": "cpu", "gpu": None, "params": {}, "processes_per_node": 2,
                                "threads_per_process": 1}))
    calibration = read_calibration(path)
    assert (calibration.processes_per_node, calibration.threads_per_process) == (2, 1)
    assert calibration.process_mismatch(2, 1) == ""
    line = calibration.process_mismatch(1, 2)
    assert "2 process(es) x 1 thread(s)" in line and "1 x 2" in line and "--nproc-per-node 1" in line
    assert calibration.process_mismatch(2, 2) != ""  # same processes, other threads
    path.write_text(json.dumps({"device": "cpu", "params": {}, "threads_per_process": 0}))
    with pytest.raises(Exception, match="threads_per_process.*positive whole number"):
        read_calibration(path)
    path.write_text(json.dumps({"device": "cpu", "params": {}}))  # older files say nothing: no warning
    assert read_calibration(path).process_mismatch(1, 2) == ""
