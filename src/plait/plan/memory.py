"""Peak memory per GPU of the most loaded rank, itemized. All values in bytes.

Compute dtype: ``cluster.gpu.element_bytes`` bytes per element of activations, logits and
gathered weights (2: bf16 on every GPU preset; 4: fp32, plait's runtime on a CPU, where model
states are priced as that runtime allocates them: ``plait.plan.states``).

Model states (mixed-precision Adam, ZeRO accounting: 2 + 2 + 12 bytes per parameter with bf16;
4 + 4 + 8 in fp32, plus DDP's second gradient copy when a step accumulates micro-batches, and
no gradients at the peak of a one-micro-batch step without data-parallel gradient sync: the
runtime frees them after every step and makes them as the backward frees activations):
  weights bf16 (2 B), gradients (2 B), optimizer: fp32 master weights, Adam m and v (12 B).
  ZeRO-1 shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the weights over
  the shard group: dp·cp ranks, or dp/hsdp·cp with hybrid sharding. ZeRO-3 adds the gathered
  bf16 weights of two layers (the one computing and the one prefetched) and one layer's
  unsharded gradients before the reduce-scatter; a ZeRO-3 that gathers module by module under a
  live-parameter cap (DeepSpeed's, ``CostParams.zero3_live_params``) holds what
  ``plait.plan.states.zero3_buffer_params`` says. Optimizer offload moves the 12 B to the host.
  Tensor parallel shards the GEMM weights and the vocabulary by tp; norms stay replicated.

Activations (``plait.plan.activations``): bytes per layer and micro-batch × layers on the GPU ×
micro-batches in flight on the rank (``rank_in_flight``): 1 without pipelining, all m for GPipe,
min(p, m) on the first stage for 1F1B and zero-bubble (p - r on rank r, one on the last), and for
interleaved 1F1B the penalty factor (1 + (p-1)/(p·v)) of Korthikanti et al. 2022. Megatron's ZB-H1
keeps 1F1B's memory; torch's zero-bubble schedule (plait's runtime) keeps min(p, m) on every rank
and, on rank r > 0, the output gradients of r + 1 micro-batches for their deferred weight steps
(item ``deferred_weight_grads``, ``deferred_weight_grad_bytes``), so its last stage is the peak.
Checkpointing adds the tensors that one layer dropped, live again while it is recomputed for its
backward. The first stage adds the embedding output, the last stage the loss's peak (``loss_peak_bytes``
per logit: PyTorch's cross entropy 12, three fp32 tensors; one micro-batch, ``loss_tokens``): all of the
micro-batch's tokens with ``loss=unfused``, one chunk of ``LOSS_CHUNK_TOKENS`` with ``loss=fused`` (the chunked cross
entropy keeps only the final hidden state, which the LM head's GEMM saves in both cases, and
recomputes one chunk's logits at a time in the backward).
Without FSDP, autocast's bf16 copies of the linear weights (item ``autocast_copies``,
``plait.plan.autocast``). Activation offload (``plait.run.memory.offload``): the first ``offloaded_layer_count`` layers of a
stage (Kwai's fraction α, pipeline-stage aware) move what autograd saves to host memory or disk;
plait's runtime keeps a double buffer of two such layers on the GPU (the one being copied, the one
prefetched), Transformer Engine's offload none at the peak (``offload_buffer_bytes``).
Pipeline receive buffers (item ``pipeline_buffers``, plait's runtime only): torch's pipelining
allocates, when the schedule is built, one buffer per micro-batch for every stage chunk of a rank
that receives activations and for every one that receives gradients, and keeps them
(``pipeline_buffer_bytes``); the interleaved and zero-bubble schedules hold as many sent tensors
until the end of the step.

Fixed: CUDA context and library workspaces, NCCL and bucket buffers (``CostParams``), and an
allocator-fragmentation reserve over the dynamic memory.

What the allocator adds that the tensor formula does not, kept as separate items so that
``plait plan --explain`` shows them apart from the tensors (``OVERHEAD_ITEMS``): ``cuda_context``
(the CUDA context, cuBLAS/cuDNN workspaces), ``comm_buffers`` (NCCL's channel buffers and the
gradient-bucket buffers; CUDA-graph pools would be counted here too) and ``fragmentation``
(blocks the caching allocator holds but cannot reuse, a fraction of the dynamic memory). Not
modelled at all: temporaries of unfused kernels (an unfused norm or loss materializes fp32
copies for the length of one kernel), allocator rounding of odd sizes, memory other processes
hold. For that, ``is_risky`` keeps a headroom (``DEFAULT_HEADROOM`` of the HBM, ``plait plan
--memory-headroom``): a layout above capacity·(1 - headroom) is shown ``risky`` and the search
never ranks it first while a layout with headroom fits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from plait.plan.activations import (
    BF16,
    checkpointed_layer_count,
    layer_items,
    stage_layer_bytes,
)
from plait.plan.autocast import autocast_copy_bytes
from plait.plan.memo import by_layout_fields
from plait.plan.moe.memory import dense_layer_local, dispatch_buffer_bytes, expert_states, stage_dense_blocks
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.plan.states import ddp_accumulation_bytes, gradients_at_peak, sharded_states
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import LOSS_CHUNK_TOKENS, JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.validate import rank_layers, stage_layers

# items outside the allocator's count: CUDA context, NCCL buffers, fragmentation reserve
OVERHEAD_ITEMS = ("cuda_context", "comm_buffers", "fragmentation")
DEFAULT_HEADROOM = 0.05  # fraction of HBM kept free for what the formula does not count
# schedules that plait's runtime builds on torch's _PipelineScheduleRuntime (sends waited at step end)
SENDS_HELD_SCHEDULES = ("interleaved-1f1b", "zero-bubble")


def allocated_bytes(items: dict[str, float]) -> float:
    """What the GPU allocator should hand out at the peak (what ``max_memory_allocated`` measures):
    the itemized memory (``MemoryBreakdown.items()``, bytes) without ``OVERHEAD_ITEMS``."""
    return sum(v for k, v in items.items() if k not in OVERHEAD_ITEMS)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes on the most loaded GPU, by item; ``stage`` says which pipeline stage it is."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    embedding_activations: float
    logits: float
    zero3_buffers: float
    comm_buffers: float
    cuda_context: float
    fragmentation: float
    capacity: float
    stage: str
    host_bytes: float = 0.0  # optimizer states and activations kept in host memory
    moe_buffers: float = 0.0  # expert dispatch send/receive buffers of one layer (plait.plan.moe.memory)
    pipeline_buffers: float = 0.0  # torch.distributed.pipelining's receive buffers (pipeline_buffer_bytes)
    deferred_weight_grads: float = 0.0  # zero-bubble's held output gradients (deferred_weight_grad_bytes)
    autocast_copies: float = 0.0  # autocast's bf16 weight copies without FSDP (plait.plan.autocast)

    @property
    def model_states(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return (self.model_states + self.activations + self.embedding_activations + self.logits
                + self.zero3_buffers + self.comm_buffers + self.cuda_context + self.fragmentation
                + self.moe_buffers + self.pipeline_buffers + self.deferred_weight_grads + self.autocast_copies)

    @property
    def allocated(self) -> float:
        """What torch's caching allocator should hand out at the peak (what ``max_memory_allocated``
        measures): ``total`` without the CUDA context, the NCCL buffers and the fragmentation reserve."""
        return allocated_bytes(self.items())

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def headroom(self) -> float:
        return self.capacity - self.total

    def items(self) -> dict[str, float]:
        out = asdict(self)
        for key in ("capacity", "stage", "host_bytes"):
            out.pop(key)
        return out


def loss_tokens(layout: Layout, seq_len: int) -> float:
    """Tokens whose logits are alive at once on the last stage (one micro-batch on this rank)."""
    tokens = seq_len / layout.cp * layout.mbs
    return min(tokens, LOSS_CHUNK_TOKENS) if layout.loss == "fused" else tokens


def zero_shard_degree(layout: Layout) -> int:
    """Ranks over which ZeRO shards model states (cp ranks hold identical weights)."""
    return layout.shard_degree * layout.cp


def end_params(model: ModelSpec, layout: Layout) -> tuple[float, float]:
    """(embedding, head) parameters held by one GPU (after TP): the token embedding with the learned
    positions (GPT) that the first stage holds, and the final norm with the LM head that the last
    stage holds (the head's matrix counted even when tied to the embedding)."""
    t = layout.tp
    positions = model.max_seq_len * model.hidden if model.arch == "gpt" else 0
    return model.vocab * model.hidden / t + positions, model.vocab * model.hidden / t + model.final_norm_params()


def tied_params(model: ModelSpec, layout: Layout) -> float:
    """The matrix a tied token embedding and LM head share, per GPU (after TP): counted in both of
    ``end_params`` but held once; 0 when they are not tied."""
    return model.vocab * model.hidden / layout.tp if model.tied_embeddings else 0.0


@by_layout_fields("tp", "pp", "vpp", "split")
def stage_blocks_params(model: ModelSpec, layout: Layout) -> float:
    """Parameters of the transformer blocks one GPU holds on a pipeline stage (after TP)."""
    layers = stage_layers(model, layout) * layout.vpp
    if model.moe is not None or model.mla is not None:  # experts, MLA: the non-expert parameters (plait.plan.moe.memory)
        return stage_dense_blocks(model, layout, layers)
    # GEMM weights are sharded by tp; norms and biases are counted whole (they are < 0.1%)
    return layers * (model.layer_matmul_params() / layout.tp + (model.layer_params() - model.layer_matmul_params()))


@by_layout_fields("tp", "pp", "vpp", "split")
def stage_params(model: ModelSpec, layout: Layout) -> dict[str, float]:
    """Parameters held by one GPU on the first, the last and a middle pipeline stage (after TP)."""
    blocks = stage_blocks_params(model, layout)
    embedding, head = end_params(model, layout)
    if layout.pp == 1:
        both = blocks + embedding + head - tied_params(model, layout)
        return {"first": both, "last": both, "middle": both}
    return {"first": blocks + embedding, "last": blocks + head, "middle": blocks}


def largest_submodule_params(model: ModelSpec, layout: Layout) -> float:
    """Parameters of the largest single weight one GPU holds (after TP): the fused QKV, the output
    projection, the fused MLP input (gate and up together when gated) or output GEMM of a layer, or
    the vocabulary matrix; what a ZeRO-3 that gathers module by module must hold whole at once."""
    h, f = model.hidden, model.ffn_hidden
    gemms = (h * (model.q_hidden + 2 * model.kv_hidden), model.q_hidden * h, (2 if model.gated else 1) * f * h, f * h)
    return max(max(gemms), model.vocab * h) / layout.tp


def model_states(params: float, model: ModelSpec, layout: Layout, element_bytes: float = BF16,
                 cost: CostParams = DEFAULT_PARAMS) -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer, zero-3 buffers, host bytes) for ``params`` local parameters
    (``element_bytes``: the compute dtype's, ``plait.plan.states``; ``cost``: the stack's ZeRO-3
    gathering, ``zero3_live_params`` and ``zero3_bucket_params``)."""
    layer = model.layer_params() / layout.tp
    if model.moe is not None or model.mla is not None:  # the non-expert part of an MoE layer (experts: expert_states)
        layer = dense_layer_local(model, layout, model.moe is not None)
    largest = largest_submodule_params(model, layout) if cost.zero3_live_params else 0.0
    return sharded_states(params, layout, zero_shard_degree(layout), layer, element_bytes, largest,
                          cost.zero3_live_params, cost.zero3_bucket_params)


def in_flight_microbatches(layout: Layout, micro_batches: int) -> float:
    """Micro-batches whose activations the first stage holds at its peak (see module doc)."""
    p, m = layout.pp, micro_batches
    if p == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    in_flight = float(min(p, m))
    if layout.schedule == "interleaved-1f1b":
        in_flight *= 1 + (p - 1) / (p * layout.vpp)
    return in_flight


def activation_bytes(model: ModelSpec, layout: Layout, job: JobSpec, in_flight: float,
                     runtime: str = "torch", stage: int = 0, element_bytes: float = BF16) -> tuple[float, float]:
    """(activations on GPU at the peak with ``in_flight`` micro-batches, bytes offloaded).

    ``runtime``: whose saved tensors to count (``plait.plan.activations``): ``torch`` for plait's
    own runtime (the default: what ``plait train`` runs), ``megatron`` for Megatron-LM.
    ``stage``: the pipeline rank (how many of its layers offload depends on it). ``element_bytes``:
    bytes per element of the compute dtype (``GpuSpec.element_bytes``).
    """
    # split=ends: the first and last ranks hold a layer fewer (the embedding's and the loss's places)
    per_stage_layers = rank_layers(model, layout, stage) if layout.split == "ends" else \
        stage_layers(model, layout) * layout.vpp
    per_layer, moved = stage_layer_bytes(model, layout, job.seq_len, per_stage_layers, stage, runtime=runtime,
                                         element_bytes=element_bytes)
    offloaded = sum(moved) * in_flight
    total = sum(per_layer) * in_flight - offloaded
    if offloaded:
        total += offload_buffer_bytes(offloaded, moved, runtime)
    if checkpointed_layer_count(model, layout, per_stage_layers):
        full = sum(layer_items(model, layout, job.seq_len, runtime=runtime, element_bytes=element_bytes).values())
        total += full - min(per_layer)  # the dropped tensors of one layer, live again during its backward
    return total, offloaded


def offload_buffer_bytes(offloaded: float, moved: list[float], runtime: str = "torch") -> float:
    """Offloaded activation bytes (``moved``: by layer, for one micro-batch) still on the GPU at the
    peak. plait's runtime (``plait.run.memory.offload``): a double buffer of two layers, the one
    being copied and the one prefetched. Transformer Engine's CPU offload (``megatron-core``) waits
    for layer i's copy to the host only when layer L - N + i starts its forward and starts its reload
    when layer L - 1 - N + i starts its backward (N of a stage's L layers offloaded:
    transformer_engine/pytorch/cpu_offload.py, ``OffloadSynchronizer._default_offload_sync_init``,
    whose stated peak is the (L - N) kept layers): at the turn from forward to backward every
    offloaded layer has left the GPU and none has come back, so 0."""
    if runtime == "megatron-core":
        return 0.0
    return min(offloaded, 2 * max(moved))


def pipeline_buffer_bytes(model: ModelSpec, layout: Layout, job: JobSpec, rank: int, element_bytes: float,
                          runtime: str = "torch") -> float:
    """Receive buffers that torch.distributed.pipelining allocates on pipeline rank ``rank`` when the
    schedule is built and keeps for the whole run: one per micro-batch for each of the rank's stage
    chunks that receives activations (every stage but the first) and for each that receives
    gradients (every stage but the last), each one micro-batch's hidden state as sent between stages
    (sequence-parallel shard under sp); bytes. 0 without a pipeline and for other runtimes.

    The interleaved and zero-bubble schedules (torch's ``_PipelineScheduleRuntime``) also wait on
    their sends only at the end of the step, so every tensor the rank sent - one per micro-batch
    for each chunk that sends activations and each that sends gradients, as many as it receives -
    stays alive until then: twice the receive buffers. 1F1B and GPipe wait on each send at once."""
    if layout.pp == 1 or runtime != "torch":
        return 0.0
    rep = layout.tp if layout.sequence_parallel else 1
    one = element_bytes * job.seq_len / layout.cp * layout.mbs * model.hidden / rep
    forward = layout.vpp - (1 if rank == 0 else 0)
    backward = layout.vpp - (1 if rank == layout.pp - 1 else 0)
    held_sends = 2 if layout.schedule in SENDS_HELD_SCHEDULES else 1
    return held_sends * (forward + backward) * layout.micro_batches(job.global_batch) * one


def deferred_weight_grad_bytes(model: ModelSpec, layout: Layout, job: JobSpec, last_stage: bool,
                               element_bytes: float) -> float:
    """Output gradients that torch's zero-bubble schedule holds for ONE micro-batch on a stage that is
    not the first, between its input-gradient step (``stage_backward_input``) and its deferred
    weight-gradient step, bytes.

    ``stage_backward_input`` keeps, for every parameter, the gradient of the op where the weight
    meets the activations (its "intermediate"): per layer the outputs of the Q, K, V, output,
    gate/up and down projections and of the two norms; on the last stage also the final norm and
    the LM head (the logits' gradient, ``loss_tokens`` of them). Column-parallel outputs are
    sharded by tp; the row-parallel outputs (attention output, MLP down) are full-width partial
    sums; norm outputs are sharded by tp under sequence parallelism. The first stage skips the
    input step (its input needs no gradient) and runs its whole backward as the weight step."""
    tp = layout.tp
    norm_share = tp if layout.sequence_parallel else 1
    mlp_in = (2 if model.gated else 1) * model.ffn_hidden
    per_token = ((model.q_hidden + 2 * model.kv_hidden + mlp_in) / tp + 2 * model.hidden
                 + 2 * model.hidden / norm_share)
    tokens = job.seq_len / layout.cp * layout.mbs
    total = element_bytes * tokens * per_token * stage_layers(model, layout) * layout.vpp
    if last_stage:
        total += element_bytes * (tokens * model.hidden / norm_share
                                  + loss_tokens(layout, job.seq_len) * model.vocab / tp)
    return total


def rank_in_flight(layout: Layout, micro_batches: int, rank: int, runtime: str = "torch") -> float:
    """Micro-batches whose activations pipeline rank ``rank`` holds at its peak: all m for GPipe;
    ``in_flight_microbatches`` on the first stage and one on the last for 1F1B-type schedules, with
    p - r (at most m) between them, times the interleaved penalty factor (1 + (p-1)/(p·v)) for
    interleaved 1F1B. torch's zero-bubble (``runtime="torch"``) keeps min(p, m) on every rank:
    rank r runs p-1-r warm-up forwards and defers each weight step by r micro-batches, so a
    micro-batch's saved tensors stay until its weight step."""
    p, m = layout.pp, micro_batches
    first = in_flight_microbatches(layout, m)
    if p == 1 or rank == 0 or layout.schedule == "gpipe":
        return first
    if layout.schedule == "zero-bubble" and runtime == "torch":
        return float(min(p, m))
    if rank == p - 1:
        return 1.0
    factor = 1 + (p - 1) / (p * layout.vpp) if layout.schedule == "interleaved-1f1b" else 1.0
    return min(p - rank, m) * factor


def deferred_weight_grad_sets(layout: Layout, micro_batches: int, rank: int, runtime: str = "torch") -> int:
    """Micro-batches whose output gradients pipeline rank ``rank`` holds for a deferred weight
    step under torch's zero-bubble: r + 1 (at most m) on rank r > 0 (its weight step trails the
    input step by r micro-batches); none on the first rank, for other schedules and runtimes."""
    if layout.schedule != "zero-bubble" or runtime != "torch" or rank == 0 or layout.pp == 1:
        return 0
    return min(rank + 1, micro_batches)


def rank_memory(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout, rank: int,
                params: CostParams = DEFAULT_PARAMS, runtime: str = "torch") -> MemoryBreakdown:
    """Itemized peak memory of pipeline rank ``rank`` (0 .. pp-1; with pp = 1 the only one), bytes.
    ``stage`` names it "only", "first", "last" or the rank number."""
    e = cluster.gpu.element_bytes  # the compute dtype: 2 (bf16) on a GPU, 4 (fp32) on a CPU
    rep = layout.tp if layout.sequence_parallel else 1
    m = layout.micro_batches(job.global_batch)
    is_first, is_last = rank == 0, rank == layout.pp - 1
    # the embedding's output and dropout mask; Megatron-Core without dropout keeps nothing beyond what
    # the first layer saves of that same tensor (nn.Dropout(p=0) returns its input; the lookup saves ids)
    embed_share = (1.5 if model.dropout else 0.0 if runtime == "megatron-core" else 1.0)
    embed_per_mb = e * job.seq_len / layout.cp * layout.mbs * model.hidden / rep * embed_share
    # what the software's loss keeps per logit at its peak, as counted for its kernel (loss_peak_bytes),
    # or else logits_bytes_per_element's logits in the compute dtype with fp32 log-softmax and gradient;
    # soft-capped logits (Gemma-2): tanh saves its output beside them
    kept = params.loss_peak_bytes or params.logits_bytes_per_element - BF16 + e
    per_logit = kept + (e if model.logit_softcap else 0.0)
    logits = per_logit * loss_tokens(layout, job.seq_len) * model.vocab / layout.tp if is_last else 0.0
    local = stage_params(model, layout)
    held = local["first"] if is_first else local["last"] if is_last else local["middle"]
    weights, grads, optim, buffers, host = model_states(held, model, layout, e, params)
    grads += ddp_accumulation_bytes(held, layout, m, e)
    if model.moe is not None:  # routed experts: split by ep·etp, ZeRO over edp (plait.plan.moe.memory)
        experts = expert_states(model, layout, stage_layers(model, layout) * layout.vpp, e, runtime)
        weights, grads, optim, buffers, host = (a + b for a, b in zip((weights, grads, optim, buffers, host), experts))
    moe_buffers = dispatch_buffer_bytes(model, layout, job.seq_len, e) if model.moe is not None else 0.0
    in_flight = rank_in_flight(layout, m, rank, runtime)
    acts, offloaded = activation_bytes(model, layout, job, in_flight, runtime, stage=rank, element_bytes=e)
    embed_acts = in_flight * embed_per_mb if is_first else 0.0
    pipeline = pipeline_buffer_bytes(model, layout, job, rank, e, runtime)
    deferred = deferred_weight_grad_sets(layout, m, rank, runtime) * deferred_weight_grad_bytes(
        model, layout, job, is_last, e)
    copies = autocast_copy_bytes(model, layout, params, stage_layers(model, layout) * layout.vpp, is_last, e, runtime)
    dynamic = acts + embed_acts + logits + buffers + moe_buffers + pipeline + deferred + copies
    grads = gradients_at_peak(grads, layout, m, e, dynamic)
    stage = "only" if layout.pp == 1 else "first" if is_first else "last" if is_last else str(rank)
    return MemoryBreakdown(
        weights=weights, gradients=grads, optimizer=optim, activations=acts, embedding_activations=embed_acts,
        logits=logits, zero3_buffers=buffers, comm_buffers=params.comm_buffer_bytes,
        cuda_context=params.cuda_context_bytes, fragmentation=params.fragmentation * dynamic,
        capacity=cluster.gpu.hbm_bytes, stage=stage, host_bytes=host + offloaded, moe_buffers=moe_buffers,
        pipeline_buffers=pipeline, deferred_weight_grads=deferred, autocast_copies=copies,
    )


def estimate_memory(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
                    params: CostParams = DEFAULT_PARAMS, runtime: str = "torch") -> MemoryBreakdown:
    """Peak memory of the most loaded GPU (the larger of the first and last stages; with split=ends also
    the second, which keeps nearly the first's micro-batches in flight with a layer more)."""
    ranks = (0,) if layout.pp == 1 else tuple(sorted({0, 1, layout.pp - 1})) if layout.split == "ends" else \
        (0, layout.pp - 1)
    return max((rank_memory(model, cluster, job, layout, r, params, runtime) for r in ranks), key=lambda m: m.total)


def is_risky(memory: MemoryBreakdown, headroom: float = DEFAULT_HEADROOM) -> bool:
    """Whether a predicted peak lies inside the headroom: above capacity·(1 - ``headroom``)."""
    return memory.total > memory.capacity * (1.0 - headroom)
