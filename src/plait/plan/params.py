"""The cost model's few physical parameters, with their defaults and where they come from.

One set of defaults serves every model, GPU and layout (no per-run tuning). A calibration file
(``plait profile`` / ``plait calibrate fit``) may replace any of them; per-GPU efficiencies live
in ``GpuSpec`` and can be overridden the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from plait.errors import PlaitError
from plait.spec.hardware import H100_500W_DERATE, OP_BANDWIDTH_FACTORS
from plait.spec.units import GIB, MIB_BYTES
from plait.spec.serialize import dataclass_from_dict


# PyTorch's F.cross_entropy on fp32 logits at its peak, bytes per logit: the saved log-softmax, nll_loss's
# gradient and the log-softmax's input gradient, all fp32, whatever the compute dtype (CostParams.loss_peak_bytes)
FP32_LOSS_BYTES = 12.0


@dataclass(frozen=True)
class CostParams:
    """Attributes (units in the names):

    gemm_half_flops: a GEMM of this many FLOPs reaches half of the large-GEMM efficiency
        (small GEMMs under-fill the SMs: efficiency = e_max · F / (F + gemm_half_flops)).
    gemm_bandwidth_factor: a GEMM streams its operands at this multiple of the device's
        ``hbm_bandwidth · memory_efficiency`` (the bytes side of ``plait.plan.kernels.gemm_time``'s
        roofline) = 1.0; ``plait profile`` fits it with the GEMM curve (on a CPU, operands that
        stay in cache stream faster than a copy).
    flash_backward_factor: FlashAttention backward time over forward time (the backward
        re-computes the scores: 5 matmuls against 2, plus atomics) = 2.5.
    elementwise_passes: bytes moved by the element-wise kernels of one layer's forward, in
        units of s·b·h·2 bytes (norms, residual adds, activation function, RoPE / bias, dropout,
        dtype casts, layout copies for attention); the backward moves twice as much. PyTorch
        eager with an fp32 RMSNorm and complex RoPE moves ~80, fully fused kernels ~20; 45 is a
        partly fused implementation (fitted on the published runs).
    tp_comm_overlap: fraction of the backward tensor-parallel communication hidden behind the
        weight-gradient GEMMs (Megatron's async all-reduce / torch's async TP).
    tp_forward_overlap: fraction of the forward tensor-parallel communication hidden behind the
        GEMMs it feeds or follows, at most 1 - 1/tp: software that splits each all-gather /
        reduce-scatter into tp chunks pipelined with the GEMM (Transformer Engine's userbuffers,
        torch's micro-pipelined async TP) hides all chunks but the first; 0 (the default): the
        forward waits for every collective, as plait's runtime without ``--async-tp`` does.
    pp_comm_overlap: fraction of the interleaved schedule's (vpp > 1) pipeline send/recv hidden behind
        the stage's compute (0: plait's runtime waits for each transfer; Megatron-Core posts them
        early, ``overlap_p2p_comm``, which it runs only with virtual stages).
    dp_overlap: fraction of the backward (or forward, for ZeRO-3 gathers) compute time during
        which data-parallel communication can run hidden.
    overlap_slowdown: compute slowdown while a collective shares the SMs and HBM with it.
    grad_reduce_bytes: bytes per gradient element in data-parallel reductions (fp32).
    optimizer_bytes_per_param: HBM traffic of the fused Adam step per local parameter.
    cpu_adam_params_per_s: host Adam throughput per GPU's share of the host (optimizer offload).
    disk_bandwidth: activation offload to local NVMe, bytes/s per GPU.
    step_overhead_s: fixed per-step cost (data loader, logging, launch gaps).
    microbatch_overhead_s: fixed cost per micro-batch per pipeline stage (python, launch gaps).
    cuda_context_bytes: CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers per GPU.
    fragmentation: caching-allocator reserve over the dynamic (activation) memory, as a fraction.
    logits_bytes_per_element: bf16 logits + fp32 log-softmax + fp32 gradient at the loss (the
        loss's memory at its peak, and half its HBM traffic, ``plait.plan.kernels.head_time``).
    loss_peak_bytes: bytes per logit the software's loss keeps at its peak. PyTorch's
        ``F.cross_entropy`` on the fp32 copy of the logits (plait's ``loss=unfused``, torchtitan):
        12, the saved fp32 log-softmax, nll_loss's dense fp32 gradient and the log-softmax's fp32 input
        gradient, alive together in the backward while the bf16 logits are gone (counted in
        tests/plan/test_loss_peak.py; the first GPU proof's eager sweep and torchtitan's reported
        memory ran above the 10 counted before). A fused cross entropy that keeps the bf16 logits and
        writes their gradient in place: 2. 0: ``logits_bytes_per_element``'s count, its logits in the
        compute dtype (the Megatron stacks). Memory only: the loss's traffic stays priced by
        ``logits_bytes_per_element``.
    fp8_gemm_efficiency: fraction of the fp8 (or fp4) peak that low-precision GEMMs reach on a
        part at its full power (``GpuSpec.power_derate`` scales it for a power-capped one). The
        default, torchao's float8 (plait's runtime and torchtitan, casts included): 0.5 was chosen
        on torchtitan's float8 runs, all on Grand Teton's 500 W H100 (derate 0.85), so 0.5 / 0.85.
    fp8_cast_passes: extra element-wise traffic of a layer's forward under fp8/mxfp8/nvfp4, in the
        units of ``elementwise_passes`` (the amax and cast of each linear's inputs, and in the
        backward of its output gradients and their transposes, when the software does not fuse them
        into the neighbouring kernels); 0: priced inside ``fp8_gemm_efficiency``.
    zero3_collective_bandwidth: bytes/s one GPU's ZeRO-3 parameter all-gathers and gradient
        reduce-scatters reach at most, whatever the links allow; 0: no such cap (the links' bus
        bandwidth, ``plait.plan.comm``: FSDP2's one collective per block does reach it). An
        implementation that gathers parameter by parameter with a host sync after each
        (DeepSpeed 0.3, 2021) runs far below its links: see ``plait.measure.validate.specs``.
    zero3_live_params: ZeRO-3's cap on gathered parameters (elements) for software that gathers
        module by module and stops prefetching at the cap (DeepSpeed's
        ``stage3_max_live_parameters``); 0: one transformer block per unit, two gathered at once
        (FSDP): ``plait.plan.states.zero3_buffer_params``.
    zero3_bucket_params: elements of unsharded gradients that such a ZeRO-3 collects before it
        reduce-scatters them (DeepSpeed's ``reduce_bucket_size``); used with ``zero3_live_params``.
    moe_load_imbalance: routed tokens of the most loaded expert-parallel rank over the mean (>= 1;
        1.0: balanced, as force-balanced benchmarks run; routers trained with an auxiliary loss
        stay within about 1.1-1.3): scales the expert GEMMs and the all-to-all (``plait.plan.moe.timing``).
    offload_overlap: fraction of a pass's compute that activation offload traffic can hide behind
        (1.0 on a GPU: the copies run on their own stream and copy engines; a CPU profile measures
        how much communication hides behind compute there and writes that).
    layer_overhead_s: host seconds per layer and micro-batch (forward and backward) of the
        runtime's module, autograd and dispatch machinery beyond the kernels' own launch overhead.
        0 on a GPU, where the host runs ahead of the kernels of any layer worth planning; a CPU
        executes each op as it is dispatched, so a CPU profile measures it (blocks at a few tokens,
        less the planner's own time for them: ``plait.measure.profile.cpu_fit``).
    layer_step_overhead_s: host seconds per layer and optimizer step (once, whatever the micro-batches)
        that the planner's optimizer and data-parallel terms leave unexplained: the optimizer's update
        of the layer's parameters and the gradient synchronisation's exposed rest as the runtime runs
        them. 0 on a GPU; a CPU profile measures it as the part of the per-layer time of one micro-batch
        that three micro-batches do not repeat (``plait.measure.profile.cpu_fit``).
    tp_layer_overhead_s: host seconds per layer and micro-batch that DTensor tensor parallelism
        adds at tp > 1 (sharding propagation, redistribution, the extra autograd nodes); 0 on a GPU
        (hidden, as above); a CPU profile measures it (``plait.measure.profile.runtime_cost``).
    fsdp_layer_overhead_s: host seconds per layer and micro-batch that FSDP2's hooks add (unshard,
        reshard, gradient reduction bookkeeping) where the runtime uses FSDP2
        (``Layout.uses_fsdp``); 0 on a GPU; measured by a CPU profile like ``tp_layer_overhead_s``.
    cp_layer_overhead_s: host seconds per layer and micro-batch that context parallelism adds at
        cp > 1 (the sequence shard's exchange loop around attention); 0 on a GPU; measured likewise.
    sac_layer_overhead_s: host seconds per checkpointed layer and micro-batch that torch's selective
        activation checkpointing adds where plait's runtime uses it (``ckpt=balanced``: a dispatch
        mode asks the save-or-recompute policy about every op of the layer, in the forward and again
        in the recompute); 0 on a GPU; measured by a CPU profile like ``tp_layer_overhead_s``.
    tp_ends_overhead_s, cp_ends_overhead_s, fsdp_ends_overhead_s: host seconds per micro-batch that
        the mechanism adds outside the layers, at the model's ends (tensor parallel: the
        vocab-parallel embedding, LM head and loss on DTensors; context parallel: sharding the
        sequence's tokens, positions and labels and the loss over the cp group; FSDP2: the hooks
        of its embedding and [final norm, LM head] units and of the root), where that mechanism
        runs; counted on the last pipeline stage (it holds the head). 0 on a GPU; a CPU profile
        measures each as its one-layer run's time less everything else the planner counts.
    cp_comm_overlap: fraction of the attention kernels that the context-parallel K/V exchange hides
        behind (1.0 on a GPU: the ring's next block travels while the current one is computed; a
        CPU profile writes its measured overlap).
    moe_launch_s: host seconds per kernel launch of the MoE block, each exposed because the dropless
        dispatcher's device-to-host sync of the token counts empties the GPU's queue
        (``plait.plan.moe.sync``: the launches counted per part, the sync and the token-count
        exchange priced from named numbers). FITTED on the published MoE runs (Megatron-Core):
        the one number of that term not read from a source; it holds the framework's whole
        per-op host path (Python module code, PyTorch dispatch, the CUDA launch).
    moe_router_graphed: fraction of the MoE layers whose router and dispatcher preprocessing run
        as CUDA graphs (Megatron's ``cuda_graph_scope`` ``moe_router`` and ``moe_preprocess``): their
        launches become one graph launch each way. 0 for plait's runtime; a row's recipe sets it.
    moe_layer_graphed: fraction of the MoE layers inside a whole-iteration CUDA graph (Megatron's
        ``cuda_graph_impl="full_iteration"`` with fixed-size expert buffers): no launches, no sync.
    compiled_blocks: share of the transformer blocks run under torch.compile (inductor): their
        element-wise work is what the fused regions read and write, counted from the model's shapes
        (``plait.plan.compiled``), instead of ``elementwise_passes``; 0: eager (the default of the
        Python API). ``plait plan`` / ``plait sweep`` set it from the compile setting (``with_compile``:
        plait's runtime compiles on CUDA by default); a stack declares its software's default
        (torchtitan: 0), a published row's notes set it (``plait.measure.validate.compiled``).
    compile_rules: 1: the software compiles only layouts that break no rule of ``plait train
        --compile`` (plait's runtime, ``plait.spec.capabilities.compile_enabled``), the others are
        priced eager; 0: ``compiled_blocks`` holds for every layout.
    """

    gemm_half_flops: float = 2.0e9
    gemm_bandwidth_factor: float = 1.0
    flash_backward_factor: float = 2.5
    elementwise_passes: float = 45.0
    tp_comm_overlap: float = 0.5
    tp_forward_overlap: float = 0.0
    pp_comm_overlap: float = 0.0
    dp_overlap: float = 0.8
    overlap_slowdown: float = 0.05
    grad_reduce_bytes: float = 4.0
    optimizer_bytes_per_param: float = 30.0
    cpu_adam_params_per_s: float = 1.0e9
    disk_bandwidth: float = 3.0e9
    step_overhead_s: float = 0.02
    microbatch_overhead_s: float = 2.0e-3
    cuda_context_bytes: float = 1.0 * GIB
    comm_buffer_bytes: float = 256 * MIB_BYTES
    fragmentation: float = 0.08
    logits_bytes_per_element: float = 10.0
    loss_peak_bytes: float = FP32_LOSS_BYTES
    fp8_gemm_efficiency: float = 0.50 / H100_500W_DERATE
    fp8_cast_passes: float = 0.0
    zero3_collective_bandwidth: float = 0.0
    zero3_live_params: float = 0.0
    zero3_bucket_params: float = 0.0
    moe_load_imbalance: float = 1.0
    moe_launch_s: float = 25e-6
    moe_router_graphed: float = 0.0
    moe_layer_graphed: float = 0.0
    compiled_blocks: float = 0.0
    compile_rules: float = 0.0
    offload_overlap: float = 1.0
    layer_overhead_s: float = 0.0
    layer_step_overhead_s: float = 0.0
    tp_layer_overhead_s: float = 0.0
    fsdp_layer_overhead_s: float = 0.0
    cp_layer_overhead_s: float = 0.0
    sac_layer_overhead_s: float = 0.0
    tp_ends_overhead_s: float = 0.0
    cp_ends_overhead_s: float = 0.0
    fsdp_ends_overhead_s: float = 0.0
    cp_comm_overlap: float = 1.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CostParams:
        try:
            values = {k: float(v) for k, v in data.items() if not isinstance(v, bool)}
        except (TypeError, ValueError, AttributeError):
            raise PlaitError(f"cost parameters must be numbers: {data!r}") from None
        if len(values) != len(data):
            raise PlaitError(f"cost parameters must be numbers, not true/false: {data!r}")
        params = dataclass_from_dict(cls, values, "cost parameter")
        check_ranges("params", values, PARAM_RANGES)
        return params


DEFAULT_PARAMS = CostParams()

# The runtime mechanisms whose host time a CPU profile measures (``plait.measure.profile.cpu_fit``)
# and the cost parameters that hold it: per layer and micro-batch, and at the model's ends per
# micro-batch (the selective checkpoint wraps layers only).
HOST_LAYER_PARAMS = {"tp": "tp_layer_overhead_s", "cp": "cp_layer_overhead_s", "fsdp": "fsdp_layer_overhead_s",
                     "sac": "sac_layer_overhead_s"}
HOST_ENDS_PARAMS = {"tp": "tp_ends_overhead_s", "cp": "cp_ends_overhead_s", "fsdp": "fsdp_ends_overhead_s"}


@dataclass(frozen=True)
class Range:
    """Allowed values of one number: finite, above ``low`` (or at it when ``low_ok``), at most ``high``."""

    low: float = 0.0
    high: float = math.inf
    low_ok: bool = True

    def holds(self, value: float) -> bool:
        above = value >= self.low if self.low_ok else value > self.low
        return math.isfinite(value) and above and value <= self.high

    def describe(self) -> str:
        left = "[" if self.low_ok else "("
        if math.isinf(self.high):
            return f"finite and {'>=' if self.low_ok else '>'} {self.low:g}"
        return f"in {left}{self.low:g}, {self.high:g}]"


POSITIVE = Range(0.0, low_ok=False)  # rates, capacities, bandwidths, divisors
NON_NEGATIVE = Range(0.0)  # overheads, sizes that may be zero
FRACTION = Range(0.0, 1.0)  # overlaps
EFFICIENCY = Range(0.0, 1.0, low_ok=False)  # fractions of a peak (a zero would divide by zero)
# Per-field bounds of CostParams (a field not named here - e.g. one added later - must be >= 0).
PARAM_RANGES: dict[str, Range] = {
    "gemm_half_flops": NON_NEGATIVE,
    "gemm_bandwidth_factor": Range(0.0, 1000.0, low_ok=False),
    "flash_backward_factor": Range(0.0, 20.0, low_ok=False),
    "elementwise_passes": Range(0.0, 1000.0),
    "fp8_cast_passes": Range(0.0, 1000.0),
    "tp_comm_overlap": FRACTION,
    "tp_forward_overlap": FRACTION,
    "pp_comm_overlap": FRACTION,
    "dp_overlap": FRACTION,
    "offload_overlap": FRACTION,
    "cp_comm_overlap": FRACTION,
    "zero3_collective_bandwidth": NON_NEGATIVE,
    "overlap_slowdown": Range(0.0, 1.0),
    "grad_reduce_bytes": POSITIVE,
    "optimizer_bytes_per_param": NON_NEGATIVE,
    "cpu_adam_params_per_s": POSITIVE,
    "disk_bandwidth": POSITIVE,
    "step_overhead_s": Range(0.0, 600.0),
    "microbatch_overhead_s": Range(0.0, 10.0),
    "cuda_context_bytes": NON_NEGATIVE,
    "comm_buffer_bytes": NON_NEGATIVE,
    "fragmentation": Range(0.0, 1.0),
    "logits_bytes_per_element": NON_NEGATIVE,
    "fp8_gemm_efficiency": EFFICIENCY,
    "moe_load_imbalance": Range(1.0),
    "moe_launch_s": Range(0.0, 1.0e-2),
    "moe_router_graphed": FRACTION,
    "moe_layer_graphed": FRACTION,
    "compiled_blocks": FRACTION,
    "compile_rules": FRACTION,
}
GPU_RANGES: dict[str, Range] = {
    "bf16_flops": POSITIVE, "fp8_flops": NON_NEGATIVE, "hbm_bytes": POSITIVE, "hbm_bandwidth": POSITIVE,
    "gemm_efficiency": EFFICIENCY, "attention_efficiency": EFFICIENCY, "memory_efficiency": EFFICIENCY,
    "kernel_overhead": NON_NEGATIVE, "element_bytes": Range(1.0, 8.0),
}
CLUSTER_RANGES: dict[str, Range] = {
    "intra_node_bandwidth": POSITIVE, "inter_node_bandwidth": POSITIVE, "intra_node_latency": NON_NEGATIVE,
    "inter_node_latency": NON_NEGATIVE, "host_link_bandwidth": POSITIVE, "link_efficiency": EFFICIENCY,
    **{field: POSITIVE for field in OP_BANDWIDTH_FACTORS.values()},
}


def check_ranges(key: str, values: dict, ranges: dict[str, Range]) -> None:
    """One PlaitError naming every value of ``values`` outside its field's range."""
    bad = [f"{name}={value!r} (must be {ranges.get(name, NON_NEGATIVE).describe()})"
           for name, value in values.items() if not ranges.get(name, NON_NEGATIVE).holds(value)]
    if bad:
        raise PlaitError(f"{key} out of range: {'; '.join(bad)}")


def measured_fields(params: CostParams) -> tuple[str, ...]:
    """The fields of ``params`` that differ from the defaults (what a calibration measured or a fit set):
    a stack's numbers never replace them (``params_for_stack``)."""
    return tuple(f.name for f in dataclasses.fields(params) if getattr(params, f.name) != getattr(DEFAULT_PARAMS, f.name))


def params_for_stack(stack, base: CostParams = DEFAULT_PARAMS, keep: tuple[str, ...] = ()) -> CostParams:
    """``base`` with the cost parameters ``stack`` (a ``plait.spec.stack.Stack``) declares, range-checked;
    the fields in ``keep`` (e.g. what a calibration measured) stay ``base``'s."""
    values = {name: value for name, value in stack.param_values().items() if name not in keep}
    check_ranges(f"stack {stack.name!r} params", values, PARAM_RANGES)
    return dataclasses.replace(base, **values)
