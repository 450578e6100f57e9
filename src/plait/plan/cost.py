"""Step time of a layout, itemized, and the throughput and MFU that follow. Seconds.

Each mechanism is a function of its own in ``plait.plan.terms`` (named like the runtime's modules:
tensor, pipeline, data, expert, recompute, offload, optimizer, host); the items of the breakdown
are declared once in ``plait.plan.terms.items``; ``estimate_step`` adds them up as below.

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
      exposed (``plait.plan.terms.zero3``); hybrid sharding adds an
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

from plait.plan.activations import checkpointed_layer_count
from plait.plan.compiled import compiled_share
from plait.plan.context.exchange import cp_exchange
from plait.plan.flops import hardware_flops_per_token
from plait.plan.kernels import head_time, layer_times
from plait.plan.memo import by_layout_fields
from plait.plan.memory import stage_params
from plait.plan.moe.timing import moe_layer_times
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.plan.terms.data import dp_step, gradient_reductions
from plait.plan.terms.expert import ep_microbatch
from plait.plan.terms.host import host_time, overhead_microbatch, step_host_time
from plait.plan.terms.items import TIME_ITEM_NAMES
from plait.plan.terms.offload import offload_microbatch
from plait.plan.terms.optimizer import optimizer_step
from plait.plan.terms.pipeline import BUBBLE_DIVISOR, bubble, bubble_fraction, pp_microbatch
from plait.plan.terms.recompute import recompute_layer
from plait.plan.terms.tensor import tp_layer
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import GroupPlacement, JobSpec, Layout, group_of
from plait.spec.model import ModelSpec
from plait.spec.moe.parts import is_extended
from plait.spec.validate import stage_layers

# the terms' names this module has always exported (tests and callers import them from here)
__all__ = ["StepBreakdown", "estimate_step", "bubble_fraction", "gradient_reductions", "host_time", "BUBBLE_DIVISOR"]


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds per optimizer step on the critical path, by item (``plait.plan.terms.items.TIME_ITEMS``
    says what each holds; a test keeps these fields and that declaration the same), and the rates
    that follow."""

    compute: float
    elementwise: float
    recompute: float
    tp_comm: float
    cp_comm: float
    pp_comm: float
    bubble: float
    dp_comm: float
    offload: float
    optimizer: float
    overhead: float
    step_time: float
    tokens_per_step: int
    n_gpus: int
    model_flops_per_token: float
    hardware_flops_per_token: float
    peak_flops: float  # dense bf16 peak of one GPU, FLOP/s
    ep_comm: float = 0.0
    moe_sync: float = 0.0

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
        return {k: getattr(self, k) for k in TIME_ITEM_NAMES}

    @property
    def bottleneck(self) -> str:
        items = self.items()
        return max(items, key=items.get)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(tokens_per_s_per_gpu=self.tokens_per_s_per_gpu, mfu=self.mfu, hfu=self.hfu,
                   bottleneck=self.bottleneck)
        return out


@by_layout_fields("dp", "tp", "pp", "cp", "hsdp", "order")
def _groups(layout: Layout, gpus_per_node: int) -> dict[str, GroupPlacement]:
    return {
        "tp": group_of(layout, gpus_per_node, ("tp",)),
        "cp": group_of(layout, gpus_per_node, ("cp",)),
        "pp": group_of(layout, gpus_per_node, ("pp",)),
        "dp_cp": group_of(layout, gpus_per_node, ("cp", "dp")),
        "shard": group_of(layout, gpus_per_node, ("cp", "dp"), inner_dp=layout.shard_degree),
        "replicate": group_of(layout, gpus_per_node, ("dp",), dp_step=layout.shard_degree),
    }


def _layer_times(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, lay: Layout, tokens: float,
                 params: CostParams, runtime: str, compiled: float | None = None):
    """The kernel times of one layer for ``tokens`` on a rank (``LayerTimes``): experts and MLA by
    ``moe_layer_times``, the rest by ``layer_times``; ``compiled``: the share of compiled blocks
    (None: ``compiled_share`` of the layout)."""
    if compiled is None:
        compiled = compiled_share(params, model, lay)
    if is_extended(model):
        return moe_layer_times(model, cluster.gpu, params, lay, tokens, job.seq_len, runtime, compiled)
    return layer_times(model, cluster.gpu, params, tokens, job.seq_len, lay.tp, lay.cp, lay.sequence_parallel,
                       lay.attn, lay.precision, lay.norm, runtime, lay.cp_impl, job.doc_len, compiled)


