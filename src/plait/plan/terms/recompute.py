"""What activation checkpointing repeats per checkpointed layer and micro-batch. Seconds."""

from __future__ import annotations

from plait.plan.kernels import LayerTimes
from plait.spec.layout import Layout


def recompute_layer(lay: Layout, times: LayerTimes, tp_one_way: float) -> float:
    """``full``: the layer's forward and its TP collectives; ``selective``: the attention core;
    ``balanced``: the element-wise work (plait's runtime keeps the fused attention kernel's output;
    eager attention's batched GEMMs are recomputed with the rest of the core, plait.run.memory.recompute);
    ``mlp``: the MLP half's forward, its GEMMs and element-wise work, and its half of the TP collectives
    (one all-gather and one reduce-scatter with sp, one all-reduce without; ``tp_one_way`` holds two);
    an MoE layer's dispatch and combine again are ``plait.plan.terms.expert``'s."""
    if lay.ckpt == "full":
        return times.fwd + tp_one_way
    if lay.ckpt == "mlp":
        return times.mlp_gemm_fwd + times.mlp_elementwise_fwd + tp_one_way / 2
    if lay.ckpt == "selective":
        return times.attn_fwd
    if lay.ckpt == "balanced":
        return times.elementwise_fwd + (times.attn_fwd if lay.attn == "eager" else 0.0)
    return 0.0
