"""Mixture of experts: the dispatch and combine all-to-all of the stage's MoE layers, per micro-batch
(``plait.plan.moe.timing``), and the dropless dispatcher's per-layer synchronisation (the token-count
exchange, the device-to-host sync and the launches it exposes: ``plait.plan.moe.sync``). Seconds."""

from __future__ import annotations

from plait.plan.moe.memory import stage_layer_split
from plait.plan.moe.sync import moe_sync_layer
from plait.plan.moe.timing import moe_comm_layer
from plait.plan.params import CostParams
from plait.spec.hardware import ClusterSpec
from plait.spec.layout import Layout
from plait.spec.model import ModelSpec


def ep_microbatch(model: ModelSpec, cluster: ClusterSpec, lay: Layout, tokens: float, seq_len: int,
                  layers: int, n_ckpt: int, params: CostParams, runtime: str = "torch") -> tuple[float, float]:
    """(all-to-all, dispatcher synchronisation) seconds per micro-batch: the forward and backward
    all-to-all of each MoE layer and the forward's again for the layers whose MoE block is recomputed
    (``ckpt=full`` and ``mlp``: the checkpoint holds the token dispatcher, as Megatron's ``moe``
    module does); the synchronisation (``moe_sync_layer``) of each MoE layer, its forward part again
    for the recomputed ones. (0, 0) for a dense model. ``runtime``: whose expert groups
    (``plait.spec.moe.layout.expert_groups``)."""
    if model.moe is None:
        return 0.0, 0.0
    moe_layers = stage_layer_split(model, lay, layers)[1]
    a2a_fwd, a2a_bwd = moe_comm_layer(model, cluster, lay, tokens, seq_len, params, runtime)
    sync = moe_sync_layer(model, cluster, lay, params, runtime)
    recomputed = n_ckpt * moe_layers / layers if lay.ckpt in ("full", "mlp") else 0.0
    return (moe_layers * (a2a_fwd + a2a_bwd) + recomputed * a2a_fwd,
            moe_layers * sync.total + recomputed * sync.forward)
