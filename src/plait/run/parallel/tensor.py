"""Tensor parallelism (Megatron-style) and sequence parallelism with ``torch.distributed.tensor.parallel``.

Inside a block, Q/K/V and the MLP's up-projections are column-parallel (each rank owns whole
heads and a slice of the FFN width) and the output projections row-parallel; multi-head latent
attention shards its up-projections by heads and replicates its low-rank down-projections
(``mla_attention_plan``). With sequence
parallelism (``Layout.sp``) the residual stream, the norms and dropout between the blocks run on
a 1/tp slice of the sequence: the column-parallel input is all-gathered and the row-parallel
output reduce-scattered, instead of one all-reduce in each place.

Mixture-of-experts blocks (``moe_block_plan``): with sequence parallelism the MoE takes this rank's
tokens (no gather), its router and shared-expert gate replicated with their gradients summed over
tp; the shared experts are a dense tensor-parallel MLP (``plait.run.parallel.moe_tensor``).

The token embedding is row-parallel (vocabulary-sharded); the LM head is column-parallel and,
with ``loss_parallel``, its vocabulary-sharded logits go straight into a parallel cross entropy
(``loss_parallel()`` context in the training step), so the full logits are never gathered.
GPT's learned position table is small and kept whole on every rank; with sequence parallelism
each rank adds its slice of the positions.

Q/K norms (``ModelSpec.qk_norm``): per-head norms (Qwen3, over head_dim) run on each rank's own
heads with the whole weight replicated (``SequenceParallel`` over the head axis: the weight's
gradient, partial on each rank, is summed over tp); norms over the whole projection (OLMo-2)
shard their weight like the projection's rows and sum each token's squares over tp (``SplitNorm``).
Post and sandwich norms (OLMo-2, Gemma-2) sit after the row-parallel output projections: with
sequence parallelism they run on the sequence shard, like the pre-norms.

Apply tensor parallelism first, before activation checkpointing, ``torch.compile`` and FSDP:
a plan key that does not resolve only warns, and the model would train wrongly.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from plait.run.model import Transformer
from plait.run.modules.layers import RMSNorm
from plait.run.modules.mla import LatentAttention
from plait.spec.model import ModelSpec


class SplitNorm(ParallelStyle):
    """An RMSNorm over a column-parallel projection's whole output (OLMo-2's q/k norms): its weight
    is sharded like the projection's rows (``Shard(0)``), its input and output are this rank's
    columns (plain tensors) and each token's sum of squares is all-reduced over tp
    (``plait.run.modules.layers.SplitRMSNorm``)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, RMSNorm):
            raise TypeError(f"SplitNorm shards an RMSNorm, not {type(module).__name__}")

        def shard(name, mod, mesh):
            for key, param in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(key, nn.Parameter(distribute_tensor(param, mesh, [Shard(0)])))

        distribute_module(module, device_mesh, shard)
        module.statistics_group = device_mesh.get_group()
        return module


def norm_plan(spec: ModelSpec, sequence_parallel: bool) -> dict:
    """The plan of a block's q/k norms and post norms (keys relative to the block)."""
    plan: dict = {}
    if spec.qk_norm == "head":  # (batch, seq, local heads, head_dim): the head axis is sharded
        plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    elif spec.qk_norm == "full":
        plan["attention.q_norm"] = SplitNorm()
        plan["attention.k_norm"] = SplitNorm()
    if spec.norm_position != "pre" and sequence_parallel:  # on the row-parallel outputs' sequence shards
        plan["attention_post_norm"] = SequenceParallel(use_local_output=True)
        plan["ffn_post_norm"] = SequenceParallel(use_local_output=True)
    return plan


