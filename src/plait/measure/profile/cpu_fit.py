"""What a CPU profile writes beyond kernel rates and links: the CPU as plait's runtime uses it. No torch.

plait's runtime trains in fp32 on a CPU (no autocast, no FSDP mixed-precision policy), allocates
through torch's CPU allocator (no CUDA context, no NCCL buffers, no caching reserve) and runs each
op as it is dispatched. So a CPU profile writes:

- ``gpu_overrides.element_bytes`` = 4 (the profile's dtype: activations, GEMM operands and
  gathered weights in fp32);
- ``params.cuda_context_bytes`` = ``comm_buffer_bytes`` = ``fragmentation`` = 0;
- ``params.dp_overlap``, ``offload_overlap`` and ``cp_comm_overlap`` = the measured fraction of communication that hid
  behind compute: the mean over the trials of ``plait.measure.profile.runtime_cost.overlap``
  (``overlap_hidden``; a profile without trials: its ``raw["overlap"]["hidden"]``), and
  ``tp_comm_overlap`` = the smaller of that and its default (the runtime's tensor-parallel
  collectives can hide no better than the device allows);
- ``params.overlap_slowdown`` = 1 - the fraction of a DDP gradient bucket's all-reduce (25 MiB,
  or the profiled model's whole fp32 gradient if smaller, ``raw["overlap_buckets"]``) that hid
  behind GEMMs three times as long. What a collective "hidden" behind compute still costs: on a
  GPU the SMs and HBM it shares (0.05 by default), on a CPU the cores - gloo's reduction and the
  kernel's copies run on the cores the compute needs, the more so the larger the message (on the
  2-core VM of ``bench/results/cpu_loop.md`` 1 MiB all-reduces hid 0.59-0.66 of their time, 4 MiB
  ones 0.31, 25 MiB ones 0.16-0.17). With a backward longer than its gradient traffic, the
  planner's exposed data-parallel time is then that rest of the traffic (``plait.plan.terms.overlap``);
- from the short ``plait train`` runs timed by ``runtime_cost.layer_host_seconds`` (data
  parallelism alone, "plain", and one layout per mechanism, with 5 and 1 layers, and plain with
  more micro-batches), each less the planner's own step time for the same run
  (``plait.plan.cost.estimate_step`` on the CPU just described), in this order, each fitted term
  in the planner's time for the next: ``params.layer_overhead_s`` (per layer and micro-batch) and
  ``layer_step_overhead_s`` (per layer, once a step: from plain runs with ``HOST_MICRO_BATCHES``
  micro-batches at both layer counts), ``microbatch_overhead_s``, ``step_overhead_s``, then ``tp_``, ``cp_``, ``fsdp_`` and
  ``sac_layer_overhead_s`` (per layer and micro-batch under that mechanism), then ``tp_``, ``cp_``
  and ``fsdp_ends_overhead_s`` (what that mechanism's one-layer run leaves after all of these: its
  cost outside the layers, which the difference of two layer counts cancels); none below 0. What
  the planner's kernel and communication terms leave unexplained: the runtime's host time. An
  optimizer's per-layer cost and the gradient sync's exposed rest are in ``layer_step_overhead_s``
  (a step has one, whatever its micro-batches), their cost over the embedding and head in the
  ends terms;
- before those, ``params.elementwise_passes`` from ``runtime_cost.block_seconds`` (one forward and
  backward of the blocks at ``BLOCK_BATCHES`` sequences, timed in one process): the per-token work
  of a layer that the kernel terms leave unexplained (``block_passes``).
"""

from __future__ import annotations

import dataclasses
import statistics

from plait.plan.cost import estimate_step
from plait.plan.params import DEFAULT_PARAMS, HOST_ENDS_PARAMS, HOST_LAYER_PARAMS, PARAM_RANGES, CostParams
from plait.spec.hardware import GpuSpec, get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.units import MIB

