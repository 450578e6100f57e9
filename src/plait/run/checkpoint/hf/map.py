"""Which Hugging Face tensor holds which plait parameter, per model family: one table each.

A family's table is a list of ``Row``s. A row names one tensor of the Hugging Face checkpoint
(``hf``, with ``{i}`` for the layer index), the plait parameters it holds (``plait``: one, or
several for a fused Hugging Face tensor such as GPT-2's ``c_attn``) and the ``Codec`` that
converts between the two. Import (``plait.run.checkpoint.hf.load``) asks for the row of each
plait parameter a rank holds; export (``plait.run.checkpoint.hf.export``) walks the rows of the
whole model. A plait parameter without a row, or a Hugging Face tensor that no row reads, is an
error naming it: nothing is silently dropped.

A new parameter or family: add rows (and, for a new conversion, a codec). Rows whose plait
parameter the model lacks are skipped: a row may name an optional one (biases, qk-norm).

Rotary positions: plait's runtime (``plait.run.model.apply_rope``) rotates adjacent pairs
(x[2j], x[2j+1]) of each head; Hugging Face Llama-style models rotate the halves (x[j],
x[j + d/2]) (``rotate_half``). The two are the same attention once the rows of Wq and Wk (and
their biases, and the q/k norm weights) are permuted within each head: plait row 2j + r
is Hugging Face row r·d/2 + j (``RopeRows``; ``QkNorm`` for q/k norm weights, one head's
width or the whole projection's). GPT-2 has no rotary positions; its ``Conv1D``
layers store weights as (in, out), the transpose of ``nn.Linear``'s (``Conv1D``).

Mixture-of-experts layers (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): a row whose ``hf`` name holds
``{e}`` stands for one Hugging Face tensor per routed expert (e = 0 .. n_experts - 1, the per-expert
``nn.Linear`` weights that transformers' ``save_pretrained`` writes); its codec converts the E
of them stacked on a new dim 0 (``Experts``: plait's expert-major (E, in, out) is the transpose of
the stacked (E, out, in)). ``expert_names`` lists the E names, ``OneExpert`` is the codec of one.
The router (``gate``), shared expert and its sigmoid gate are plain rows. GPT-OSS's own rows (sinks,
fused biased experts) are in ``plait.run.checkpoint.hf.gpt_oss``. DeepSeek-V2/V3 (MLA names not
mapped yet) have no table: ``family_of_model_type`` refuses them by name.

Torch is imported only inside the codecs, so ``plait train`` asks ``family_of_model_type`` before any worker starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from plait.errors import PlaitError
from plait.run.checkpoint.hf.gpt_oss import MLP_ROWS as GPT_OSS_MLP
from plait.spec.model import ModelSpec

if TYPE_CHECKING:
    import torch


class Codec:
    """Converts the plait tensors of a row to its Hugging Face tensor and back (one tensor each way
    for a plain row; a fused Hugging Face tensor splits into several plait tensors)."""

    def to_plait(self, hf: torch.Tensor, spec: ModelSpec) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def to_hf(self, plait: tuple[torch.Tensor, ...], spec: ModelSpec) -> torch.Tensor:
        raise NotImplementedError


class Copy(Codec):
    """The same tensor in both (norms, embeddings, Llama's o/gate/up/down projections)."""

    def to_plait(self, hf, spec):
        return (hf,)

    def to_hf(self, plait, spec):
        return plait[0]


def _pairs_to_halves(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each of ``heads`` heads from plait's adjacent-pair order to Hugging Face's half order."""
    d = t.shape[0] // heads
    return t.reshape(heads, d // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def _halves_to_pairs(t: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``_pairs_to_halves``: Hugging Face's half order to plait's adjacent pairs."""
    d = t.shape[0] // heads
    return t.reshape(heads, 2, d // 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


@dataclass(frozen=True)
class RopeRows(Codec):
    """Wq or Wk (weight or bias), or a per-head q/k norm weight: rows permuted within each head.

    ``heads``: "q" (``n_heads``), "kv" (``n_kv_heads``) or "one" (a single head_dim vector)."""

    heads: str

    def count(self, spec: ModelSpec) -> int:
        return {"q": spec.n_heads, "kv": spec.n_kv_heads, "one": 1}[self.heads]

    def to_plait(self, hf, spec):
        return (_halves_to_pairs(hf, self.count(spec)),)

    def to_hf(self, plait, spec):
        return _pairs_to_halves(plait[0], self.count(spec))


@dataclass(frozen=True)
class QkNorm(Codec):
    """A q or k norm weight (``which``: "q" or "kv"), rows permuted as the projection's: one head_dim
    vector shared by the heads (``ModelSpec.qk_norm`` "head", Qwen3) or the whole projection's width
    ("full", OLMo-2)."""

    which: str

    def rows(self, spec: ModelSpec) -> RopeRows:
        return RopeRows("one" if spec.qk_norm == "head" else self.which)

    def to_plait(self, hf, spec):
        return self.rows(spec).to_plait(hf, spec)

    def to_hf(self, plait, spec):
        return self.rows(spec).to_hf(plait, spec)


class Conv1D(Codec):
    """GPT-2's Conv1D weight, (in, out): the transpose of plait's ``nn.Linear`` weight (out, in)."""

    def to_plait(self, hf, spec):
        return (hf.t().contiguous(),)

    def to_hf(self, plait, spec):
        return plait[0].t().contiguous()


@dataclass(frozen=True)
class Fused(Codec):
    """A Hugging Face tensor that concatenates several plait tensors along their output rows:
    GPT-2's ``c_attn`` (Q, K, V; ``conv1d``: stored transposed), Phi-3's ``qkv_proj`` (``rope``:
    Q and K rows permuted as ``RopeRows``) and ``gate_up_proj``. ``parts`` names each part's
    width: "h" (n_heads·head_dim), "kv" (n_kv_heads·head_dim) or "ffn"."""

    parts: tuple[str, ...]
    conv1d: bool = False
    rope: bool = False

    def widths(self, spec: ModelSpec) -> list[int]:
        sizes = {"h": spec.n_heads * spec.head_dim, "kv": spec.kv_hidden, "ffn": spec.ffn_hidden}
        return [sizes[part] for part in self.parts]

    def to_plait(self, hf, spec):
        rows = hf.t() if self.conv1d else hf
        pieces = list(rows.split(self.widths(spec), dim=0))
        if self.rope:
            pieces[0] = _halves_to_pairs(pieces[0], spec.n_heads)
            pieces[1] = _halves_to_pairs(pieces[1], spec.n_kv_heads)
        return tuple(piece.contiguous() for piece in pieces)

    def to_hf(self, plait, spec):
        pieces = list(plait)
        if self.rope:
            pieces[0] = _pairs_to_halves(pieces[0], spec.n_heads)
            pieces[1] = _pairs_to_halves(pieces[1], spec.n_kv_heads)
        import torch

        fused = torch.cat(pieces, dim=0)
        return fused.t().contiguous() if self.conv1d else fused


class Experts(Codec):
    """The routed experts' weights: the E per-expert ``nn.Linear`` weights (out, in) of Hugging Face,
    stacked on a new dim 0 (E, out, in), are plait's expert-major (E, in, out) transposed."""

    def to_plait(self, hf, spec):
        return (hf.transpose(1, 2).contiguous(),)

    def to_hf(self, plait, spec):
        return plait[0].transpose(1, 2).contiguous()


@dataclass(frozen=True)
class OneExpert(Codec):
    """Expert ``expert``'s Hugging Face tensor of an ``{e}`` row (export writes them one by one); import
    reads the E of a row together (``expert_names``) and converts them with the row's own codec."""

    expert: int
    of: Codec

    def to_plait(self, hf, spec):
        raise NotImplementedError("an expert row is read whole: stack its expert_names, then row.codec")

    def to_hf(self, plait, spec):
        return self.of.to_hf(plait, spec)[self.expert]


EXPERT = "{e}"  # the routed-expert index in a row's Hugging Face name


def expert_names(hf: str, spec: ModelSpec) -> list[str]:
    """The Hugging Face names a row's (layer-concrete) name stands for: one per routed expert when it
    holds ``{e}``, else itself."""
    if EXPERT not in hf:
        return [hf]
    return [hf.replace(EXPERT, str(e)) for e in range(spec.moe.n_experts)]


@dataclass(frozen=True)
class Row:
    """One Hugging Face tensor (``hf``; ``{i}``: layer index) and the plait parameters it holds."""

    hf: str
    plait: tuple[str, ...]
    codec: Codec = Copy()


def _row(hf: str, plait: str | tuple[str, ...], codec: Codec = Copy()) -> Row:
    return Row(hf, (plait,) if isinstance(plait, str) else plait, codec)


def _weight_and_bias(hf: str, plait: str, weight: Codec = Copy(), bias: Codec = Copy()) -> list[Row]:
    return [_row(f"{hf}.weight", f"{plait}.weight", weight), _row(f"{hf}.bias", f"{plait}.bias", bias)]


_L = "layers.{i}."  # plait's block prefix
_HF = "model.layers.{i}."  # the block prefix of Llama-like Hugging Face models


def _attention(q_norm: bool) -> list[Row]:
    """Separate Q, K, V, O projections (with optional biases) and, with ``q_norm``, the q/k norm weights."""
    rows = [
        *_weight_and_bias(_HF + "self_attn.q_proj", _L + "attention.wq", RopeRows("q"), RopeRows("q")),
        *_weight_and_bias(_HF + "self_attn.k_proj", _L + "attention.wk", RopeRows("kv"), RopeRows("kv")),
        *_weight_and_bias(_HF + "self_attn.v_proj", _L + "attention.wv"),
        *_weight_and_bias(_HF + "self_attn.o_proj", _L + "attention.wo"),
    ]
    if q_norm:
        rows += [_row(_HF + "self_attn.q_norm.weight", _L + "attention.q_norm.weight", QkNorm("q")),
                 _row(_HF + "self_attn.k_norm.weight", _L + "attention.k_norm.weight", QkNorm("kv"))]
    return rows


_GATED_MLP = [
    *_weight_and_bias(_HF + "mlp.gate_proj", _L + "feed_forward.w1"),
    *_weight_and_bias(_HF + "mlp.up_proj", _L + "feed_forward.w3"),
    *_weight_and_bias(_HF + "mlp.down_proj", _L + "feed_forward.w2"),
]
_ENDS = [
    _row("model.embed_tokens.weight", "tok_embeddings.weight"),
    _row("model.norm.weight", "norm.weight"),
    _row("lm_head.weight", "output.weight"),
]


def _norms(**hf_to_plait: str) -> list[Row]:
    """The block's norm weights: Hugging Face name (under the block) -> plait module name."""
    return [_row(f"{_HF}{hf}.weight", f"{_L}{plait}.weight") for hf, plait in hf_to_plait.items()]


# Llama and the families laid out like it (Mistral, Qwen2's Q/K/V biases, Qwen3's per-head q/k norms).
LLAMA_ROWS = [*_ENDS, *_attention(q_norm=True), *_GATED_MLP,
              *_norms(input_layernorm="attention_norm", post_attention_layernorm="ffn_norm")]

# OLMo-2: norms after the attention and the MLP (post_attention_layernorm is the attention's), q/k
# norms over the whole projection.
OLMO2_ROWS = [*_ENDS, *_attention(q_norm=True), *_GATED_MLP,
              *_norms(post_attention_layernorm="attention_post_norm", post_feedforward_layernorm="ffn_post_norm")]

# Gemma-2: sandwich norms, four per block (weights w of a 1 + w scale in both).
GEMMA2_ROWS = [*_ENDS, *_attention(q_norm=False), *_GATED_MLP,
               *_norms(input_layernorm="attention_norm", post_attention_layernorm="attention_post_norm",
                       pre_feedforward_layernorm="ffn_norm", post_feedforward_layernorm="ffn_post_norm")]

# Phi-3: Llama's block with Q, K, V fused into qkv_proj and gate/up into gate_up_proj.
PHI3_ROWS = [
    *_ENDS,
    _row(_HF + "self_attn.qkv_proj.weight",
         (_L + "attention.wq.weight", _L + "attention.wk.weight", _L + "attention.wv.weight"),
         Fused(("h", "kv", "kv"), rope=True)),
    _row(_HF + "self_attn.o_proj.weight", _L + "attention.wo.weight"),
    _row(_HF + "mlp.gate_up_proj.weight", (_L + "feed_forward.w1.weight", _L + "feed_forward.w3.weight"),
         Fused(("ffn", "ffn"))),
    _row(_HF + "mlp.down_proj.weight", _L + "feed_forward.w2.weight"),
    *_norms(input_layernorm="attention_norm", post_attention_layernorm="ffn_norm"),
]


def _moe_rows(block: str, gate: str, up: str, down: str) -> list[Row]:
    """An MoE layer's MLP under ``model.layers.{i}.<block>``: the router (``gate``), the routed experts
    (``experts.{e}.<gate|up|down>.weight``), Qwen2-MoE's shared expert and its sigmoid gate."""
    mlp = _HF + block + "."
    ff = _L + "feed_forward."
    return [
        _row(mlp + "gate.weight", ff + "router.weight"),
        _row(f"{mlp}experts.{EXPERT}.{gate}.weight", ff + "experts.w1", Experts()),
        _row(f"{mlp}experts.{EXPERT}.{up}.weight", ff + "experts.w3", Experts()),
        _row(f"{mlp}experts.{EXPERT}.{down}.weight", ff + "experts.w2", Experts()),
        _row(mlp + "shared_expert.gate_proj.weight", ff + "shared.w1.weight"),
        _row(mlp + "shared_expert.up_proj.weight", ff + "shared.w3.weight"),
        _row(mlp + "shared_expert.down_proj.weight", ff + "shared.w2.weight"),
        _row(mlp + "shared_expert_gate.weight", ff + "shared_gate.weight"),
    ]


_PRE_NORMS = _norms(input_layernorm="attention_norm", post_attention_layernorm="ffn_norm")
# Mixtral: Llama's attention; experts w1 (gate), w3 (up), w2 (down) under block_sparse_moe.
MIXTRAL_ROWS = [*_ENDS, *_attention(q_norm=False), *_moe_rows("block_sparse_moe", "w1", "w3", "w2"), *_PRE_NORMS]
# Qwen2-MoE (Q/K/V biases, shared expert), Qwen3-MoE (per-head q/k norms), OLMoE (q/k norms over the
# whole projections): experts gate_proj, up_proj, down_proj under mlp; dense layers (mlp_only_layers)
# as Llama's MLP.
QWEN_MOE_ROWS = [*_ENDS, *_attention(q_norm=True), *_GATED_MLP,
                 *_moe_rows("mlp", "gate_proj", "up_proj", "down_proj"), *_PRE_NORMS]


def _gpt_rows(conv1d: bool) -> list[Row]:
    """GPT-2 (``conv1d``: weights stored (in, out)) and GPT-BigCode (``nn.Linear`` weights): Q, K and V
    fused in c_attn, LayerNorms with biases, learned positions."""
    weight = Conv1D() if conv1d else Copy()
    return [
        _row("transformer.wte.weight", "tok_embeddings.weight"),
        _row("transformer.wpe.weight", "pos_embeddings.weight"),
        *_weight_and_bias("transformer.h.{i}.ln_1", _L + "attention_norm"),
        _row("transformer.h.{i}.attn.c_attn.weight",
             (_L + "attention.wq.weight", _L + "attention.wk.weight", _L + "attention.wv.weight"),
             Fused(("h", "kv", "kv"), conv1d=conv1d)),
        _row("transformer.h.{i}.attn.c_attn.bias",
             (_L + "attention.wq.bias", _L + "attention.wk.bias", _L + "attention.wv.bias"), Fused(("h", "kv", "kv"))),
        *_weight_and_bias("transformer.h.{i}.attn.c_proj", _L + "attention.wo", weight),
        *_weight_and_bias("transformer.h.{i}.ln_2", _L + "ffn_norm"),
        *_weight_and_bias("transformer.h.{i}.mlp.c_fc", _L + "feed_forward.w1", weight),
        *_weight_and_bias("transformer.h.{i}.mlp.c_proj", _L + "feed_forward.w2", weight),
        *_weight_and_bias("transformer.ln_f", "norm"),
        _row("lm_head.weight", "output.weight"),
    ]


GPT2_ROWS = _gpt_rows(conv1d=True)
GPT_BIGCODE_ROWS = _gpt_rows(conv1d=False)


@dataclass(frozen=True)
class Family:
    """A table of rows and the Hugging Face ``model_type``s it reads and writes."""

    name: str
    rows: tuple[Row, ...]
    model_types: tuple[str, ...]  # Hugging Face config.json model_type values read with these rows
    strip_prefix: str  # checkpoints saved from the base model lack this prefix (GPT-2's own "h.0...")
    ignored: tuple[str, ...] = ()  # regexes of Hugging Face tensors that are buffers, not weights


_ROTARY = (r".*\.rotary_emb\.inv_freq$",)
LLAMA = Family("llama", tuple(LLAMA_ROWS), ("llama", "mistral", "qwen2", "qwen3"), "model.", ignored=_ROTARY)
OLMO2 = Family("olmo2", tuple(OLMO2_ROWS), ("olmo2",), "model.", ignored=_ROTARY)
GEMMA2 = Family("gemma2", tuple(GEMMA2_ROWS), ("gemma2",), "model.", ignored=_ROTARY)
PHI3 = Family("phi3", tuple(PHI3_ROWS), ("phi3",), "model.", ignored=_ROTARY)
GPT2 = Family("gpt2", tuple(GPT2_ROWS), ("gpt2",), "transformer.", ignored=(r".*\.attn\.(bias|masked_bias)$",))
GPT_BIGCODE = Family("gpt_bigcode", tuple(GPT_BIGCODE_ROWS), ("gpt_bigcode",), "transformer.",
                     ignored=(r".*\.attn\.(bias|masked_bias)$",))
MIXTRAL = Family("mixtral", tuple(MIXTRAL_ROWS), ("mixtral",), "model.", ignored=_ROTARY)
QWEN_MOE = Family("qwen_moe", tuple(QWEN_MOE_ROWS), ("qwen2_moe", "qwen3_moe", "olmoe"), "model.", ignored=_ROTARY)
GPT_OSS = Family("gpt_oss", (*_ENDS, *_attention(q_norm=False), *(Row(h, p, c or Copy()) for h, p, c in GPT_OSS_MLP),
                             *_PRE_NORMS), ("gpt_oss",), "model.", ignored=_ROTARY)
FAMILIES = (LLAMA, OLMO2, GEMMA2, PHI3, GPT2, GPT_BIGCODE, MIXTRAL, QWEN_MOE, GPT_OSS)
_MLA = "names of its multi-head latent attention are not mapped yet (plait train runs it from scratch)"  # why no table
NO_TABLE = {"deepseek_v2": _MLA, "deepseek_v3": _MLA}


def family_of_model_type(model_type: str) -> Family:
    """The table that reads a Hugging Face checkpoint of ``model_type`` (config.json); PlaitError otherwise."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    known = ", ".join(t for family in FAMILIES for t in family.model_types)
    if model_type in NO_TABLE:
        raise PlaitError(f"Hugging Face model_type {model_type!r} has no weight-name table in plait: plait's "
                         f"{NO_TABLE[model_type]} (tables for: {known})")
    raise PlaitError(f"Hugging Face model_type {model_type!r} has no weight-name table in plait "
                     f"(plait.run.checkpoint.hf.map; tables for: {known})")


_LAYER = re.compile(r"^layers\.(\d+)\.")


def layer_pattern(name: str) -> tuple[str, str | None]:
    """(``name`` with its layer index replaced by ``{i}``, the index) of a plait parameter name."""
    match = _LAYER.match(name)
    if not match:
        return name, None
    return _L + name[match.end():], match.group(1)


def rows_by_plait(family: Family) -> dict[str, tuple[Row, int]]:
    """{plait name pattern: (its row, its position among the row's plait tensors)}."""
    return {plait: (row, k) for row in family.rows for k, plait in enumerate(row.plait)}


def row_for(family: Family, name: str) -> tuple[Row, int, str | None]:
    """(row, position in the row, layer index) of plait parameter ``name``; PlaitError when no row has it."""
    pattern, layer = layer_pattern(name)
    found = rows_by_plait(family).get(pattern)
    if found is None:
        raise PlaitError(f"plait parameter {name} has no Hugging Face name in the {family.name} table "
                         "(add a row to plait.run.checkpoint.hf.map)")
    return found[0], found[1], layer


def concrete(pattern: str, layer: str | None) -> str:
    """A row's name pattern for one layer (``{i}`` replaced; names outside the layers unchanged)."""
    return pattern.replace("{i}", layer) if layer is not None else pattern
