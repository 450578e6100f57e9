"""The name tables of the mixture-of-experts families: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and
DeepSeek-V3 (rows: ``plait.run.checkpoint.hf.rows``; registered in ``map``).

Routed experts are ``{e}`` rows (``plait.run.checkpoint.hf.codecs.Experts``: the E per-expert
``nn.Linear`` weights that transformers' ``save_pretrained`` writes, stacked and transposed into
plait's expert-major (E, in, out)). The router (``gate``), the shared expert and its sigmoid gate
are plain rows.

DeepSeek-V3 (transformers' ``DeepseekV3ForCausalLM``): multi-head latent attention
(``plait.run.modules.mla``: ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``, or ``q_proj`` without a
query rank; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``), copied as they are:
the decoupled RoPE rows need no permutation. With ``rope_interleave`` (DeepSeek's layout, true in
its checkpoints and transformers' default) transformers rotates the adjacent pairs (x[2j], x[2j+1])
of q_pe and k_pe by frequency j, as plait's ``apply_rope`` does, and writes the rotated vectors in
halves order: a permutation of the same elements for q and k alike, which leaves every score
unchanged. (``rope_interleave: false`` rotates the halves instead; ``plait.run.checkpoint.hf.load``
refuses it.) The sigmoid router's weight and its balancing bias (``gate.e_score_correction_bias``, a
persistent buffer in both: plait's ``score_bias``), the routed experts, the ``shared_experts``, and
the first ``first_k_dense_replace`` layers' dense MLPs as Llama's.
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



def _latent_attention() -> list[Row]:
    """DeepSeek-V2/V3's multi-head latent attention: transformers' names -> ``LatentAttention``'s."""
    hf, plait = HF_LAYER + "self_attn.", LAYER + "attention."
    names = {"q_a_proj": "wq_a", "q_a_layernorm": "q_norm", "q_b_proj": "wq_b", "q_proj": "wq",
             "kv_a_proj_with_mqa": "wkv_a", "kv_a_layernorm": "kv_norm", "kv_b_proj": "wkv_b", "o_proj": "wo"}
    return [row(f"{hf}{theirs}.weight", f"{plait}{ours}.weight") for theirs, ours in names.items()]


def _deepseek_moe() -> list[Row]:
    """DeepSeek-V3's MoE MLP under ``model.layers.{i}.mlp``: the sigmoid router and its balancing bias,
    the routed experts, the shared experts (n_shared of them side by side: one wider MLP in both)."""
    mlp, ff = HF_LAYER + "mlp.", LAYER + "feed_forward."
    return [
        row(mlp + "gate.weight", ff + "router.weight"),
        row(mlp + "gate.e_score_correction_bias", ff + "score_bias"),
        row(f"{mlp}experts.{EXPERT}.gate_proj.weight", ff + "experts.w1", Experts()),
        row(f"{mlp}experts.{EXPERT}.up_proj.weight", ff + "experts.w3", Experts()),
        row(f"{mlp}experts.{EXPERT}.down_proj.weight", ff + "experts.w2", Experts()),
        row(mlp + "shared_experts.gate_proj.weight", ff + "shared.w1.weight"),
        row(mlp + "shared_experts.up_proj.weight", ff + "shared.w3.weight"),
        row(mlp + "shared_experts.down_proj.weight", ff + "shared.w2.weight"),
    ]


# DeepSeek-V3: latent attention, Llama's norms, dense first layers (GATED_MLP) and the MoE MLP above.
DEEPSEEK_V3_ROWS = [*ENDS, *_latent_attention(), *GATED_MLP, *_deepseek_moe(), *PRE_NORMS]

MIXTRAL = Family("mixtral", tuple(MIXTRAL_ROWS), ("mixtral",), "model.", ignored=ROTARY)
QWEN_MOE = Family("qwen_moe", tuple(QWEN_MOE_ROWS), ("qwen2_moe", "qwen3_moe", "olmoe"), "model.", ignored=ROTARY)
DEEPSEEK_V3 = Family("deepseek_v3", tuple(DEEPSEEK_V3_ROWS), ("deepseek_v3",), "model.", ignored=ROTARY)
