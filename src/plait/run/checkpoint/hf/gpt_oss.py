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
final norm and the pre-norms are Llama's rows (``plait.run.checkpoint.hf.map``, which builds the
family from ``MLP_ROWS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from plait.spec.model import ModelSpec

_HF = "model.layers.{i}."
_L = "layers.{i}."


class GateUp:
    """A ``plait.run.checkpoint.hf.map.Codec``: the fused ``gate_up_proj`` (E, h, 2f) or its bias (E, 2f),
    gate and up interleaved on the last dim, to plait's (w1, w3) or (w1_bias, w3_bias) and back."""

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


# (Hugging Face name, plait names, codec: None for the same tensor in both)
MLP_ROWS: tuple[tuple[str, tuple[str, ...], GateUp | None], ...] = (
    (_HF + "self_attn.sinks", (_L + "attention.sinks",), None),
    (_HF + "mlp.router.weight", (_L + "feed_forward.router.weight",), None),
    (_HF + "mlp.router.bias", (_L + "feed_forward.router.bias",), None),
    (_HF + "mlp.experts.gate_up_proj", (_L + "feed_forward.experts.w1", _L + "feed_forward.experts.w3"), GateUp()),
    (_HF + "mlp.experts.gate_up_proj_bias",
     (_L + "feed_forward.experts.w1_bias", _L + "feed_forward.experts.w3_bias"), GateUp()),
    (_HF + "mlp.experts.down_proj", (_L + "feed_forward.experts.w2",), None),
    (_HF + "mlp.experts.down_proj_bias", (_L + "feed_forward.experts.w2_bias",), None),
)
