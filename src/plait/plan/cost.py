"""Step time of a layout, itemized, and the throughput and MFU that follow. Seconds.

One optimizer step = m micro-batches through the pipeline of the slowest stage, then the
exposed data-parallel communication, the optimizer step and a fixed per-step overhead:

  per micro-batch and stage: layers × (forward + backward kernels, ``plait.plan.kernels``)
      + recomputation of checkpointed layers + tensor-parallel collectives (forward exposed,
      backward partly hidden behind weight-gradient GEMMs) + context-parallel K/V exchange
      beyond the attention it overlaps (each ``cp_impl`` as the runtime runs it,
      ``plait.plan.context.exchange``) + pipeline send/recv + activation offload beyond the
      compute it overlaps; the last stage adds the LM head and loss.
  pipeline: m · t_slowest + bubble, bubble = (p-1)·t for GPipe and 1F1B (Narayanan et al.
      2021), (p-1)·t/v for interleaved 1F1B, (p-1)·t/3 for zero-bubble (ZB-H1).
  data parallel: gradient all-reduce (ZeRO 0), reduce-scatter + parameter all-gather (ZeRO 1/2:
      once per step; ZeRO-2 without a pipeline once per micro-batch, as the runtime does them,
      ``gradient_reductions``; hybrid sharding's all-reduce across replicas as often),
      each hidden behind up to ``dp_overlap`` of the micro-batch's compute it can overlap; ZeRO-3: per
      micro-batch and FSDP unit (each block, the embedding, the head, as the runtime shards), the
      parameter all-gather (forward; again in backward when resharded) and the gradient
      reduce-scatter, each prefetched one unit ahead so that it hides behind at most one unit's
      compute, the first all-gather of each micro-batch and the last reduce-scatter of the step
      exposed (``plait.plan.exposure.zero3``); hybrid sharding adds an
      all-reduce of the gradient shards across replicas (the only DP bytes that cross nodes
      when the shard group is inside a node).
  experts (``plait.plan.moe.timing``): MoE, MLA and sliding-window layers get their own kernel
      times; per MoE layer and micro-batch the exposed dispatch and combine all-to-all (forward,
      backward, and the forward's again under ckpt=full), item ``ep_comm``; the routed experts'
      gradients are reduced over the expert-data-parallel group (in ``dp_comm``) and their
      optimizer step counted with the rest.
  host time (``CostParams.layer_overhead_s`` and the tp / cp / FSDP2 ones, per layer and
      micro-batch, and the selective-checkpoint one per ``ckpt=balanced`` layer; the tp / cp /
      FSDP2 ones at the model's ends per micro-batch, on the last stage; 0 by default:
      on a GPU the host runs ahead of the kernels; a CPU profile measures them) is added to the per-micro-batch overhead. Bytes are priced in the device's
      compute dtype (``GpuSpec.element_bytes``: 2 on GPUs, 4 on a CPU profile).

MFU = model FLOPs (causal attention counted explicitly) / (step time · GPUs · dense bf16 peak).
HFU uses hardware FLOPs (with recomputation). Collectives follow ``plait.plan.comm``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from plait.plan import comm
from plait.plan.activations import checkpointed_layer_count, stage_layer_bytes
from plait.plan.context.exchange import cp_exchange
from plait.plan.exposure.overlap import exposed
from plait.plan.exposure.zero3 import Unit, stage_units, zero3_exposed
from plait.plan.flops import hardware_flops_per_token
from plait.plan.kernels import head_time, layer_times
from plait.plan.memory import end_params, stage_blocks_params, stage_params, tied_params, zero_shard_degree
from plait.plan.moe.memory import stage_expert_params, stage_layer_split
from plait.plan.moe.timing import expert_dp_comm, moe_comm_layer, moe_layer_times
from plait.plan.params import DEFAULT_PARAMS, HOST_ENDS_PARAMS, HOST_LAYER_PARAMS, CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import GroupPlacement, JobSpec, Layout, group_of
from plait.spec.model import ModelSpec
from plait.spec.moe.parts import is_extended
from plait.spec.moe.layout import expert_data_parallel, expert_groups
from plait.spec.validate import stage_layers

BUBBLE_DIVISOR = {"gpipe": 1.0, "1f1b": 1.0, "zero-bubble": 3.0}


def bubble_fraction(schedule: str, pp: int, micro_batches: int, vpp: int = 1) -> float:
    """Pipeline bubble time over ideal time for balanced stages (Narayanan et al. 2021):
    (p-1)/m for GPipe and 1F1B, (p-1)/(v·m) for interleaved 1F1B, a third of 1F1B's for ZB-H1."""
    if pp <= 1:
        return 0.0
    divisor = vpp if schedule == "interleaved-1f1b" else BUBBLE_DIVISOR[schedule]
    return (pp - 1) / (divisor * micro_batches)


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds per optimizer step on the critical path, by item, and the rates that follow."""

    compute: float  # GEMMs, attention and LM head of every micro-batch, slowest stage
    elementwise: float  # norms, activations, residuals (HBM-bound)
    recompute: float  # forward work repeated by activation checkpointing
    tp_comm: float  # exposed tensor/sequence-parallel collectives
    cp_comm: float  # exposed context-parallel K/V exchange
    pp_comm: float  # pipeline send/recv
    bubble: float  # pipeline fill and drain
    dp_comm: float  # exposed data-parallel / ZeRO communication
    offload: float  # exposed activation/optimizer traffic over the host link
    optimizer: float  # optimizer step
    overhead: float  # fixed per-step and per-micro-batch costs, and the runtime's host time per layer
    step_time: float
    tokens_per_step: int
    n_gpus: int
    model_flops_per_token: float
    hardware_flops_per_token: float
    peak_flops: float  # dense bf16 peak of one GPU, FLOP/s
    ep_comm: float = 0.0  # exposed expert all-to-all (dispatch and combine)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.n_gpus

    @property
    def mfu(self) -> float:
        return self.model_flops_per_token * self.tokens_per_s_per_gpu / self.peak_flops

    @property
    def hfu(self) -> float:
        return self.hardware_flops_per_token * self.tokens_per_s_per_gpu / self.peak_flops

    def items(self) -> dict[str, float]:
        keys = ("compute", "elementwise", "recompute", "tp_comm", "cp_comm", "pp_comm", "bubble",
                "dp_comm", "ep_comm", "offload", "optimizer", "overhead")
        return {k: getattr(self, k) for k in keys}

    @property
    def bottleneck(self) -> str:
        items = self.items()
        return max(items, key=items.get)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(tokens_per_s_per_gpu=self.tokens_per_s_per_gpu, mfu=self.mfu, hfu=self.hfu,
                   bottleneck=self.bottleneck)
        return out


@lru_cache(maxsize=4096)
def _groups(layout: Layout, gpus_per_node: int) -> dict[str, GroupPlacement]:
    return {
        "tp": group_of(layout, gpus_per_node, ("tp",)),
        "cp": group_of(layout, gpus_per_node, ("cp",)),
        "pp": group_of(layout, gpus_per_node, ("pp",)),
        "dp_cp": group_of(layout, gpus_per_node, ("cp", "dp")),
        "shard": group_of(layout, gpus_per_node, ("cp", "dp"), inner_dp=layout.shard_degree),
        "replicate": group_of(layout, gpus_per_node, ("dp",), dp_step=layout.shard_degree),
    }


def _zero3_stages(model: ModelSpec, lay: Layout, layers: int, times, recompute_mb: float,
                  head_mb: float) -> list[list[Unit]]:
    """The FSDP units (``plait.plan.exposure.zero3``) of the first and of the last pipeline stage (one
    stage at pp=1): the embedding on the first, the head on the last, the blocks on each."""
    embedding, head = end_params(model, lay)
    blocks = stage_blocks_params(model, lay)
    backward = times.bwd + recompute_mb / max(1, layers)
    ends = [(embedding, head)] if lay.pp == 1 else [(embedding, 0.0), (0.0, head)]
    return [stage_units(first, blocks, last, layers, times.fwd, backward, head_mb if last else 0.0,
                        lay.reshard, tied_params(model, lay)) for first, last in ends]


def gradient_reductions(lay: Layout, micro_batches: int) -> int:
    """How many times per step plait's runtime reduces the gradients under ZeRO >= 1 (each a
    reduce-scatter, and across replicas an all-reduce under hsdp): ZeRO-2 and 3 without a pipeline
    (FSDP2, as DeepSpeed) after every micro-batch, ZeRO-2 gathering the parameters again for the
    next; ZeRO-1 and the pipeline schedules accumulate full gradients and reduce once
    (``plait.run.step``)."""
    return micro_batches if lay.zero >= 2 and lay.pp == 1 else 1


def host_time(params: CostParams, lay: Layout) -> tuple[float, float]:
    """(per layer, at the model's ends) host seconds per micro-batch of the runtime's machinery
    that ``lay`` runs: the plain module and autograd calls per layer, plus per layer and at the
    ends each mechanism's own (DTensor tensor parallel at tp > 1, context parallel at cp > 1,
    FSDP2 where ``Layout.uses_fsdp``). All 0 by default (a GPU's host runs ahead of its kernels)."""
    running = [name for name, runs in (("tp", lay.tp > 1), ("cp", lay.cp > 1), ("fsdp", lay.uses_fsdp)) if runs]
    per_layer = params.layer_overhead_s + sum(getattr(params, HOST_LAYER_PARAMS[name]) for name in running)
    return per_layer, sum(getattr(params, HOST_ENDS_PARAMS[name]) for name in running)


def estimate_step(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
                  params: CostParams = DEFAULT_PARAMS, runtime: str = "torch") -> StepBreakdown:
    """Predicted time of one optimizer step of ``job`` under ``layout`` (assumed valid).

    ``runtime``: whose kernels (``plait.plan.kernels``): ``torch`` (plait's runtime) or
    ``megatron`` (Megatron-LM: its fused softmax under ``attn=eager``)."""
    gpu, lay = cluster.gpu, layout
    m = lay.micro_batches(job.global_batch)
    tokens = job.seq_len / lay.cp * lay.mbs  # tokens of one micro-batch on one rank
    if is_extended(model):  # experts, MLA
        times = moe_layer_times(model, gpu, params, lay, tokens, job.seq_len, runtime)
    else:
        times = layer_times(model, gpu, params, tokens, job.seq_len, lay.tp, lay.cp,
                            lay.sequence_parallel, lay.attn, lay.precision, lay.norm, runtime, lay.cp_impl)
    groups = _groups(lay, cluster.gpus_per_node)
    layers = stage_layers(model, lay) * lay.vpp  # layers on the most loaded GPU
    n_ckpt = checkpointed_layer_count(model, lay, layers)

    # ---- tensor parallel, per layer
    element = gpu.element_bytes  # activations and gathered weights: the compute dtype
    act_bytes = element * tokens * model.hidden
    if lay.tp > 1:
        if lay.sequence_parallel:
            one_way = 2 * comm.all_gather(cluster, groups["tp"], act_bytes) + 2 * comm.reduce_scatter(cluster, groups["tp"], act_bytes)
        else:
            one_way = 2 * comm.all_reduce(cluster, groups["tp"], act_bytes)
        tp_layer = one_way + one_way * (1 - params.tp_comm_overlap)
    else:
        one_way = tp_layer = 0.0
    # ---- context parallel, per layer: the cp_impl's exchange of K and V (and dK, dV) beyond the
    # attention it overlaps (plait.plan.context.exchange)
    cp_layer = sum(cp_exchange(model, cluster, groups["cp"], lay, tokens, times.attn_fwd, times.attn_bwd, params))
    # ---- recomputation, per checkpointed layer
    if lay.ckpt == "full":
        recompute_layer = times.fwd + one_way
    elif lay.ckpt == "selective":
        recompute_layer = times.attn_fwd
    elif lay.ckpt == "balanced":
        # plait's runtime keeps the fused attention kernel's output; eager attention's batched
        # GEMMs are recomputed with the rest of the core (plait.run.memory.recompute)
        recompute_layer = times.elementwise_fwd + (times.attn_fwd if lay.attn == "eager" else 0.0)
    else:
        recompute_layer = 0.0
    # ---- activation offload, per micro-batch of the first stage (it offloads the most): out
    # during the forward, back during the backward, each hidden behind that pass's compute
    offload_mb = 0.0
    if lay.offload > 0:
        bandwidth = cluster.host_link_bandwidth
        if lay.offload_target == "disk":  # through host memory to the local disk
            bandwidth = min(bandwidth, params.disk_bandwidth)
        moved = sum(stage_layer_bytes(model, lay, job.seq_len, layers, 0, runtime="torch",
                                      element_bytes=element)[1])
        transfer = moved / bandwidth
        offload_mb = (exposed(transfer, layers * times.fwd, params, params.offload_overlap)
                      + exposed(transfer, layers * times.bwd, params, params.offload_overlap))
    # ---- pipeline send/recv per micro-batch (forward activations, backward gradients)
    pp_mb = 0.0
    if lay.pp > 1:
        sent = act_bytes / (max(1, lay.tp))  # scatter/gather or SP-sharded
        crosses = groups["pp"].spans_nodes
        # the software may post the transfers ahead and hide them behind compute (pp_comm_overlap)
        pp_mb = 2 * lay.vpp * comm.send_recv(cluster, crosses, sent) * (1 - params.pp_comm_overlap)

    # ---- expert all-to-all per micro-batch: the MoE layers of the stage (plait.plan.moe.timing)
    ep_mb = 0.0
    if model.moe is not None:
        moe_layers = stage_layer_split(model, lay, layers)[1]
        a2a_fwd, a2a_bwd = moe_comm_layer(model, cluster, lay, tokens, job.seq_len, params)
        ep_mb = moe_layers * (a2a_fwd + a2a_bwd + params.moe_layer_overhead_s) + (n_ckpt * a2a_fwd * moe_layers / layers if lay.ckpt == "full" else 0.0)
    kernels_mb = layers * (times.gemm_fwd * 3 + times.attn_fwd + times.attn_bwd)
    elementwise_mb = layers * 3 * times.elementwise_fwd
    # the LM head stays bf16 under fp8/mxfp8: plait's runtime (torchao) converts only the blocks' linears
    head_mb = head_time(model, gpu, params, tokens, lay.tp, "bf16", lay.loss)
    recompute_mb = n_ckpt * recompute_layer
    tp_mb, cp_mb = layers * tp_layer, layers * cp_layer
    # host time of the runtime's machinery per layer (0 on a GPU: hidden behind the kernels; a CPU
    # profile measures it), its forward part (a third) again for each fully recomputed layer
    host_layer, host_ends = host_time(params, lay)
    host_mb = host_layer * (layers + (n_ckpt / 3.0 if lay.ckpt == "full" else 0.0))
    host_mb += params.sac_layer_overhead_s * n_ckpt if lay.ckpt == "balanced" else 0.0
    overhead_mb = params.microbatch_overhead_s * lay.vpp + host_mb
    body_mb = kernels_mb + elementwise_mb + recompute_mb + tp_mb + cp_mb + offload_mb + pp_mb + overhead_mb + ep_mb
    # the last stage (or the only one) carries the head, and the mechanisms' host time at the ends
    slowest_mb = body_mb + head_mb + host_ends
    average_mb = body_mb + (head_mb + host_ends) / lay.pp

    # ---- pipeline
    scale = m  # every per-micro-batch item happens m times on the slowest stage
    bubble = 0.0
    if lay.pp > 1:
        bubble = bubble_fraction(lay.schedule, lay.pp, m, lay.vpp) * m * average_mb

    # ---- data parallel
    local = max(stage_params(model, lay).values())
    grad_bytes = local * params.grad_reduce_bytes
    bwd_window = layers * times.bwd + recompute_mb
    fwd_window = layers * times.fwd
    dp_comm = 0.0
    d = zero_shard_degree(lay)
    if lay.dp * lay.cp > 1:
        if lay.zero == 0:
            dp_comm = exposed(comm.all_reduce(cluster, groups["dp_cp"], grad_bytes), bwd_window, params)
        elif lay.zero in (1, 2):
            shard = groups["shard"]
            scatter = exposed(comm.reduce_scatter(cluster, shard, grad_bytes), bwd_window, params)
            gather = exposed(comm.all_gather(cluster, shard, element * local), fwd_window, params)
            dp_comm = gradient_reductions(lay, m) * (scatter + gather)
        else:
            dp_comm = max(zero3_exposed(cluster, groups["shard"], units, m, params)
                          for units in _zero3_stages(model, lay, layers, times, n_ckpt * recompute_layer, head_mb))
        if lay.hsdp > 1:  # FSDP2 all-reduces the shards across replicas with every reduce-scatter
            replicas = comm.all_reduce(cluster, groups["replicate"], grad_bytes / max(1, d // lay.cp))
            dp_comm += gradient_reductions(lay, m) * replicas
    if model.moe is not None and expert_data_parallel(lay) > 1:  # routed experts: over the expert-dp ranks
        if lay.zero == 3:  # gathered layer by layer, as the dense weights
            edp = expert_groups(lay, cluster.gpus_per_node)["edp"]
            experts = stage_expert_params(model, lay, layers)
            backward = times.bwd + n_ckpt * recompute_layer / max(1, layers)
            units = [Unit(experts / max(1, layers), times.fwd, backward, lay.reshard)] * max(1, layers)
            dp_comm += zero3_exposed(cluster, edp, units, m, params)
        else:
            dp_comm += exposed(expert_dp_comm(model, cluster, lay, layers, params), bwd_window, params)

    # ---- optimizer
    opt_params = local / d if lay.zero >= 1 else local
    if model.moe is not None:
        experts = stage_expert_params(model, lay, layers)
        opt_params += experts / expert_data_parallel(lay) if lay.zero >= 1 else experts
    optimizer = opt_params * params.optimizer_bytes_per_param / (gpu.hbm_bandwidth * gpu.memory_efficiency)
    offload_step = 0.0
    if lay.opt_offload:
        optimizer = opt_params / params.cpu_adam_params_per_s
        offload_step = opt_params * (params.grad_reduce_bytes + 2.0) / cluster.host_link_bandwidth

    compute = scale * (kernels_mb + head_mb)
    step = (scale * slowest_mb + bubble + dp_comm + optimizer + offload_step + params.step_overhead_s)
    model_flops = model.model_flops_per_token(job.seq_len)
    return StepBreakdown(
        compute=compute,
        elementwise=scale * elementwise_mb,
        recompute=scale * recompute_mb,
        tp_comm=scale * tp_mb,
        cp_comm=scale * cp_mb,
        pp_comm=scale * pp_mb,
        bubble=bubble,
        dp_comm=dp_comm,
        offload=scale * offload_mb + offload_step,
        optimizer=optimizer,
        overhead=params.step_overhead_s + scale * (overhead_mb + host_ends),
        step_time=step,
        tokens_per_step=job.tokens_per_step,
        n_gpus=lay.world_size,
        model_flops_per_token=model_flops,
        hardware_flops_per_token=hardware_flops_per_token(model, lay, job.seq_len),
        peak_flops=gpu.bf16_flops,
        ep_comm=scale * ep_mb,
    )
