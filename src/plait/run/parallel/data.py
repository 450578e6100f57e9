"""Data parallelism: DDP, ZeRO via FSDP2 ``fully_shard``, and hybrid sharding (HSDP).

How each planner ZeRO stage runs (``Layout.zero``):

  ========  ===================================================================================
  zero=0    DDP: ``DistributedDataParallel`` over the dp group; with tensor or pipeline
            parallelism, FSDP2 on a (dp_replicate=dp, dp_shard=1) mesh, which replicates
            parameters and all-reduces gradients exactly as DDP does (DDP's reducer does not
            survive the pipeline schedules' split backward, and cannot hold DTensors).
  zero=1    FSDP2 with ``reshard_after_forward=False``: parameters stay gathered from forward to
            backward, optimizer states sharded; in a step of several micro-batches all but the
            last accumulate full (unsharded) gradients and keep the parameters gathered
            (``plait.run.step``), so each unit is gathered once and reduce-scattered once per
            step: ZeRO-1. With one micro-batch it runs exactly as zero=2.
  zero=2    FSDP2 with ``reshard_after_forward=False``, gradients reduce-scattered after every
            micro-batch (only sharded gradients kept between micro-batches) and the parameters
            gathered again for the next.
  zero=3    FSDP2 with ``reshard_after_forward`` = ``Layout.reshard`` (default on: parameters
            freed after forward and gathered again for backward).
  hsdp=R    zero≥1 on a 2-D (dp_replicate=R, dp_shard=dp/R) mesh: shard inside groups of dp/R
            ranks, all-reduce gradients across the R groups.
  ========  ===================================================================================

FSDP units (one all-gather and one reduce-scatter each), as torchtitan groups them: the token
(and position) embedding is a unit of its own, each block is a unit, ``[final norm, LM head]``
is one unit that is never resharded after forward (it runs at the very end of forward and at
the very start of backward), and the root unit holds what is left (nothing in a full model).
Tied embeddings (the LM head's weight is the embedding's) put the embedding, final norm and LM
head in one unit, never resharded after forward: a parameter belongs to exactly one unit, and
that one is needed at both ends of forward and of backward. A pipeline stage wraps the parts it
holds (``unit_groups``). With context parallelism the cp ranks are
data-parallel ranks too (same weights, other tokens): FSDP shards over dp_shard×cp and DDP
all-reduces over dp_replicate×cp (``ParallelDims.dp_mesh`` / ``replicate_group``).
Mixed precision on GPU: bf16 parameters and compute, fp32 sharded master weights and fp32
gradient reduction. On CPU everything is fp32.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from plait.run.modules.experts import GroupedExperts
from plait.run.parallel.mesh import ParallelDims


def uses_fsdp(pdims: ParallelDims) -> bool:
    """Whether data parallelism runs through FSDP2 (else DDP or nothing)."""
    return pdims.layout.uses_fsdp


def mixed_precision(device_type: str) -> MixedPrecisionPolicy:
    if device_type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def unit_groups(model: nn.Module, reshard: bool) -> list[tuple[list[nn.Module], bool]]:
    """The FSDP units of ``model`` (a model or a pipeline stage) below its root, in forward order:
    (modules grouped in one unit, reshard_after_forward). ``reshard``: the layout's choice for the
    embedding and the blocks (ZeRO-3 with ``Layout.reshard``)."""
    embedding = [m for m in (model.tok_embeddings, getattr(model, "pos_embeddings", None)) if m is not None]
    head = [m for m in (model.norm, model.output) if m is not None]
    tied = (model.tok_embeddings is not None and model.output is not None
            and model.output.weight is model.tok_embeddings.weight)
    blocks = [([block], reshard) for block in model.layers.values()]
    if tied:
        return [(embedding + head, False)] + blocks
    return ([(embedding, reshard)] if embedding else []) + blocks + ([(head, False)] if head else [])


def apply_fsdp(model: nn.Module, pdims: ParallelDims, device_type: str, expert_edp_mesh=None) -> None:
    """Shard ``model`` (a model or a pipeline stage) unit by unit (``unit_groups``), then its root.

    ``expert_edp_mesh``: with expert parallelism and ZeRO, the expert-data-parallel mesh
    (``plait.run.parallel.expert``): each MoE layer's experts are a unit of their own sharded over
    it (their weights, already DTensors over ep, become 2-D sharded); without it they are left out."""
    layout = pdims.layout
    reshard = layout.zero == 3 and layout.reshard
    options = {"mesh": pdims.dp_mesh, "mp_policy": mixed_precision(device_type)}
    if expert_edp_mesh is not None:
        for experts in [m for m in model.modules() if isinstance(m, GroupedExperts)]:
            fully_shard(experts, mesh=expert_edp_mesh, reshard_after_forward=reshard,
                        mp_policy=mixed_precision(device_type))
    for modules, reshard_unit in unit_groups(model, reshard):
        fully_shard(modules if len(modules) > 1 else modules[0], reshard_after_forward=reshard_unit,
                    ignored_params=_sharded_experts(modules), **options)
    fully_shard(model, reshard_after_forward=reshard, ignored_params=_sharded_experts([model]), **options)


def reshard_all(modules: list[nn.Module]) -> None:
    """Reshard every FSDP unit in ``modules`` that holds gathered parameters (a no-op for the others)."""
    for module in modules:
        for unit in module.modules():
            if isinstance(unit, FSDPModule):
                unit.reshard()


def _sharded_experts(modules: list[nn.Module]) -> set[nn.Parameter] | None:
    """Expert-parallel expert weights (DTensors over the ep mesh) in ``modules``: FSDP leaves them
    alone; their gradients are reduced over the expert-data-parallel ranks instead
    (``plait.run.parallel.expert``)."""
    found = {p for module in modules for m in module.modules()
             if isinstance(m, GroupedExperts) and not isinstance(m, FSDPModule)
             for p in m.parameters() if isinstance(p, DTensor)}
    return found or None


def apply_ddp(model: nn.Module, pdims: ParallelDims) -> nn.Module:
    """Wrap ``model`` in DDP over the dp_replicate (×cp) group (zero=0 without tensor parallelism)."""
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError("DDP cannot hold DTensor parameters; use FSDP2 replication")
    # no buffer sync in the forward: every rank computes the same RoPE tables, and an MoE layer's
    # expert load counts are per rank (summed by plait.run.parallel.expert.balance_routers); the
    # sync at construction is harmless (all buffers start equal). torch >= 2.13 names this
    # forward_sync_buffers (broadcast_buffers is deprecated there); 2.11 has only broadcast_buffers.
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in parameters else {"broadcast_buffers": False}
    return DistributedDataParallel(model, process_group=pdims.replicate_group, gradient_as_bucket_view=True, **sync)
