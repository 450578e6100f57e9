"""Which cross-entropy kernel a published row's recipe ran: a row fact read from its source
(``plait validate``). No torch.

Transformer Engine's ``parallel_cross_entropy`` (transformer_engine/pytorch/cross_entropy.py) computes
the loss and its gradient in fp32 inside one Triton kernel, writes the gradient over the bf16 logits
and keeps only them and per-token statistics: 2 bytes per logit at the peak (``TE_LOSS_BYTES``).
Megatron-Core runs it when ``cross_entropy_fusion_impl='te'``; its own default is the 'native' fused
kernel, which keeps fp32 exp-logits, so the ``megatron-core`` stack keeps the planner's generic loss.
The sources whose recipes set it (``TE_LOSS_SOURCES``):

- Megatron-Bridge's performance runs: ``cross_entropy_fusion_impl: "te"`` in the perf-matrix YAMLs of
  r0.1.0 (scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml, the 25.09 container) and
  ``_set_common_perf_overrides`` in scripts/performance/utils/overrides.py from v0.3.0 on;
- the Megatron-MoE-ModelZoo configs: ``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``.

NeMo 2's own pages (the long-sequence table of NeMo 25.04) name no loss kernel and keep the generic
one: there NeMo reports Llama 3 8B at 1M tokens without context parallelism out of memory "even with
full recompute", which plait predicts only with the generic loss's bytes (docs/planner.md).
"""

from __future__ import annotations

TE_LOSS_SOURCES = ("megatron-bridge", "megatron-moe-modelzoo")
TE_LOSS_BYTES = 2.0  # bytes per logit: the bf16 logits, overwritten by their gradient


def loss_params(row: dict, stack, notes: list[str]) -> dict:
    """{"loss_peak_bytes": 2.0} for a Megatron-Core row whose source's recipes run Transformer Engine's
    cross entropy (noted); {} otherwise (the stack's loss holds)."""
    source = (row.get("source") or "").lower()
    if stack.runtime != "megatron-core" or not any(word in source for word in TE_LOSS_SOURCES):
        return {}
    notes.append("loss: Transformer Engine's cross entropy (the source's recipes set cross_entropy_fusion_impl='te'), "
                 f"{TE_LOSS_BYTES:g} bytes per logit")
    return {"loss_peak_bytes": TE_LOSS_BYTES}
