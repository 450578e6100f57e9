"""The activation-checkpoint policies (``Layout.ckpt``) and the ``ckpt=POLICY[:LAYERS]`` syntax.

Policies, cheapest recomputation first (``plait.plan.activations`` and ``plait.run.memory.recompute``
say what each keeps and recomputes):
  none       nothing recomputed
  selective  the attention core (softmax(QKᵀ)V; Megatron's selective recomputation)
  balanced   the element-wise work (GEMM outputs kept; Kwai's "GEMM-last")
  mlp        the MLP/MoE half: its norm, GEMMs, activation and (MoE) dispatch and combine; the
             attention half keeps its tensors (Megatron-Core's ``--recompute-modules layernorm mlp``/``moe``)
  full       the whole layer (only its input kept)
"""

from __future__ import annotations

from plait.spec.layout_keys import as_int

CKPT_POLICIES = ("none", "selective", "balanced", "mlp", "full")
CKPT_DOC = ("activation checkpointing: `selective` (attention core), `balanced` (GEMM outputs kept), `mlp` "
            "(norm and MLP/MoE block recomputed, attention kept), `full`; `ckpt=full:4` checkpoints 4 layers "
            "per pipeline stage")


def parse_ckpt(raw: str) -> dict:
    """``"full:4"`` -> {"ckpt": "full", "ckpt_layers": 4}; ``"mlp"`` -> {"ckpt": "mlp"}."""
    policy, _, layers = raw.partition(":")
    out: dict = {"ckpt": policy}
    if layers:
        out["ckpt_layers"] = as_int("ckpt layers", layers)
    return out


def format_ckpt(layout) -> str | None:
    """The ``ckpt=`` item of a layout's text (None for ``ckpt=none`` on every layer)."""
    if layout.ckpt == "none" and not layout.ckpt_layers:
        return None
    return f"ckpt={layout.ckpt}" + (f":{layout.ckpt_layers}" if layout.ckpt_layers else "")