def _layer_passes(times, layers: int) -> tuple[float, float]:
    """(kernels, element-wise work) of ``layers`` layers per micro-batch, seconds: the GEMMs three
    times (forward, input and weight gradients), attention forward and backward, the element-wise
    forward and backward."""
    return (layers * (times.gemm_fwd * 3 + times.attn_fwd + times.attn_bwd),
            layers * (times.elementwise_fwd + times.elementwise_bwd))


# what a group's layouts may differ in for ``step_lower_bounds`` (everything else is the same)
BOUND_FREE_KEYS = ("zero", "hsdp", "ckpt", "loss", "offload", "opt_offload", "cp_impl")
# the free keys' values that decide whether plait's runtime compiles (``compiled_share``)
_COMPILE_VARIANTS = ({"ckpt": "none", "offload": 0.0}, {"ckpt": "full", "offload": 1.0})


def step_lower_bounds(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
                      params: CostParams = DEFAULT_PARAMS, runtime: str = "torch", cp_impls: tuple[str, ...] = (),
                      ckpts: tuple[str, ...] = ("none",)) -> dict[str, float]:
    """For each checkpoint policy of ``ckpts``: seconds no longer than ``estimate_step(...).step_time``
    of any layout with that policy that differs from ``layout`` only in ``BOUND_FREE_KEYS`` (with
    ``cp_impl`` one of ``cp_impls``, or ``layout``'s when empty): the terms those keys do not change, and
    the recomputation, each at its smallest over the kernels, and none of the terms they do change.

    Per micro-batch on the slowest stage: the layers' kernels and element-wise passes, the recomputation
    of the checkpointed layers, the LM head with the unfused loss (the chunked one adds a GEMM), the
    tensor-parallel and pipeline transfers, the expert all-to-all without recomputation, the host time
    without recomputation and with FSDP2's only where the layout runs it at ZeRO-0 (the fewest
    mechanisms); then the bubble of that much work. Left out, each >= 0: the context-parallel exchange,
    offload, the data-parallel communication, the optimizer. The search skips the layouts whose bound
    is slower than the plans it has to show (``plait.plan.search``); ``tests/plan/test_search_bound.py``
    checks the bound under every layout of several searches."""
    lay = layout.variant(zero=0, hsdp=1, ckpt="none", loss="unfused", offload=0.0, opt_offload=False)
    m = lay.micro_batches(job.global_batch)
    tokens = job.seq_len / lay.cp * lay.mbs
    groups = _groups(lay, cluster.gpus_per_node)
    layers = stage_layers(model, lay) * lay.vpp
    act_bytes = cluster.gpu.element_bytes * tokens * model.hidden
    tp_one_way, tp_per_layer = tp_layer(cluster, groups["tp"], lay, act_bytes, params)
    by_kernel = []  # (per micro-batch, recomputation per checkpointed layer by policy) for each cp_impl
    # the compiled share may differ within the group (offload, tp with ckpt: plait.plan.compiled): both
    shares = {compiled_share(params, model, layout.variant(**free)) for free in _COMPILE_VARIANTS} \
        if params.compiled_blocks else {0.0}
    for impl, share in ((impl, share) for impl in cp_impls or (lay.cp_impl,) for share in sorted(shares)):
        kernel_lay = lay if impl == lay.cp_impl else lay.variant(cp_impl=impl)
        times = _layer_times(model, cluster, job, kernel_lay, tokens, params, runtime, share)
        ep_mb, moe_sync_mb = ep_microbatch(model, cluster, kernel_lay, tokens, job.seq_len, layers, 0, params,
                                                runtime)
        kernels_mb = sum(_layer_passes(times, layers)) + layers * tp_per_layer + ep_mb + moe_sync_mb
        by_kernel.append((kernels_mb, {ckpt: recompute_layer(kernel_lay.variant(ckpt=ckpt), times, tp_one_way)
                                       for ckpt in ckpts}))
    head_mb = head_time(model, cluster.gpu, params, tokens, lay.tp, "bf16", "unfused")
    overhead_mb, host_ends = overhead_microbatch(params, lay, layers, 0)
    fixed_mb = pp_microbatch(cluster, groups["pp"], lay, act_bytes, params) + overhead_mb
    out = {}
    for ckpt in ckpts:
        n_ckpt = checkpointed_layer_count(model, lay.variant(ckpt=ckpt), layers)
        body_mb = fixed_mb + min(kernels_mb + n_ckpt * recompute[ckpt] for kernels_mb, recompute in by_kernel)
        average_mb = body_mb + (head_mb + host_ends) / lay.pp
        out[ckpt] = m * (body_mb + head_mb + host_ends) + bubble(lay, m, average_mb) + step_host_time(params, layers)
    return out