# layer counts of the runs runtime_cost.layer_host_seconds times (per layer: their difference), and
# the micro-batches of the plain runs it times again (both layer counts: what a layer costs once a step)
HOST_LAYERS = (1, 5)
HOST_MICRO_BATCHES = 3
# the sequences per forward and backward of runtime_cost.block_seconds (two token counts: the per-token
# work of a layer) and how many times each is timed (median)
BLOCK_BATCHES = (1, 8)
BLOCK_REPEATS = 15
# the cost parameters that hold each mechanism's unexplained host time (runtime_cost.layer_host_seconds):
# per layer, and at the model's ends
MECHANISM_PARAMS = HOST_LAYER_PARAMS
ENDS_PARAMS = HOST_ENDS_PARAMS

ELEMENT_BYTES = {"float32": 4.0, "bfloat16": 2.0}


def cpu_device(gpu_overrides: dict) -> GpuSpec:
    """The CPU of a profile's ``gpu_overrides`` as a GpuSpec (no fp8; capacity 1 byte if unknown)."""
    fields = {k: v for k, v in gpu_overrides.items() if k not in ("bf16_flops", "hbm_bytes", "hbm_bandwidth")}
    return GpuSpec(name="cpu", bf16_flops=gpu_overrides["bf16_flops"], fp8_flops=0.0,
                   hbm_bytes=gpu_overrides.get("hbm_bytes", 1.0), hbm_bandwidth=gpu_overrides["hbm_bandwidth"],
                   **fields)


def planned_run_seconds(spec: ModelSpec, layout_text: str, device: GpuSpec, cluster_overrides: dict,
                        params: CostParams, seq_len: int, layers: int, micro_batches: int = 1) -> float:
    """The planner's step time of a run ``runtime_cost.layer_host_seconds`` times: ``spec`` with
    ``layers`` layers under ``layout_text``, ``micro_batches`` micro-batches of ``mbs`` sequences of
    ``seq_len`` per data-parallel rank, on one node of the layout's processes with this device."""
    layout = Layout.parse(layout_text)
    world = layout.world_size
    cluster = dataclasses.replace(get_cluster("dgx-h100").with_gpus(world), gpus_per_node=world, gpu=device,
                                  **cluster_overrides)
    job = JobSpec(global_batch=layout.mbs * layout.dp * micro_batches, seq_len=seq_len)
    return estimate_step(dataclasses.replace(spec, n_layers=layers), cluster, job, layout, params).step_time


def host_params(host: dict, spec: ModelSpec, device: GpuSpec, cluster_overrides: dict,
                params: CostParams) -> tuple[dict, dict]:
    """(params, planned seconds) from ``raw["layer_host_s"]``: each host term is the measured time
    less the planner's for the same run, with the terms fitted before it in the planner's time
    (plain per layer, split into per micro-batch and once per step by the runs with three
    micro-batches; then per micro-batch, then per step, then each mechanism per layer, then each
    mechanism at the ends), at least 0. A profile without the five-layer run with three micro-batches
    (older) charges all of a layer per micro-batch."""
    tokens, layouts = host["tokens"], host["layouts"]
    zero = {name: 0.0 for name in ("layer_overhead_s", "layer_step_overhead_s", "microbatch_overhead_s", "step_overhead_s",
                                   *MECHANISM_PARAMS.values(), *ENDS_PARAMS.values())}
    current = dataclasses.replace(params, **zero)
    out, planned = {}, {}

    def plan(mechanism: str, layers: int, micro_batches: int = 1) -> float:
        seconds = planned_run_seconds(spec, layouts[mechanism], device, cluster_overrides, current, tokens,
                                      layers, micro_batches)
        planned[f"{mechanism} {layers}x{micro_batches}"] = seconds
        return seconds

    low, high = HOST_LAYERS
    span = high - low

    def per_layer(mechanism: str, micro_batches: int = 1) -> float:
        timed, key = host[mechanism], f"x{micro_batches}"
        return (timed[f"{high}{key}"] - timed[f"{low}{key}"]
                - (plan(mechanism, high, micro_batches) - plan(mechanism, low, micro_batches))) / span

    plain = host["plain"]
    one = per_layer("plain")
    if f"{high}x{HOST_MICRO_BATCHES}" in plain:  # what a layer costs once a step, not per micro-batch
        per_mb = max(0.0, (per_layer("plain", HOST_MICRO_BATCHES) - one) / (HOST_MICRO_BATCHES - 1))
        out["layer_overhead_s"] = min(max(0.0, one), per_mb)
        out["layer_step_overhead_s"] = max(0.0, one - out["layer_overhead_s"])
    else:  # a profile from before: all of it per micro-batch
        out["layer_overhead_s"] = max(0.0, one)
    current = dataclasses.replace(current, **out)
    extra = HOST_MICRO_BATCHES - 1
    out["microbatch_overhead_s"] = max(0.0, (plain[f"{low}x{HOST_MICRO_BATCHES}"] - plain[f"{low}x1"]
                                             - (plan("plain", low, HOST_MICRO_BATCHES) - plan("plain", low))) / extra)
    current = dataclasses.replace(current, **out)
    out["step_overhead_s"] = max(0.0, plain[f"{low}x1"] - plan("plain", low))
    current = dataclasses.replace(current, **out)
    for mechanism, name in MECHANISM_PARAMS.items():
        if mechanism in layouts:
            out[name] = max(0.0, per_layer(mechanism))
    current = dataclasses.replace(current, **out)
    for mechanism, name in ENDS_PARAMS.items():
        if mechanism in layouts:  # the one-layer run less everything above, its layer's term included
            out[name] = max(0.0, host[mechanism][f"{low}x1"] - plan(mechanism, low))
    return out, planned


