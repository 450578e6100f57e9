"""Hardware FLOPs: model FLOPs plus the forward work that activation checkpointing repeats.

Model FLOPs per token are ``ModelSpec.model_flops_per_token`` (6·N + attention, causal mask
counted explicitly, sliding-window layers counting the keys their window lets a query see).
Recomputation adds, per checkpointed layer:
  * ``full``: the layer's whole forward (GEMMs and attention);
  * ``mlp``: the MLP half's GEMMs (the matmul weights a token uses, less the attention's: router,
    routed top-k and shared experts in an MoE layer);
  * ``selective``: the attention core (Q·Kᵀ and P·V);
  * ``balanced``: element-wise work only (no matmul FLOPs), plus the attention core (Q·Kᵀ and
    P·V) with eager attention, whose batched GEMMs plait's runtime recomputes.
With ``causal=False`` and full recomputation of every layer, the count for a GPT model with
ffn = 4h equals Megatron-LM's 96·B·s·l·h²·(1 + s/6h + V/16lh) (Narayanan et al. 2021, Eq. 3).
"""

from __future__ import annotations

from plait.spec.layout import Layout
from plait.spec.model import ModelSpec
from plait.spec.moe.counts import attention_matmul_params


def recompute_fraction(model: ModelSpec, layout: Layout) -> float:
    """Fraction of all layers that are checkpointed."""
    if layout.ckpt == "none":
        return 0.0
    if not layout.ckpt_layers:
        return 1.0
    per_stage = -(-model.n_layers // layout.pp)
    return min(1.0, layout.ckpt_layers / per_stage)


def recompute_flops_per_token(model: ModelSpec, layout: Layout, seq_len: int, causal: bool = True) -> float:
    """Extra forward FLOPs per token repeated in the backward by checkpointing."""
    fraction = recompute_fraction(model, layout)
    if fraction == 0.0:
        return 0.0
    attention = model.attention_flops_per_token(seq_len, causal)
    if layout.ckpt == "full":
        layer_gemms = 2.0 * model.n_layers * model.layer_matmul_params()
        return fraction * (layer_gemms + attention)
    if layout.ckpt == "mlp":
        return fraction * 2.0 * model.n_layers * (model.layer_matmul_params() - attention_matmul_params(model))
    if layout.ckpt == "selective":
        return fraction * attention
    if layout.ckpt == "balanced" and layout.attn == "eager":
        return fraction * attention  # plait's runtime recomputes eager attention's core
    return 0.0


def hardware_flops_per_token(model: ModelSpec, layout: Layout, seq_len: int, causal: bool = True) -> float:
    return model.model_flops_per_token(seq_len, causal) + recompute_flops_per_token(model, layout, seq_len, causal)
