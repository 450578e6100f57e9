"""The planner's itemized memory of every pipeline stage, not only the most loaded one. No torch.

``plait.plan.memory.estimate_memory`` evaluates the first and the last stage and keeps the larger;
``stage_memories`` applies the same rules to each of the pp ranks so that a picture can show all of
them against the capacity. Stage 0 holds the embedding and its output, the last stage the final
norm, the LM head and the logits; every stage holds its layers' model states and activations.
Micro-batches in flight on rank r: all m for GPipe; the planner's count on the first stage
(``in_flight_microbatches``) and one on the last; p - r (at most m) between them, 1F1B's count,
times the interleaved penalty factor (1 + (p-1)/(p·v)) for interleaved 1F1B. Bytes throughout.
"""

from __future__ import annotations

from plait.plan.activations import BF16
from plait.plan.memory import (
    MemoryBreakdown,
    model_states,  # the planner's own rule for weights, gradients, optimizer states under ZeRO
    activation_bytes,
    estimate_memory,
    in_flight_microbatches,
    loss_tokens,
    pipeline_buffer_bytes,
    stage_params,
)
from plait.plan.params import DEFAULT_PARAMS, CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec


def stage_in_flight(layout: Layout, micro_batches: int, rank: int) -> float:
    """Micro-batches whose activations pipeline rank ``rank`` holds at its peak (see module doc)."""
    p, m = layout.pp, micro_batches
    first = in_flight_microbatches(layout, m)
    if p == 1 or rank == 0 or layout.schedule == "gpipe":
        return first
    if rank == p - 1:
        return 1.0
    factor = 1 + (p - 1) / (p * layout.vpp) if layout.schedule == "interleaved-1f1b" else 1.0
    return min(p - rank, m) * factor


def stage_memories(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout,
                   params: CostParams = DEFAULT_PARAMS) -> list[MemoryBreakdown]:
    """One breakdown per pipeline rank (index = rank; ``stage`` names it "0", "1", ...); with pp = 1
    the planner's single breakdown. The largest total equals ``estimate_memory``'s."""
    if layout.pp == 1:
        return [estimate_memory(model, cluster, job, layout, params)]
    local = stage_params(model, layout)
    embedding = local["first"] - local["last"] + model.final_norm_params() + model.vocab * model.hidden / layout.tp
    layers_only = local["first"] - embedding  # the stage's transformer layers, after TP
    rep = layout.tp if layout.sequence_parallel else 1
    e = cluster.gpu.element_bytes  # the compute dtype (as plait.plan.memory.estimate_memory)
    embed_per_mb = e * job.seq_len / layout.cp * layout.mbs * model.hidden / rep * (1.5 if model.dropout else 1.0)
    per_logit = params.logits_bytes_per_element - BF16 + e  # the logits themselves in the compute dtype
    logits = per_logit * loss_tokens(layout, job.seq_len) * model.vocab / layout.tp
    m = layout.micro_batches(job.global_batch)
    out = []
    for rank in range(layout.pp):
        first, last = rank == 0, rank == layout.pp - 1
        held = local["first"] if first else local["last"] if last else layers_only
        weights, grads, optim, buffers, host = model_states(held, model, layout, e)
        in_flight = stage_in_flight(layout, m, rank)
        acts, offloaded = activation_bytes(model, layout, job, in_flight, stage=rank, element_bytes=e)
        embed_acts = in_flight * embed_per_mb if first else 0.0
        pipeline = pipeline_buffer_bytes(model, layout, job, rank, e)
        dynamic = acts + embed_acts + (logits if last else 0.0) + buffers + pipeline
        out.append(MemoryBreakdown(
            weights=weights, gradients=grads, optimizer=optim, activations=acts, embedding_activations=embed_acts,
            logits=logits if last else 0.0, zero3_buffers=buffers, comm_buffers=params.comm_buffer_bytes,
            cuda_context=params.cuda_context_bytes, fragmentation=params.fragmentation * dynamic,
            capacity=cluster.gpu.hbm_bytes, stage=str(rank), host_bytes=host + offloaded, pipeline_buffers=pipeline))
    return out
