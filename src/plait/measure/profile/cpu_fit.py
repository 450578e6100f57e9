"""What a CPU profile writes beyond kernel rates and links: the CPU as plait's runtime uses it. No torch.

plait's runtime trains in fp32 on a CPU (no autocast, no FSDP mixed-precision policy), allocates
through torch's CPU allocator (no CUDA context, no NCCL buffers, no caching reserve) and runs each
op as it is dispatched. So a CPU profile writes:

- ``gpu_overrides.element_bytes`` = 4 (the profile's dtype: activations, GEMM operands and
  gathered weights in fp32);
- ``params.cuda_context_bytes`` = ``comm_buffer_bytes`` = ``fragmentation`` = 0;
- ``params.dp_overlap``, ``offload_overlap`` and ``cp_comm_overlap`` = the measured fraction of communication that hid
  behind compute (``raw["overlap"]["hidden"]``, ``plait.measure.profile.runtime_cost.overlap``), and
  ``tp_comm_overlap`` = the smaller of that and its default (the runtime's tensor-parallel
  collectives can hide no better than the device allows);
- ``params.layer_overhead_s`` = the plain blocks' measured seconds per layer (forward +
  backward, ``raw["layer_host_s"]``) less the planner's own per-layer time for the same model,
  tokens and layout (``plait.plan.cost.estimate_step`` at 3 and 1 layers on the CPU just
  described), at least 0; then ``tp_``, ``cp_`` and ``fsdp_layer_overhead_s`` the same way for
  the blocks run through the runtime's training step under the mechanism's layout over every
  rank (with ``layer_overhead_s`` already in the planner's time): what the planner's kernel and
  communication terms leave unexplained, per layer and micro-batch.
"""

from __future__ import annotations

import dataclasses

from plait.plan.cost import estimate_step
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.hardware import GpuSpec, get_cluster
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec

# the cost parameter that holds each mechanism's unexplained host time (runtime_cost.layer_host_seconds)
MECHANISM_PARAMS = {"tp": "tp_layer_overhead_s", "cp": "cp_layer_overhead_s", "fsdp": "fsdp_layer_overhead_s"}

ELEMENT_BYTES = {"float32": 4.0, "bfloat16": 2.0}


def cpu_device(gpu_overrides: dict) -> GpuSpec:
    """The CPU of a profile's ``gpu_overrides`` as a GpuSpec (no fp8; capacity 1 byte if unknown)."""
    fields = {k: v for k, v in gpu_overrides.items() if k not in ("bf16_flops", "hbm_bytes", "hbm_bandwidth")}
    return GpuSpec(name="cpu", bf16_flops=gpu_overrides["bf16_flops"], fp8_flops=0.0,
                   hbm_bytes=gpu_overrides.get("hbm_bytes", 1.0), hbm_bandwidth=gpu_overrides["hbm_bandwidth"],
                   **fields)


def planned_layer_seconds(spec: ModelSpec, layout_text: str, device: GpuSpec, cluster_overrides: dict,
                          params: CostParams, seq_len: int) -> float:
    """The planner's seconds per layer of ``spec`` under ``layout_text`` (forward + backward, one
    micro-batch of ``mbs`` sequences of ``seq_len`` per data-parallel rank): the difference of its
    step time at 3 and 1 layers, halved, on one node of the layout's processes with this device."""
    layout = Layout.parse(layout_text)
    world = layout.world_size
    cluster = dataclasses.replace(get_cluster("dgx-h100").with_gpus(world), gpus_per_node=world, gpu=device,
                                  **cluster_overrides)
    job = JobSpec(global_batch=layout.mbs * layout.dp, seq_len=seq_len)
    steps = [estimate_step(dataclasses.replace(spec, n_layers=n), cluster, job, layout, params).step_time
             for n in (1, 3)]
    return (steps[1] - steps[0]) / 2


def cpu_device_params(raw: dict, gpu_overrides: dict, cluster_overrides: dict, params: dict,
                      host_spec: ModelSpec | None) -> tuple[dict, dict, list[str]]:
    """(params to write, fits to record, notes) of a CPU profile; ``gpu_overrides`` gains element_bytes.

    ``params``: the params fitted so far (GEMM curve, attention backward), used for the planner's
    kernel time of the timed block.
    """
    gpu_overrides["element_bytes"] = ELEMENT_BYTES[raw.get("dtype", "float32")]
    out = {"cuda_context_bytes": 0.0, "comm_buffer_bytes": 0.0, "fragmentation": 0.0}
    fits: dict = {}
    notes = []
    overlap = raw.get("overlap")
    if overlap:
        hidden = overlap["hidden"]
        out.update(dp_overlap=hidden, offload_overlap=hidden, cp_comm_overlap=hidden,
                   tp_comm_overlap=min(DEFAULT_PARAMS.tp_comm_overlap, hidden))
        fits["overlap_hidden"] = hidden
        notes.append(f"{hidden:.0%} of an all-reduce hid behind GEMMs running at the same time: dp_overlap, "
                     "offload_overlap and cp_comm_overlap written as that, tp_comm_overlap as at most that")
    host = raw.get("layer_host_s")
    if host and host_spec is not None:
        device = cpu_device(gpu_overrides)
        current = CostParams.from_dict({**DEFAULT_PARAMS.to_dict(), **params, **out})
        planned = {"plain": planned_layer_seconds(host_spec, "dp=1", device, cluster_overrides, current, host["tokens"])}
        out["layer_overhead_s"] = max(0.0, host["plain"] - planned["plain"])
        current = dataclasses.replace(current, layer_overhead_s=out["layer_overhead_s"])
        for mechanism, layout_text in host.get("layouts", {}).items():
            planned[mechanism] = planned_layer_seconds(host_spec, layout_text, device, cluster_overrides, current,
                                                       host["tokens"])
            out[MECHANISM_PARAMS[mechanism]] = max(0.0, host[mechanism] - planned[mechanism])
        fits["layer_host"] = {**host, "planned_s": planned}
        extra = ", ".join(f"{m} +{1e3 * out[MECHANISM_PARAMS[m]]:.2f} ms" for m in host.get("layouts", {}))
        notes.append(f"runtime host time per layer and micro-batch ({host['spec']} blocks, {host['tokens']} tokens) "
                     f"beyond the planner's terms: {1e3 * out['layer_overhead_s']:.2f} ms"
                     + (f"; {extra}" if extra else ""))
    return out, fits, notes
