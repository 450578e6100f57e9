"""The vocabulary of the name tables: a ``Row``, a ``Family``, and the rows most families share.

A family's table is a list of ``Row``s. A row names one tensor of the Hugging Face checkpoint
(``hf``, with ``{i}`` for the layer index and, for routed experts, ``{e}`` for the expert), the plait
parameters it holds (``plait``: one, or several for a fused Hugging Face tensor such as GPT-2's
``c_attn``) and the ``Codec`` (``plait.run.checkpoint.hf.codecs``) that converts between the two.
Rows whose plait parameter the model does not have are skipped, so a row may name an optional
parameter (biases, qk-norm). The tables themselves are in ``dense_rows`` and ``moe_rows`` (one module
per family group); ``plait.run.checkpoint.hf.map`` registers them.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.run.checkpoint.hf.codecs import Codec, Copy, QkNorm, RopeRows


@dataclass(frozen=True)
class Row:
    """One Hugging Face tensor (``hf``; ``{i}``: layer index) and the plait parameters it holds."""

    hf: str
    plait: tuple[str, ...]
    codec: Codec = Copy()


@dataclass(frozen=True)
class Family:
    """A table of rows and the Hugging Face ``model_type``s it reads and writes."""

    name: str
    rows: tuple[Row, ...]
    model_types: tuple[str, ...]  # Hugging Face config.json model_type values read with these rows
    strip_prefix: str  # checkpoints saved from the base model lack this prefix (GPT-2's own "h.0...")
    ignored: tuple[str, ...] = ()  # regexes of Hugging Face tensors that are buffers, not weights


def row(hf: str, plait: str | tuple[str, ...], codec: Codec = Copy()) -> Row:
    """A ``Row`` of one plait name or several."""
    return Row(hf, (plait,) if isinstance(plait, str) else plait, codec)


def weight_and_bias(hf: str, plait: str, weight: Codec = Copy(), bias: Codec = Copy()) -> list[Row]:
    """The ``.weight`` and ``.bias`` rows of one layer."""
    return [row(f"{hf}.weight", f"{plait}.weight", weight), row(f"{hf}.bias", f"{plait}.bias", bias)]


LAYER = "layers.{i}."  # plait's block prefix
HF_LAYER = "model.layers.{i}."  # the block prefix of Llama-like Hugging Face models
ROTARY = (r".*\.rotary_emb\.inv_freq$",)  # the rotary tables some checkpoints store: buffers, not weights


def attention(q_norm: bool) -> list[Row]:
    """Separate Q, K, V, O projections (with optional biases) and, with ``q_norm``, the q/k norm weights."""
    rows = [
        *weight_and_bias(HF_LAYER + "self_attn.q_proj", LAYER + "attention.wq", RopeRows("q"), RopeRows("q")),
        *weight_and_bias(HF_LAYER + "self_attn.k_proj", LAYER + "attention.wk", RopeRows("kv"), RopeRows("kv")),
        *weight_and_bias(HF_LAYER + "self_attn.v_proj", LAYER + "attention.wv"),
        *weight_and_bias(HF_LAYER + "self_attn.o_proj", LAYER + "attention.wo"),
    ]
    if q_norm:
        rows += [row(HF_LAYER + "self_attn.q_norm.weight", LAYER + "attention.q_norm.weight", QkNorm("q")),
                 row(HF_LAYER + "self_attn.k_norm.weight", LAYER + "attention.k_norm.weight", QkNorm("kv"))]
    return rows


GATED_MLP = [  # Llama's MLP (gate, up, down), with optional biases
    *weight_and_bias(HF_LAYER + "mlp.gate_proj", LAYER + "feed_forward.w1"),
    *weight_and_bias(HF_LAYER + "mlp.up_proj", LAYER + "feed_forward.w3"),
    *weight_and_bias(HF_LAYER + "mlp.down_proj", LAYER + "feed_forward.w2"),
]
ENDS = [  # the embedding, the final norm and the LM head of Llama-like models
    row("model.embed_tokens.weight", "tok_embeddings.weight"),
    row("model.norm.weight", "norm.weight"),
    row("lm_head.weight", "output.weight"),
]


def norms(**hf_to_plait: str) -> list[Row]:
    """The block's norm weights: Hugging Face name (under the block) -> plait module name."""
    return [row(f"{HF_LAYER}{hf}.weight", f"{LAYER}{plait}.weight") for hf, plait in hf_to_plait.items()]


PRE_NORMS = norms(input_layernorm="attention_norm", post_attention_layernorm="ffn_norm")  # Llama's two