def block_plan(sequence_parallel: bool, gated: bool) -> dict:
    """The plan of one transformer block's projections (keys relative to the block); ``gated``: SwiGLU's w3."""
    plan: dict = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
    }
    if gated:
        plan["feed_forward.w3"] = ColwiseParallel()
    if sequence_parallel:
        plan.update({
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
    else:
        plan.update({"attention.wo": RowwiseParallel(), "feed_forward.w2": RowwiseParallel()})
    return plan


def moe_block_plan(sequence_parallel: bool, moe: nn.Module) -> dict:
    """The plan of a block whose MLP is an MoE (``plait.run.modules.moe``; ``moe`` the block's
    ``MoEFeedForward``): attention as in a dense block; the shared experts a dense tensor-parallel
    MLP. With sequence parallelism the MoE takes this rank's tokens (no gather): the router and the
    shared experts' gate replicated with their gradients summed over tp (``SequenceParallel`` on the
    token axis), the shared experts on the gathered tokens, reduce-scattered back. Without it the
    router and the routed experts run whole on every tp rank (``plait.run.parallel.moe_tensor``)."""
    plan = {key: value for key, value in block_plan(sequence_parallel, gated=False).items()
            if not key.startswith("feed_forward")}
    rows = Shard(0)  # inside the MoE the tokens are rows (batch·seq, hidden)
    if sequence_parallel:
        plan["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                                  use_local_output=True)
        plan["feed_forward.router"] = SequenceParallel(sequence_dim=0, use_local_output=True)
        if moe.shared_gate is not None:
            plan["feed_forward.shared_gate"] = SequenceParallel(sequence_dim=0, use_local_output=True)
    if moe.shared is not None:
        plan["feed_forward.shared.w1"] = ColwiseParallel()
        plan["feed_forward.shared.w3"] = ColwiseParallel()
        if sequence_parallel:
            plan["feed_forward.shared"] = PrepareModuleInput(input_layouts=(rows,), desired_input_layouts=(Replicate(),))
            plan["feed_forward.shared.w2"] = RowwiseParallel(output_layouts=rows)
        else:
            plan["feed_forward.shared.w2"] = RowwiseParallel()
    return plan


def mla_attention_plan(plan: dict, sequence_parallel: bool, query_rank: bool) -> dict:
    """``plan`` (a block's) with multi-head latent attention (``plait.run.modules.mla``) in place of
    Q/K/V: the up-projections wq_b (or wq without a query rank) and wkv_b column-parallel by heads,
    wo row-parallel as before; wq_a, wkv_a and the latent norms replicated (not in the plan). With
    sequence parallelism the attention takes its gathered input as a plain tensor, which the
    replicated layers need."""
    out = {key: value for key, value in plan.items() if key not in ("attention.wq", "attention.wk", "attention.wv")}
    out["attention.wq_b" if query_rank else "attention.wq"] = ColwiseParallel()
    out["attention.wkv_b"] = ColwiseParallel()
    if sequence_parallel:
        out["attention"] = PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                              desired_input_layouts=(Replicate(), None, None), use_local_output=True)
    return out


def root_plan(model: Transformer, sequence_parallel: bool, loss_parallel: bool) -> dict:
    """The plan of the embedding, final norm and LM head that this (stage) model holds."""
    residual = Shard(1) if sequence_parallel else Replicate()
    plan: dict = {}
    if model.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
        if model.pos_embeddings is not None and sequence_parallel:
            plan["pos_embeddings"] = PrepareModuleOutput(output_layouts=Replicate(),
                                                         desired_output_layouts=Shard(0))
    if model.norm is not None and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan["output"] = ColwiseParallel(input_layouts=residual,
                                         output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                         use_local_output=not loss_parallel)
    return plan


def shard_sinks(attention, tp_mesh: DeviceMesh) -> None:
    """Attention sinks (one logit per query head) sharded as the heads are: ``Shard(0)``, so that
    each rank holds its own heads' sinks (``Attention.forward`` takes the local part)."""
    if getattr(attention, "sinks", None) is not None:
        from torch import nn
        from torch.distributed.tensor import distribute_tensor

        attention.sinks = nn.Parameter(distribute_tensor(attention.sinks.data, tp_mesh, [Shard(0)]))


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool,
                          loss_parallel: bool = True) -> None:
    """Shard ``model`` (a full model or a pipeline stage) over the 1-D ``tp_mesh``, in place."""
    tied = (model.spec.tied_embeddings and model.tok_embeddings is not None and model.output is not None)
    parallelize_module(model, tp_mesh, root_plan(model, sequence_parallel, loss_parallel))
    for block in model.layers.values():
        gated = getattr(block.feed_forward, "gated", None)
        plan = moe_block_plan(sequence_parallel, block.feed_forward) if gated is None \
            else block_plan(sequence_parallel, gated)
        if isinstance(block.attention, LatentAttention):
            plan = mla_attention_plan(plan, sequence_parallel, hasattr(block.attention, "wq_b"))
        parallelize_module(block, tp_mesh, {**plan, **norm_plan(model.spec, sequence_parallel)})
        shard_sinks(block.attention, tp_mesh)
    if tied:
        # both are Shard(0) over the vocabulary: tie them again after sharding
        model.output.weight = model.tok_embeddings.weight
