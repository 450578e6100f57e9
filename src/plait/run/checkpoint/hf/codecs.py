"""The conversions between a Hugging Face tensor and the plait tensors it holds (one ``Codec`` each).

A row of a family's table (``plait.run.checkpoint.hf.rows``) names its codec; import calls
``to_plait``, export ``to_hf``. Every codec takes the ModelSpec (head counts, widths) as its only
context.

Rotary positions: plait's runtime (``plait.run.model.apply_rope``) rotates adjacent pairs
(x[2j], x[2j+1]) of each head; Hugging Face Llama-style models rotate the halves (x[j],
x[j + d/2]) (``rotate_half``). The two are the same attention once the rows of Wq and Wk (and
their biases, and the q/k norm weights) are permuted within each head: plait row 2j + r
is Hugging Face row r·d/2 + j (``RopeRows``; ``QkNorm`` for q/k norm weights, one head's
width or the whole projection's). GPT-2 has no rotary positions; its ``Conv1D``
layers store weights as (in, out), the transpose of ``nn.Linear``'s (``Conv1D``).

Mixture-of-experts layers: a row whose ``hf`` name holds ``{e}`` (``EXPERT``) stands for one Hugging
Face tensor per routed expert (e = 0 .. n_experts - 1, the per-expert ``nn.Linear`` weights that
transformers' ``save_pretrained`` writes); its codec converts the E of them stacked on a new dim 0
(``Experts``: plait's expert-major (E, in, out) is the transpose of the stacked (E, out, in)).
``expert_names`` lists the E names, ``OneExpert`` is the codec of one.

Torch is imported only inside the codecs that build tensors, so that the launcher can read the
tables before any worker starts without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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


def pairs_to_halves(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each of ``heads`` heads from plait's adjacent-pair order to Hugging Face's half order."""
    d = t.shape[0] // heads
    return t.reshape(heads, d // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def halves_to_pairs(t: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``pairs_to_halves``: Hugging Face's half order to plait's adjacent pairs."""
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
        return (halves_to_pairs(hf, self.count(spec)),)

    def to_hf(self, plait, spec):
        return pairs_to_halves(plait[0], self.count(spec))


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
            pieces[0] = halves_to_pairs(pieces[0], spec.n_heads)
            pieces[1] = halves_to_pairs(pieces[1], spec.n_kv_heads)
        return tuple(piece.contiguous() for piece in pieces)

    def to_hf(self, plait, spec):
        pieces = list(plait)
        if self.rope:
            pieces[0] = pairs_to_halves(pieces[0], spec.n_heads)
            pieces[1] = pairs_to_halves(pieces[1], spec.n_kv_heads)
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