def block_passes(block: dict, spec: ModelSpec, device: GpuSpec, cluster_overrides: dict, params: CostParams) -> float:
    """``CostParams.elementwise_passes`` such that the planner's per-layer time grows from the fewer tokens of
    ``block`` (``runtime_cost.block_seconds``) to the more as the timed forward and backward did: ``params``'s
    passes plus the growth the planner leaves unexplained over the growth one more pass gives; never fewer
    than ``params``'s, at most the range's top. On a CPU the eager element-wise ops (each allocating its
    output, one pass over memory each) and the small GEMMs of the backward run slower per token than the
    kernel terms price them."""
    low, high = HOST_LAYERS
    few, many = block["batches"][0], block["batches"][-1]

    def per_layer(batch: int) -> float:
        return (block[f"{high}x{batch}"] - block[f"{low}x{batch}"]) / (high - low)

    def planned_growth(p: CostParams) -> float:
        runs = {(batch, layers): planned_run_seconds(spec, f"dp=1,mbs={batch}", device, cluster_overrides, p,
                                                     block["seq_len"], layers)
                for batch in (few, many) for layers in (low, high)}
        return ((runs[many, high] - runs[many, low]) - (runs[few, high] - runs[few, low])) / (high - low)

    measured = per_layer(many) - per_layer(few)
    planned = planned_growth(params)
    per_pass = planned_growth(dataclasses.replace(params, elementwise_passes=params.elementwise_passes + 1.0)) - planned
    extra = max(0.0, (measured - planned) / per_pass) if per_pass > 0 else 0.0
    return min(params.elementwise_passes + extra, PARAM_RANGES["elementwise_passes"].high)


def overlap_hidden(trials: list[dict]) -> float:
    """The fraction of communication that hides behind compute, from the overlap trials (each with
    its ``hidden`` fraction, 0..1): their mean. On a CPU whose processes and collective threads
    share the cores a trial hides nearly all or nearly nothing (this 2-core VM: 0.0, 0.02, 0.05 ...
    0.8, 0.91, 1.0 in one profile), so a median of a few trials jumps between the two modes (0.29
    and 0.66 in two profiles an hour apart), while a step's many collectives add up to the mean."""
    if not trials:
        raise ValueError("no overlap trials")
    return statistics.fmean(min(1.0, max(0.0, float(t["hidden"]))) for t in trials)


