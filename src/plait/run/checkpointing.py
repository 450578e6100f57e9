"""Activation checkpointing (recomputation) of transformer blocks, as the planner models it.

Policies (``Layout.ckpt``), applied to the first ``ckpt_layers`` blocks that a GPU holds
(all of its blocks when ``ckpt_layers`` is 0):

  * ``selective`` (Megatron's "selective recomputation"): recompute the attention core
    (softmax(QKᵀ)V). The block keeps Q, K, V and the attention output; the kernel's
    log-sum-exp (and, with eager attention, the s×s scores) are dropped.
  * ``full``: keep only the block's input and recompute the whole block in the backward.
  * ``balanced`` is a planner policy that the runtime does not run yet (it is refused by
    ``plait.run.config``).

Checkpointing is non-reentrant (``use_reentrant=False``): the reentrant form breaks pipeline
stages, whose backward passes explicit inputs to autograd.
"""

from __future__ import annotations

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)

from plait.run.model import Transformer
from plait.spec.layout import Layout


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
        elif layout.ckpt == "full":
            layers[layer_id] = checkpoint_wrapper(layers[layer_id], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        else:
            raise ValueError(f"checkpoint policy {layout.ckpt!r} is not run by the runtime")
    return chosen
