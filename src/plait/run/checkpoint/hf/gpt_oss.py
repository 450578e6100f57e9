"""GPT-OSS's Hugging Face tensors beyond Llama's attention: the per-head sinks, the biased router and
the fused, biased experts (no torch at import: ``plait train`` asks for the table before any rank).

transformers' ``GptOssForCausalLM`` (what ``save_pretrained`` writes), per layer under
``model.layers.{i}.``:
  self_attn.sinks                (heads,)      -> attention.sinks
  mlp.router.weight / .bias      (E, h), (E,)  -> feed_forward.router.weight / .bias
  mlp.experts.gate_up_proj       (E, h, 2f)    -> feed_forward.experts.w1, .w3      (``GateUp``)
  mlp.experts.gate_up_proj_bias  (E, 2f)       -> feed_forward.experts.w1_bias, .w3_bias (``GateUp``)
  mlp.experts.down_proj          (E, f, h)     -> feed_forward.experts.w2
  mlp.experts.down_proj_bias     (E, h)        -> feed_forward.experts.w2_bias
Each expert tensor is one Hugging Face tensor, already expert-major like plait's
(``plait.run.modules.experts``): no per-expert ``{e}`` names. Gate and up are interleaved along the
last dim of ``gate_up_proj`` (gate = column 2j, up = column 2j + 1, transformers'
``GptOssExperts._apply_gate``); plait keeps them apart. Q/K/V/O (with biases), the embeddings, the
final norm and the pre-norms are Llama's rows (``plait.run.checkpoint.hf.rows``); ``GPT_OSS`` is the
family that ``plait.run.checkpoint.hf.map`` registers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait.run.checkpoint.hf.codecs import Codec
from plait.run.checkpoint.hf.rows import ENDS, HF_LAYER, LAYER, PRE_NORMS, ROTARY, Family, attention, row

if TYPE_CHECKING:
    import torch

    from plait.spec.model import ModelSpec


class GateUp(Codec):
    """The fused ``gate_up_proj`` (E, h, 2f) or its bias (E, 2f), gate and up interleaved on the last
    dim, to plait's (w1, w3) or (w1_bias, w3_bias) and back."""

    def to_plait(self, hf: torch.Tensor, spec: ModelSpec) -> tuple[torch.Tensor, ...]:
        return hf[..., 0::2].contiguous(), hf[..., 1::2].contiguous()

    def to_hf(self, plait: tuple[torch.Tensor, ...], spec: ModelSpec) -> torch.Tensor:
        import torch

        gate, up = plait
        return torch.stack((gate, up), dim=-1).flatten(-2)

    def __eq__(self, other) -> bool:
        return isinstance(other, GateUp)

    def __hash__(self) -> int:
        return hash(GateUp)


_EXPERTS = LAYER + "feed_forward.experts."
MLP_ROWS = (
    row(HF_LAYER + "self_attn.sinks", LAYER + "attention.sinks"),
    row(HF_LAYER + "mlp.router.weight", LAYER + "feed_forward.router.weight"),
    row(HF_LAYER + "mlp.router.bias", LAYER + "feed_forward.router.bias"),
    row(HF_LAYER + "mlp.experts.gate_up_proj", (_EXPERTS + "w1", _EXPERTS + "w3"), GateUp()),
    row(HF_LAYER + "mlp.experts.gate_up_proj_bias", (_EXPERTS + "w1_bias", _EXPERTS + "w3_bias"), GateUp()),
    row(HF_LAYER + "mlp.experts.down_proj", _EXPERTS + "w2"),
    row(HF_LAYER + "mlp.experts.down_proj_bias", _EXPERTS + "w2_bias"),
)
GPT_OSS = Family("gpt_oss", (*ENDS, *attention(q_norm=False), *MLP_ROWS, *PRE_NORMS), ("gpt_oss",), "model.",
                 ignored=ROTARY)