def measured_hidden(overlap: dict) -> float:
    """The hidden fraction of one overlap benchmark (``runtime_cost.overlap``): the mean of its trials
    (``overlap_hidden``), or its recorded ``hidden`` (a profile without trials)."""
    return overlap_hidden(overlap["trials"]) if overlap.get("trials") else overlap["hidden"]


def cpu_device_params(raw: dict, gpu_overrides: dict, cluster_overrides: dict, params: dict,
                      host_spec: ModelSpec | None) -> tuple[dict, dict, list[str]]:
    """(params to write, fits to record, notes) of a CPU profile; ``gpu_overrides`` gains element_bytes.

    ``params``: the params fitted so far (GEMM curve, attention backward); with ``gpu_overrides`` and
    ``cluster_overrides`` they make the planner's time of each timed run (``host_params``).
    """
    gpu_overrides["element_bytes"] = ELEMENT_BYTES[raw.get("dtype", "float32")]
    out = {"cuda_context_bytes": 0.0, "comm_buffer_bytes": 0.0, "fragmentation": 0.0}
    fits: dict = {}
    notes = []
    overlap = raw.get("overlap")
    if overlap:
        hidden = measured_hidden(overlap)
        out.update(dp_overlap=hidden, offload_overlap=hidden, cp_comm_overlap=hidden,
                   tp_comm_overlap=min(DEFAULT_PARAMS.tp_comm_overlap, hidden))
        fits["overlap_hidden"] = hidden
        notes.append(f"{hidden:.0%} of an all-reduce hid behind GEMMs running at the same time: dp_overlap, "
                     "offload_overlap and cp_comm_overlap written as that, tp_comm_overlap as at most that")
    buckets = raw.get("overlap_buckets")
    if buckets:
        hidden = measured_hidden(buckets)
        out["overlap_slowdown"] = 1.0 - hidden
        fits["overlap_buckets_hidden"] = hidden
        notes.append(f"{hidden:.0%} of a {buckets['reduce_bytes'] / MIB:.3g} MiB all-reduce (a DDP gradient bucket) "
                     "hid behind longer compute: overlap_slowdown written as the rest")
    block = raw.get("block_s")
    if block and host_spec is not None:  # the per-token work, before the host terms (they take the rest)
        current = CostParams.from_dict({**DEFAULT_PARAMS.to_dict(), **params, **out})
        out["elementwise_passes"] = block_passes(block, host_spec, cpu_device(gpu_overrides), cluster_overrides, current)
        fits["block"] = block
        notes.append(f"a layer's forward and backward at {block['batches'][0]} and {block['batches'][-1]} sequences of "
                     f"{block['seq_len']} tokens: elementwise_passes written as {out['elementwise_passes']:.0f} "
                     f"(the per-token work the kernel terms leave unexplained)")
    host = raw.get("layer_host_s")
    if host and host_spec is not None and "plain" in host:
        current = CostParams.from_dict({**DEFAULT_PARAMS.to_dict(), **params, **out})
        fitted, planned = host_params(host, host_spec, cpu_device(gpu_overrides), cluster_overrides, current)
        out.update(fitted)
        fits["layer_host"] = {**host, "planned_s": planned}
        extra = ", ".join(f"{m} +{1e3 * out[MECHANISM_PARAMS[m]]:.2f} ms"
                          + (f" and +{1e3 * out[ENDS_PARAMS[m]]:.2f} ms at the ends" if m in ENDS_PARAMS else "")
                          for m in MECHANISM_PARAMS if m in host)
        notes.append(f"runtime host time beyond the planner's terms ({host['spec']} blocks, {host['tokens']} tokens): "
                     f"{1e3 * out['layer_overhead_s']:.2f} ms per layer and micro-batch, "
                     f"{1e3 * out.get('layer_step_overhead_s', 0.0):.2f} ms per layer and step"
                     + (f" ({extra})" if extra else "")
                     + f", {1e3 * out['microbatch_overhead_s']:.2f} ms per micro-batch, "
                     f"{1e3 * out['step_overhead_s']:.2f} ms per step")
    return out, fits, notes