def estimate_step(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
                  params: CostParams = DEFAULT_PARAMS, runtime: str = "torch") -> StepBreakdown:
    """Predicted time of one optimizer step of ``job`` under ``layout`` (assumed valid).

    ``runtime``: whose kernels (``plait.plan.kernels``): ``torch`` (plait's runtime) or
    ``megatron`` (Megatron-LM: its fused softmax under ``attn=eager``)."""
    gpu, lay = cluster.gpu, layout
    m = lay.micro_batches(job.global_batch)
    tokens = job.seq_len / lay.cp * lay.mbs  # tokens of one micro-batch on one rank
    times = _layer_times(model, cluster, job, lay, tokens, params, runtime)
    groups = _groups(lay, cluster.gpus_per_node)
    layers = stage_layers(model, lay) * lay.vpp  # layers on the most loaded GPU
    n_ckpt = checkpointed_layer_count(model, lay, layers)
    act_bytes = gpu.element_bytes * tokens * model.hidden  # activations: the compute dtype

    # per layer: tensor parallel, the context-parallel exchange, recomputation
    tp_one_way, tp_per_layer = tp_layer(cluster, groups["tp"], lay, act_bytes, params)
    cp_per_layer = sum(cp_exchange(model, cluster, groups["cp"], lay, tokens, times.attn_fwd, times.attn_bwd, params))
    recompute_per_layer = recompute_layer(lay, times, tp_one_way)
    # per micro-batch on the slowest stage
    kernels_mb, elementwise_mb = _layer_passes(times, layers)
    # the LM head stays bf16 under fp8/mxfp8: plait's runtime (torchao) converts only the blocks' linears
    head_mb = head_time(model, gpu, params, tokens, lay.tp, "bf16", lay.loss)
    recompute_mb = n_ckpt * recompute_per_layer
    tp_mb, cp_mb = layers * tp_per_layer, layers * cp_per_layer
    offload_mb = offload_microbatch(model, cluster, lay, job.seq_len, layers, times, params, runtime)
    pp_mb = pp_microbatch(cluster, groups["pp"], lay, act_bytes, params)
    ep_mb, moe_sync_mb = ep_microbatch(model, cluster, lay, tokens, job.seq_len, layers, n_ckpt, params,
                                            runtime)
    overhead_mb, host_ends = overhead_microbatch(params, lay, layers, n_ckpt)
    body_mb = (kernels_mb + elementwise_mb + recompute_mb + tp_mb + cp_mb + offload_mb + pp_mb + overhead_mb + ep_mb
               + moe_sync_mb)
    # the last stage (or the only one) carries the head, and the mechanisms' host time at the ends
    slowest_mb = body_mb + head_mb + host_ends
    average_mb = body_mb + (head_mb + host_ends) / lay.pp

    # per step
    fill_drain = bubble(lay, m, average_mb)
    local = max(stage_params(model, lay).values())
    dp_comm = dp_step(model, cluster, groups, lay, m, layers, times, local, recompute_mb, recompute_per_layer, n_ckpt,
                      head_mb, params, runtime)
    optimizer, offload_step = optimizer_step(model, cluster, lay, local, layers, params, runtime)

    per_step = step_host_time(params, layers)
    step = (m * slowest_mb + fill_drain + dp_comm + optimizer + offload_step + per_step)
    return StepBreakdown(
        compute=m * (kernels_mb + head_mb),
        elementwise=m * elementwise_mb,
        recompute=m * recompute_mb,
        tp_comm=m * tp_mb,
        cp_comm=m * cp_mb,
        pp_comm=m * pp_mb,
        bubble=fill_drain,
        dp_comm=dp_comm,
        offload=m * offload_mb + offload_step,
        optimizer=optimizer,
        overhead=per_step + m * (overhead_mb + host_ends),
        step_time=step,
        tokens_per_step=job.tokens_per_step,
        n_gpus=lay.world_size,
        model_flops_per_token=model.model_flops_per_token(job.seq_len),
        hardware_flops_per_token=hardware_flops_per_token(model, lay, job.seq_len),
        peak_flops=gpu.bf16_flops,
        ep_comm=m * ep_mb,
        moe_sync=m * moe_sync_mb,
    )
