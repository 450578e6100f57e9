"""The name tables of the mixture-of-experts families: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE
(rows: ``plait.run.checkpoint.hf.rows``; registered in ``map``).

Routed experts are ``{e}`` rows (``plait.run.checkpoint.hf.codecs.Experts``: the E per-expert
``nn.Linear`` weights that transformers' ``save_pretrained`` writes, stacked and transposed into
plait's expert-major (E, in, out)). The router (``gate``), the shared expert and its sigmoid gate
are plain rows.
"""

from __future__ import annotations

from plait.run.checkpoint.hf.codecs import EXPERT, Experts
from plait.run.checkpoint.hf.rows import (
    ENDS,
    GATED_MLP,
    HF_LAYER,
    LAYER,
    PRE_NORMS,
    ROTARY,
    Family,
    Row,
    attention,
    row,
)


def moe_rows(block: str, gate: str, up: str, down: str) -> list[Row]:
    """An MoE layer's MLP under ``model.layers.{i}.<block>``: the router (``gate``), the routed experts
    (``experts.{e}.<gate|up|down>.weight``), Qwen2-MoE's shared expert and its sigmoid gate."""
    mlp = HF_LAYER + block + "."
    ff = LAYER + "feed_forward."
    return [
        row(mlp + "gate.weight", ff + "router.weight"),
        row(f"{mlp}experts.{EXPERT}.{gate}.weight", ff + "experts.w1", Experts()),
        row(f"{mlp}experts.{EXPERT}.{up}.weight", ff + "experts.w3", Experts()),
        row(f"{mlp}experts.{EXPERT}.{down}.weight", ff + "experts.w2", Experts()),
        row(mlp + "shared_expert.gate_proj.weight", ff + "shared.w1.weight"),
        row(mlp + "shared_expert.up_proj.weight", ff + "shared.w3.weight"),
        row(mlp + "shared_expert.down_proj.weight", ff + "shared.w2.weight"),
        row(mlp + "shared_expert_gate.weight", ff + "shared_gate.weight"),
    ]


# Mixtral: Llama's attention; experts w1 (gate), w3 (up), w2 (down) under block_sparse_moe.
MIXTRAL_ROWS = [*ENDS, *attention(q_norm=False), *moe_rows("block_sparse_moe", "w1", "w3", "w2"), *PRE_NORMS]
# Qwen2-MoE (Q/K/V biases, shared expert), Qwen3-MoE (per-head q/k norms), OLMoE (q/k norms over the
# whole projections): experts gate_proj, up_proj, down_proj under mlp; dense layers (mlp_only_layers)
# as Llama's MLP.
QWEN_MOE_ROWS = [*ENDS, *attention(q_norm=True), *GATED_MLP,
                 *moe_rows("mlp", "gate_proj", "up_proj", "down_proj"), *PRE_NORMS]

MIXTRAL = Family("mixtral", tuple(MIXTRAL_ROWS), ("mixtral",), "model.", ignored=ROTARY)
QWEN_MOE = Family("qwen_moe", tuple(QWEN_MOE_ROWS), ("qwen2_moe", "qwen3_moe", "olmoe"), "model.", ignored=ROTARY)
