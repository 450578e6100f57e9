"""Autocast's bf16 copies of the weights, alive at the peak (item ``autocast_copies``), bytes.

Without FSDP (zero=0: one GPU, DDP, tensor or pipeline parallelism without sharding), plait's runtime
and torchtitan keep fp32 weights and compute under ``torch.autocast(bf16)`` (``plait.run.step
.compute_context``). Each linear layer's forward casts its weight to bf16; autocast caches the copy for
the forward and the GEMM saves it for its backward, so when the backward starts every copy of the
GPU's linear layers - the blocks' and the LM head's (a tied head casts the embedding) - is alive:
2 bytes per parameter. The first GPU proof's eager sweep (bench/results/gpu_proof) ran 2.55 GB above
the prediction beyond its loss term; llama3.2-1b's linear layers make 2.47 GB of copies.

Blocks that keep none:
  * a compiled block (inductor's partitioner saves the fp32 weight it already holds and casts again in
    the backward);
  * a fully checkpointed block (its forward saves nothing, its recompute casts again: one layer's
    copies at a time, counted once).
  * a block under fp8 (torchao's ``Float8Linear`` casts its weight to fp8 itself; the LM head stays bf16).
Other checkpoint policies save what their policy keeps and keep the copies. With FSDP (zero >= 1)
the weights are gathered in bf16 (``MixedPrecisionPolicy``) and nothing is cast. Not counted:
experts and multi-head latent attention (their weights take other casts), the megatron runtimes (bf16
weights with fp32 masters in the optimizer), and a CPU (fp32, no autocast).
"""

from __future__ import annotations

from plait.plan.activations import BF16, checkpointed_layer_count
from plait.plan.compiled import compiled_share
from plait.plan.params import CostParams
from plait.spec.layout import Layout
from plait.spec.model import ModelSpec


def autocast_copy_bytes(model: ModelSpec, layout: Layout, params: CostParams, layers: int, is_last: bool,
                        element_bytes: float, runtime: str = "torch") -> float:
    """Bytes of autocast's bf16 weight copies alive at the peak on a GPU holding ``layers`` blocks (and
    the LM head when ``is_last``); module docstring."""
    if (runtime != "torch" or layout.zero > 0 or element_bytes != BF16 or model.moe is not None
            or model.mla is not None):
        return 0.0
    # under fp8 (torchao's Float8Linear) a block's GEMMs cast their weights to fp8 themselves: no bf16 copy
    per_layer = model.layer_matmul_params() / layout.tp if layout.precision == "bf16" else 0.0
    checkpointed = checkpointed_layer_count(model, layout, layers) if layout.ckpt == "full" else 0
    eager = 1.0 - compiled_share(params, model, layout)
    head = model.vocab * model.hidden / layout.tp if is_last else 0.0
    # when the backward starts: the head's copy and those of the blocks that kept theirs (the last
    # ones: checkpointing takes the first); later one recomputed block's, once those are gone
    return BF16 * max(head + eager * (layers - checkpointed) * per_layer, per_layer if checkpointed else 0.0)
