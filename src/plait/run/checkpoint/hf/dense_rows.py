"""The name tables of the dense families: Llama (Mistral, Qwen2, Qwen3), OLMo-2, Gemma-2, Phi-3,
GPT-2 and GPT-BigCode (rows: ``plait.run.checkpoint.hf.rows``; registered in ``map``)."""

from __future__ import annotations

from plait.run.checkpoint.hf.codecs import Conv1D, Copy, Fused
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
    norms,
    row,
    weight_and_bias,
)

# Llama and the families laid out like it (Mistral, Qwen2's Q/K/V biases, Qwen3's per-head q/k norms).
LLAMA_ROWS = [*ENDS, *attention(q_norm=True), *GATED_MLP, *PRE_NORMS]

# OLMo-2: norms after the attention and the MLP (post_attention_layernorm is the attention's), q/k
# norms over the whole projection.
OLMO2_ROWS = [*ENDS, *attention(q_norm=True), *GATED_MLP,
              *norms(post_attention_layernorm="attention_post_norm", post_feedforward_layernorm="ffn_post_norm")]

# Gemma-2: sandwich norms, four per block (weights w of a 1 + w scale in both).
GEMMA2_ROWS = [*ENDS, *attention(q_norm=False), *GATED_MLP,
               *norms(input_layernorm="attention_norm", post_attention_layernorm="attention_post_norm",
                      pre_feedforward_layernorm="ffn_norm", post_feedforward_layernorm="ffn_post_norm")]

# Phi-3: Llama's block with Q, K, V fused into qkv_proj and gate/up into gate_up_proj.
PHI3_ROWS = [
    *ENDS,
    row(HF_LAYER + "self_attn.qkv_proj.weight",
        (LAYER + "attention.wq.weight", LAYER + "attention.wk.weight", LAYER + "attention.wv.weight"),
        Fused(("h", "kv", "kv"), rope=True)),
    row(HF_LAYER + "self_attn.o_proj.weight", LAYER + "attention.wo.weight"),
    row(HF_LAYER + "mlp.gate_up_proj.weight", (LAYER + "feed_forward.w1.weight", LAYER + "feed_forward.w3.weight"),
        Fused(("ffn", "ffn"))),
    row(HF_LAYER + "mlp.down_proj.weight", LAYER + "feed_forward.w2.weight"),
    *PRE_NORMS,
]


def _gpt_rows(conv1d: bool) -> list[Row]:
    """GPT-2 (``conv1d``: weights stored (in, out)) and GPT-BigCode (``nn.Linear`` weights): Q, K and V
    fused in c_attn, LayerNorms with biases, learned positions."""
    weight = Conv1D() if conv1d else Copy()
    return [
        row("transformer.wte.weight", "tok_embeddings.weight"),
        row("transformer.wpe.weight", "pos_embeddings.weight"),
        *weight_and_bias("transformer.h.{i}.ln_1", LAYER + "attention_norm"),
        row("transformer.h.{i}.attn.c_attn.weight",
            (LAYER + "attention.wq.weight", LAYER + "attention.wk.weight", LAYER + "attention.wv.weight"),
            Fused(("h", "kv", "kv"), conv1d=conv1d)),
        row("transformer.h.{i}.attn.c_attn.bias",
            (LAYER + "attention.wq.bias", LAYER + "attention.wk.bias", LAYER + "attention.wv.bias"),
            Fused(("h", "kv", "kv"))),
        *weight_and_bias("transformer.h.{i}.attn.c_proj", LAYER + "attention.wo", weight),
        *weight_and_bias("transformer.h.{i}.ln_2", LAYER + "ffn_norm"),
        *weight_and_bias("transformer.h.{i}.mlp.c_fc", LAYER + "feed_forward.w1", weight),
        *weight_and_bias("transformer.h.{i}.mlp.c_proj", LAYER + "feed_forward.w2", weight),
        *weight_and_bias("transformer.ln_f", "norm"),
        row("lm_head.weight", "output.weight"),
    ]


_GPT_BUFFERS = (r".*\.attn\.(bias|masked_bias)$",)  # GPT-2's causal-mask buffers some checkpoints hold
LLAMA = Family("llama", tuple(LLAMA_ROWS), ("llama", "mistral", "qwen2", "qwen3"), "model.", ignored=ROTARY)
OLMO2 = Family("olmo2", tuple(OLMO2_ROWS), ("olmo2",), "model.", ignored=ROTARY)
GEMMA2 = Family("gemma2", tuple(GEMMA2_ROWS), ("gemma2",), "model.", ignored=ROTARY)
PHI3 = Family("phi3", tuple(PHI3_ROWS), ("phi3",), "model.", ignored=ROTARY)
GPT2 = Family("gpt2", tuple(_gpt_rows(conv1d=True)), ("gpt2",), "transformer.", ignored=_GPT_BUFFERS)
GPT_BIGCODE = Family("gpt_bigcode", tuple(_gpt_rows(conv1d=False)), ("gpt_bigcode",), "transformer.",
                     ignored=_GPT_BUFFERS)
