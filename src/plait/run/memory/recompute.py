"""Activation checkpointing (recomputation) of transformer blocks, as the planner models it.

Policies (``Layout.ckpt``), applied to the first ``ckpt_layers`` blocks that a GPU holds
(all of its blocks when ``ckpt_layers`` is 0):

  * ``selective`` (Megatron's "selective recomputation"): recompute the attention core
    (softmax(QKᵀ)V). The block keeps Q, K, V and the attention output; the kernel's
    log-sum-exp (and, with eager attention, the s×s scores) are dropped.
  * ``balanced`` (compute-memory balanced, Kwai's "GEMM-last"): torch's selective activation
    checkpoint (``create_selective_checkpoint_contexts``) over the whole block with a policy on
    op types: the outputs of the linear layers' GEMMs (``mm``, ``addmm``) and of the fused
    attention kernels are saved (``MUST_SAVE``); everything else - norms, RoPE, activation
    functions, residual adds, dropout, dtype casts, views - is recomputed in the backward
    (``PREFER_RECOMPUTE``). The batched GEMMs of eager attention (``bmm``: Q·Kᵀ and P·V) are
    recomputed too: saving their outputs would keep the s×s scores, the largest tensor of the
    layer; with eager attention ``balanced`` therefore recomputes the attention core as
    ``selective`` does. What the block keeps: its input, the Q/K/V, output-projection, MLP
    gate/up and down-projection GEMM outputs, and (flash) the attention output and log-sum-exp
    (``plait.plan.activations``, ``runtime="torch"``). The kept tensors live in the
    checkpoint's cache, not in autograd's saved-tensor slots (see ``plait.run.memory.offload``).
  * ``mlp`` (Megatron-Core's ``--recompute-modules mlp``/``moe``): the block's MLP half - its norm, the
    MLP or MoE block (router, dispatch and combine all-to-all, experts) and a post norm - runs in a
    non-reentrant checkpoint (``Block.mlp_half``, ``Block.recompute_mlp``): the block keeps what its
    attention half saves and the MLP half's input (the residual stream after attention); the MLP half
    runs again in the backward. Parameter names are unchanged (no wrapper module).
  * ``full``: keep only the block's input and recompute the whole block in the backward.

Checkpointing is non-reentrant (``use_reentrant=False``): the reentrant form breaks pipeline
stages, whose backward passes explicit inputs to autograd. ``create_selective_checkpoint_contexts``
and ``CheckpointPolicy`` are public since torch 2.4, with the same signatures on 2.11 and 2.13.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import (
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
)

from plait.run.model import Transformer
from plait.spec.layout import CKPT_POLICIES, Layout

POLICIES = CKPT_POLICIES  # the names are declared once, with the Layout key


def _ops(*names: str) -> frozenset:
    """The aten overloads among ``names`` that this torch build has (kernels vary by version)."""
    found = set()
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            found.add(packet.default)
    return frozenset(found)


# Outputs saved under ``balanced``: the linear layers' GEMMs and the fused attention kernels
# (CUDA flash / memory-efficient / cuDNN, and the CPU flash kernel).
BALANCED_SAVED_OPS = _ops(
    "mm", "addmm",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward", "_efficient_attention_forward",
)


def balanced_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Save GEMM and fused-attention outputs, recompute everything else (see module doc)."""
    return CheckpointPolicy.MUST_SAVE if op in BALANCED_SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def balanced_context():
    """``context_fn`` of ``torch.utils.checkpoint.checkpoint`` for the balanced policy."""
    return create_selective_checkpoint_contexts(balanced_policy)


def checkpointed_layer_ids(layer_ids: list[str], layout: Layout) -> list[str]:
    """Which of a GPU's blocks (in order, over all its virtual stages) use the checkpoint policy.

    ``ckpt_layers`` counts layers per GPU, as the planner does; 0 means all of them.
    """
    if layout.ckpt == "none":
        return []
    count = len(layer_ids) if not layout.ckpt_layers else min(layout.ckpt_layers, len(layer_ids))
    return layer_ids[:count]


def apply_activation_checkpointing(chunks: list[Transformer], layout: Layout) -> list[str]:
    """Apply the layout's policy to the blocks of this GPU's model chunks; returns their ids."""
    owner = {layer_id: chunk for chunk in chunks for layer_id in chunk.layers}
    chosen = checkpointed_layer_ids(list(owner), layout)
    for layer_id in chosen:
        layers = owner[layer_id].layers
        if layout.ckpt == "selective":
            layers[layer_id].attention.recompute_core = True
        elif layout.ckpt == "mlp":
            layers[layer_id].recompute_mlp = True
        elif layout.ckpt == "full":
            layers[layer_id] = checkpoint_wrapper(layers[layer_id], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        elif layout.ckpt == "balanced":
            layers[layer_id] = checkpoint_wrapper(layers[layer_id], checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                                  context_fn=balanced_context)
        else:
            raise ValueError(f"checkpoint policy {layout.ckpt!r} is not run by the runtime")
    return chosen
